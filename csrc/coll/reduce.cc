// Elementwise reduction kernels for the collectives (see reduce.h for the semantics).
// Pure computation; knows nothing of sockets, rails or JAX.
//
// Bit-exactness. Every result element is one IEEE operation on two operands (float16 and
// bfloat16: exact widening, one float32 operation, one rounding), so there is no a*b+c for
// the compiler to contract into an FMA and the result is the same at any -O level and with
// or without -ffp-contract=fast (GCC's default in gnu++ modes). We still ask for no
// contraction where the compiler honours the pragma (clang), and refuse to build under
// -ffast-math or with excess-precision float evaluation (x87). The kernels assume the
// default floating-point environment (round-to-nearest, no FTZ/DAZ in MXCSR / FPCR).
//
// What XLA CPU does (measured with jax 0.10.2 on x86-64, jax.lax.max/min/add/mul under jit,
// float16/bfloat16/float32/float64; this file matches it):
//   * max/min propagate NaN: max(NaN, 1) = max(1, NaN) = NaN. When both are NaN the left
//     operand's NaN comes back, quieted (the same holds for add/mul on x86, by hardware).
//   * Signed zeros are ordered: max(-0, +0) = max(+0, -0) = +0, min(-0, +0) = min(+0, -0) = -0
//     (IEEE 754-2019 maximum/minimum, LLVM's llvm.maximum/llvm.minimum), unlike std::fmax
//     (NaN-avoiding) and unlike `a > b ? a : b` (order-dependent on zeros).
//   * float16/bfloat16 add/mul/max/min equal "widen to float32, operate, round to nearest
//     even" for every tested pair, subnormals included (no flush to zero).
//   * Integer add/mul wrap modulo 2^bits (psum on int8 127 + 1 = -128).
//   * bool: lax.max/min (hence pmax/pmin) are OR/AND. lax.add/mul reject bool, and
//     lax.psum on bool promotes to int32 and counts the true values, so a bool kSum here (OR)
//     is not what jax.lax.psum returns; the caller must promote bool sums itself if it wants
//     jax's count.
#include "coll/reduce.h"

#include <cfloat>
#include <cstring>
#include <type_traits>

#if defined(__FAST_MATH__)
#error "reduce.cc must not be built with -ffast-math: collective results must be bit-exact"
#endif
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "reduce.cc needs float/double evaluated in their own precision (FLT_EVAL_METHOD == 0)"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace r2ccl::coll {
namespace {

// ---- bit helpers -------------------------------------------------------------------------

template <class To, class From>
inline To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

template <class F>
struct FloatBits;
template <>
struct FloatBits<float> {
  using U = uint32_t;
  static constexpr U kSign = 0x80000000u;
  static constexpr U kExp = 0x7F800000u;
  static constexpr U kFrac = 0x007FFFFFu;
  static constexpr int kFracBits = 23;
  static constexpr int kBias = 127;
};
template <>
struct FloatBits<double> {
  using U = uint64_t;
  static constexpr U kSign = 0x8000000000000000ull;
  static constexpr U kExp = 0x7FF0000000000000ull;
  static constexpr U kFrac = 0x000FFFFFFFFFFFFFull;
  static constexpr int kFracBits = 52;
  static constexpr int kBias = 1023;
};

// ---- float16 / bfloat16 <-> float32 ------------------------------------------------------

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN with its payload
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: mant * 2^-24. Normalise so the leading 1 lands on bit 10.
    uint32_t e = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
  }
  return bit_cast<float>(bits);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) {  // NaN: quiet it, keep the top of the payload
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  }
  if (ax >= 0x477FF000u) {  // >= 65520 (halfway past 65504, the largest half) or inf: inf
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (ax >= 0x38800000u) {  // >= 2^-14: a normal half
    uint32_t r = ax - ((127u - 15u) << 23);
    r += 0x0FFFu + ((r >> 13) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) {  // <= 2^-25 (half of the smallest subnormal): rounds to +-0
    return static_cast<uint16_t>(sign);
  }
  // A half subnormal: value / 2^-24 = mant * 2^(e - 150 + 24), shift in [14, 24].
  const uint32_t e = ax >> 23;
  const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: fine
  return static_cast<uint16_t>(sign | r);
}

inline float bf16_to_f32(uint16_t h) { return bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);  // nearest even; overflows to inf
}

// ---- per-element operations --------------------------------------------------------------

// Floats, with XLA CPU's flush of subnormals (see the top of the file): operands are read
// with subnormals as zero (DAZ), and a tiny result becomes the zero of its sign (FTZ). "Tiny"
// is x86's rule, tininess after rounding: the exact result, rounded to the type's precision
// with an unbounded exponent, is below the smallest normal MIN in magnitude; equivalently
// |exact| < MIN * (1 - 2^-(p+1)) for p significand bits (24 or 53).

// Set false to get plain IEEE gradual underflow instead (what XLA on GPU computes by default).
constexpr bool kFlushDenormals = true;

// A subnormal becomes the zero of its sign; everything else is unchanged.
template <class F>
inline F flush(F x) {
  using B = FloatBits<F>;
  using U = typename B::U;
  if constexpr (!kFlushDenormals) return x;
  const U u = bit_cast<U>(x);
  const U sub = ((u & B::kExp) == 0) ? ~B::kSign : U(0);  // zero exponent: clear all but the sign
  return bit_cast<F>(u & ~sub);
}

// A sum of two normal (or zero) floats is a multiple of the smallest subnormal, so when it is
// tiny it is exact: flushing the rounded sum when it is subnormal is flushing on the exact sum.
template <class F>
struct FSum {
  static F apply(F a, F b) { return flush(flush(a) + flush(b)); }
};

// A product's exact value can lie just below MIN and round (IEEE, gradually) to MIN. x86 keeps
// MIN when |exact| >= MIN (1 - 2^-(p+1)) and flushes below that (measured against XLA: exact
// products 0.28 ulp below MIN give MIN, gradual MIN from further below gives 0), so near MIN
// the exact product decides. float32: the product in double is exact; branch-free.
template <class F>
struct FProd;
template <>
struct FProd<float> {
  static float apply(float a, float b) {
    a = flush(a);
    b = flush(b);
    const float r = a * b;
    if constexpr (!kFlushDenormals) return r;
    const double p = static_cast<double>(a) * static_cast<double>(b);  // exact: 24 + 24 bits
    const double kTiny = static_cast<double>(FLT_MIN) * (1.0 - 0x1p-25);  // exact in double
    const bool tiny = p < kTiny && p > -kTiny;  // false for NaN
    const uint32_t u = bit_cast<uint32_t>(r);
    return bit_cast<float>(tiny ? (u & 0x80000000u) : u);
  }
};
// float64: a subnormal result is tiny by either rule; a result of exactly +-DBL_MIN (rare) is
// decided on the exact product of the 53-bit significands.
inline bool exact_product_tiny(double a, double b) {
  using B = FloatBits<double>;
  const uint64_t ua = bit_cast<uint64_t>(a), ub = bit_cast<uint64_t>(b);
  // Both are normal here (a zero, inf or NaN operand cannot give +-DBL_MIN).
  const uint64_t ma = (ua & B::kFrac) | (B::kFrac + 1), mb = (ub & B::kFrac) | (B::kFrac + 1);
  const int ea = static_cast<int>((ua & B::kExp) >> B::kFracBits) - B::kBias - B::kFracBits;
  const int eb = static_cast<int>((ub & B::kExp) >> B::kFracBits) - B::kBias - B::kFracBits;
  // |a b| = ma mb 2^(ea+eb) < DBL_MIN (1 - 2^-54) = (2^54 - 1) 2^-1076  <=>  ma mb < (2^54 - 1) 2^j
  const int j = -1076 - ea - eb;
  if (j < 0) return false;  // ma mb >= 2^104 > the bound
  if (j > 73) return true;  // ma mb < 2^106 <= the bound
  __extension__ using u128 = unsigned __int128;
  return static_cast<u128>(ma) * mb < (((static_cast<u128>(1) << 54) - 1) << j);
}
template <>
struct FProd<double> {
  static double apply(double a, double b) {
    a = flush(a);
    b = flush(b);
    const double r = a * b;
    if constexpr (!kFlushDenormals) return r;
    const double m = r < 0 ? -r : r;
    if (__builtin_expect(m == DBL_MIN, 0) && exact_product_tiny(a, b)) {
      return bit_cast<double>(bit_cast<uint64_t>(r) & FloatBits<double>::kSign);
    }
    return flush(r);
  }
};

// max/min: IEEE 754-2019 maximum/minimum (after the operands' flush) with the left NaN
// winning, bits unchanged, written branch-free on the bit patterns so the float32 loops
// vectorise (maxps/minps plus masks; float64 stays scalar on baseline x86-64, which lacks
// 64-bit vector compares):
//   m1 = a > b ? a : b  (b when equal or unordered),  m2 = b > a ? b : a  (a likewise)
//   ordered:   m1 & m2 is the larger value; for equal values it is their bits, and for
//              {-0, +0} it is +0 (min: m1 | m2 gives -0)
//   b NaN:     m1 is b, so m1 & (m2 | all-ones) = b
//   a NaN:     a, overriding the above
// The result is one of the (flushed) operands, so it needs no flush itself.
template <class F>
struct FMax {
  static F apply(F a, F b) {
    using U = typename FloatBits<F>::U;
    a = flush(a);
    b = flush(b);
    const U m1 = bit_cast<U>((a > b) ? a : b);
    const U m2 = bit_cast<U>((b > a) ? b : a);
    if constexpr (sizeof(F) == 8) {  // scalar: NaN is rare, so a predictable branch is cheaper
      if (__builtin_expect(a == a && b == b, 1)) return bit_cast<F>(m1 & m2);
    }
    const U na = (a != a) ? ~U(0) : U(0);
    const U nb = (b != b) ? ~U(0) : U(0);
    const U r = m1 & (m2 | nb);
    return bit_cast<F>((r & ~na) | (bit_cast<U>(a) & na));
  }
};
template <class F>
struct FMin {
  static F apply(F a, F b) {
    using U = typename FloatBits<F>::U;
    a = flush(a);
    b = flush(b);
    const U m1 = bit_cast<U>((a < b) ? a : b);
    const U m2 = bit_cast<U>((b < a) ? b : a);
    if constexpr (sizeof(F) == 8) {
      if (__builtin_expect(a == a && b == b, 1)) return bit_cast<F>(m1 | m2);
    }
    const U na = (a != a) ? ~U(0) : U(0);
    const U nb = (b != b) ? ~U(0) : U(0);
    const U r = m1 | (m2 & ~nb);
    return bit_cast<F>((r & ~na) | (bit_cast<U>(a) & na));
  }
};

// Integers: sum/prod in the unsigned type of the same width (wraps, no signed-overflow UB).
// For 8-bit types the operands promote to int; 255 * 255 fits, and the conversion back keeps
// the low bits.
template <class T>
struct ISum {
  using U = std::make_unsigned_t<T>;
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b))); }
};
template <class T>
struct IProd {
  using U = std::make_unsigned_t<T>;
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b))); }
};
template <class T>
struct IMax {
  static T apply(T a, T b) { return a < b ? b : a; }
};
template <class T>
struct IMin {
  static T apply(T a, T b) { return b < a ? b : a; }
};

// bool as bytes: nonzero is true; the result is 0 or 1.
struct BOr {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) | (b != 0)); }
};
struct BAnd {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};

// 16-bit floats through float32.
template <class FOp, float (*kToF32)(uint16_t), uint16_t (*kFromF32)(float)>
struct Half {
  static uint16_t apply(uint16_t a, uint16_t b) { return kFromF32(FOp::apply(kToF32(a), kToF32(b))); }
};
template <class FOp>
using F16 = Half<FOp, f16_to_f32, f32_to_f16>;
template <class FOp>
using BF16 = Half<FOp, bf16_to_f32, f32_to_bf16>;

// ---- loops -------------------------------------------------------------------------------
//
// Buffers arrive as void* and may be misaligned for T (e.g. at an odd offset in a receive
// buffer), so elements are moved with memcpy, which compiles to plain (vector) loads and
// stores. The body runs over fixed-size blocks so even GCC's -O2 "very cheap" vectoriser
// (no runtime alias checks, no epilogues) vectorises it; restrict is sound because each
// loop is only used on exactly disjoint buffers (the aliasing cases are routed below).
// The loops are kept out of line: inlined into the big dispatch switch, GCC -O2 gave up
// vectorising some of them (float32 min/max ran 2.5x slower).

constexpr size_t kBlockBytes = 256;

template <class T, class Op>
inline void elem(unsigned char* out, const unsigned char* a, const unsigned char* b, size_t i) {
  T x, y;
  std::memcpy(&x, a + i * sizeof(T), sizeof(T));
  std::memcpy(&y, b + i * sizeof(T), sizeof(T));
  const T r = Op::apply(x, y);
  std::memcpy(out + i * sizeof(T), &r, sizeof(T));
}

// out = a op b, all three disjoint.
template <class T, class Op>
__attribute__((noinline)) void loop3(unsigned char* __restrict out, const unsigned char* __restrict a,
           const unsigned char* __restrict b, size_t n) {
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    unsigned char* __restrict o = out + i * sizeof(T);
    const unsigned char* __restrict x = a + i * sizeof(T);
    const unsigned char* __restrict y = b + i * sizeof(T);
    for (size_t j = 0; j < kBlock; ++j) elem<T, Op>(o, x, y, j);
  }
  for (; i < n; ++i) elem<T, Op>(out, a, b, i);
}

// acc = acc op src (kLeft) or acc = src op acc (!kLeft), acc and src disjoint.
template <class T, class Op, bool kLeft>
__attribute__((noinline)) void loop2(unsigned char* __restrict acc, const unsigned char* __restrict src, size_t n) {
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    unsigned char* __restrict o = acc + i * sizeof(T);
    const unsigned char* __restrict y = src + i * sizeof(T);
    for (size_t j = 0; j < kBlock; ++j) {
      if (kLeft) {
        elem<T, Op>(o, o, y, j);
      } else {
        elem<T, Op>(o, y, o, j);
      }
    }
  }
  for (; i < n; ++i) {
    if (kLeft) {
      elem<T, Op>(acc, acc, src, i);
    } else {
      elem<T, Op>(acc, src, acc, i);
    }
  }
}

// acc = acc op acc (every pointer the same buffer).
template <class T, class Op>
void loop1(unsigned char* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) elem<T, Op>(acc, acc, acc, i);
}

template <class T, class Op>
void run(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<unsigned char*>(out);
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  if (n == 0) return;
  if (o == x && o == y) {
    loop1<T, Op>(o, n);
  } else if (o == x) {
    loop2<T, Op, true>(o, y, n);
  } else if (o == y) {
    loop2<T, Op, false>(o, x, n);
  } else {
    loop3<T, Op>(o, x, y, n);  // a == b is fine: restrict on two read-only views of one buffer
  }
}

template <class T, template <class> class Sum, template <class> class Prod, template <class> class Min,
          template <class> class Max>
void dispatch_op(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum: return run<T, Sum<T>>(out, a, b, n);
    case ReduceOp::kProd: return run<T, Prod<T>>(out, a, b, n);
    case ReduceOp::kMin: return run<T, Min<T>>(out, a, b, n);
    case ReduceOp::kMax: return run<T, Max<T>>(out, a, b, n);
  }
}

template <template <class> class Wrap>
void dispatch_half(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum: return run<uint16_t, Wrap<FSum<float>>>(out, a, b, n);
    case ReduceOp::kProd: return run<uint16_t, Wrap<FProd<float>>>(out, a, b, n);
    case ReduceOp::kMin: return run<uint16_t, Wrap<FMin<float>>>(out, a, b, n);
    case ReduceOp::kMax: return run<uint16_t, Wrap<FMax<float>>>(out, a, b, n);
  }
}

void dispatch_bool(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax: return run<uint8_t, BOr>(out, a, b, n);
    case ReduceOp::kProd:
    case ReduceOp::kMin: return run<uint8_t, BAnd>(out, a, b, n);
  }
}

struct DTypeInfo {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "float32", 4}, {DType::kF64, "float64", 8}, {DType::kF16, "float16", 2},
    {DType::kBF16, "bfloat16", 2}, {DType::kI8, "int8", 1},     {DType::kU8, "uint8", 1},
    {DType::kI32, "int32", 4},   {DType::kU32, "uint32", 4},   {DType::kI64, "int64", 8},
    {DType::kU64, "uint64", 8},  {DType::kBool, "bool", 1},
};
constexpr size_t kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);

inline bool valid(DType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && static_cast<size_t>(i) < kNumDTypes;
}

}  // namespace

size_t dtype_size(DType t) { return valid(t) ? kDTypes[static_cast<int>(t)].size : 0; }

const char* dtype_name(DType t) { return valid(t) ? kDTypes[static_cast<int>(t)].name : "unknown"; }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

bool parse_dtype(const std::string& name, DType* out) {
  for (const auto& d : kDTypes) {
    if (name == d.name) {
      if (out) *out = d.t;
      return true;
    }
  }
  return false;
}

void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  switch (t) {
    case DType::kF32: return dispatch_op<float, FSum, FProd, FMin, FMax>(op, out, a, b, count);
    case DType::kF64: return dispatch_op<double, FSum, FProd, FMin, FMax>(op, out, a, b, count);
    case DType::kF16: return dispatch_half<F16>(op, out, a, b, count);
    case DType::kBF16: return dispatch_half<BF16>(op, out, a, b, count);
    case DType::kI8: return dispatch_op<int8_t, ISum, IProd, IMin, IMax>(op, out, a, b, count);
    case DType::kU8: return dispatch_op<uint8_t, ISum, IProd, IMin, IMax>(op, out, a, b, count);
    case DType::kI32: return dispatch_op<int32_t, ISum, IProd, IMin, IMax>(op, out, a, b, count);
    case DType::kU32: return dispatch_op<uint32_t, ISum, IProd, IMin, IMax>(op, out, a, b, count);
    case DType::kI64: return dispatch_op<int64_t, ISum, IProd, IMin, IMax>(op, out, a, b, count);
    case DType::kU64: return dispatch_op<uint64_t, ISum, IProd, IMin, IMax>(op, out, a, b, count);
    case DType::kBool: return dispatch_bool(op, out, a, b, count);
  }
}

void reduce_into(DType t, ReduceOp op, void* acc, const void* src, size_t count) {
  reduce(t, op, acc, acc, src, count);
}

}  // namespace r2ccl::coll
