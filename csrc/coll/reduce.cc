// Elementwise reduction kernels for the collectives (see reduce.h for the semantics).
// Pure computation; knows nothing of sockets, rails or JAX.
//
// What XLA CPU computes, measured with jax 0.10.2 on x86-64 (jax.lax.add/mul/min/max under
// jit, and psum/pmax/pmin over two CPU devices, which agree), and what this file reproduces:
//   * Subnormals are flushed for float32, float64 and bfloat16: XLA CPU runs its kernels with
//     MXCSR DAZ+FTZ set. A subnormal operand reads as a zero of its sign (1e-45f + 0 = 0,
//     min(1e-45f, 1) = 0), and a tiny result becomes a zero of its sign, "tiny" judged after
//     rounding as x86 does: a product whose exact value is 0.28 ulp below FLT_MIN gives
//     FLT_MIN, one that IEEE gradual underflow would round up to FLT_MIN from further below
//     gives 0. float16 is not affected (its subnormals are float32 normals).
//   * max/min propagate NaN (max(NaN, 1) = max(1, NaN) = NaN) and order signed zeros:
//     max(-0, +0) = max(+0, -0) = +0, min(-0, +0) = min(+0, -0) = -0 (IEEE 754-2019
//     maximum/minimum, i.e. llvm.maximum), unlike std::fmax (NaN-avoiding) and unlike
//     `a > b ? a : b` (order-dependent on zeros).
//   * float16/bfloat16 add/mul/max/min are "widen to float32, operate (with the flush above),
//     round to nearest even": bit-equal for every 16-bit pattern against 26 special operands
//     and millions of random pairs.
//   * Integer add/mul wrap modulo 2^bits (psum of int8 127 and 1 is -128).
//   * bool: lax.max/min (hence pmax/pmin) are OR/AND. lax.add/mul reject bool, and lax.psum on
//     bool promotes to int32 and counts the true values, so kSum over bool here (OR) is not
//     what jax.lax.psum returns; a caller that wants jax's count must promote first.
//   * NaN payloads and NaN signs are not matched (XLA's max/min neither quiet a signalling NaN
//     nor always keep the NaN operand's sign); results are NaN exactly when XLA's are.
//
// Bit-exactness. Each result is one IEEE operation on two (flushed) operands in the element
// type, or for float16/bfloat16 in float32 with one rounding back; there is no a*b+c for the
// compiler to contract into an FMA, so -ffp-contract=fast (GCC's default in gnu++ modes) and
// -mfma change nothing (test_reduce passes built that way). Clang is asked for no contraction
// anyway; -ffast-math and excess-precision evaluation (x87) are refused at compile time.
// Results assume round-to-nearest. Because subnormals never reach the FPU as operands and tiny
// results are flushed exactly as x86 would, the bits are the same whether or not the calling
// thread has FTZ/DAZ set. NaN results are fixed too (see left_nan), so the SSE2 and AVX2
// kernels agree bit for bit, NaNs included.
#include "coll/reduce.h"
#include "base/enum_names.h"

#include <atomic>
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
  static constexpr U kQuiet = 0x00400000u;
  static constexpr int kFracBits = 23;
  static constexpr int kBias = 127;
};
template <>
struct FloatBits<double> {
  using U = uint64_t;
  static constexpr U kSign = 0x8000000000000000ull;
  static constexpr U kExp = 0x7FF0000000000000ull;
  static constexpr U kFrac = 0x000FFFFFFFFFFFFFull;
  static constexpr U kQuiet = 0x0008000000000000ull;
  static constexpr int kFracBits = 52;
  static constexpr int kBias = 1023;
};

// Branch-free, with explicit masks: a ternary on a float comparison, or one that guards a float
// operation, may become a branch (GCC keeps possibly-trapping float operations out of
// if-conversion), and a branch stops the loop from vectorising.
template <class U>
inline U mask_if(bool c) {
  return static_cast<U>(U(0) - static_cast<U>(c));  // all ones or zero
}
template <class U>
inline U select(U mask, U a, U b) {
  return (a & mask) | (b & ~mask);
}

// ---- float16 / bfloat16 <-> float32 ------------------------------------------------------

// Checked exhaustively, all 2^16 halves and all 2^32 floats, against a straightforward
// bit-by-bit version, with and without DAZ/FTZ set.

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  const uint32_t exp = em & 0x7C00u;
  // Normal: rebias the exponent; inf/NaN (payload kept): rebias twice, to 255.
  uint32_t bits = (em << 13) + ((127u - 15u) << 23) + (mask_if<uint32_t>(exp == 0x7C00u) & ((127u - 15u) << 23));
  // Subnormal, mant * 2^-24: the exact int -> float conversion of mant (a float >= 1) with its
  // exponent lowered by 24. No float arithmetic on a subnormal, so DAZ cannot touch it.
  const uint32_t sub = bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(em))) - (24u << 23);
  bits = select(mask_if<uint32_t>(exp == 0), sub & mask_if<uint32_t>(em != 0), bits);
  return bit_cast<float>(bits | sign);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  // A normal half (2^-14 <= |f| < 65520): rebias, round to nearest even on the 13 dropped bits;
  // 65520 up to 65536 carries into the exponent and gives inf.
  const uint32_t norm = (ax - ((127u - 15u) << 23) + 0x0FFFu + ((ax >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5 puts the ulp at 2^-24, the half subnormal step, and the FPU rounds
  // to nearest even; the low bits of the sum are the half (1024 = the smallest normal). |f|
  // is a normal float or zero here, or a float subnormal that gives 0 either way, so DAZ
  // changes nothing.
  const uint32_t sub = bit_cast<uint32_t>(bit_cast<float>(ax) + 0.5f) - 0x3F000000u;
  uint32_t h = select(mask_if<uint32_t>(ax < 0x38800000u), sub, norm);
  h = select(mask_if<uint32_t>(ax >= 0x47800000u), 0x7C00u, h);  // >= 65536, inf
  h = select(mask_if<uint32_t>(ax > 0x7F800000u), 0x7E00u | ((ax >> 13) & 0x3FFu), h);  // NaN
  return static_cast<uint16_t>(h | sign);
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

// Set false for plain IEEE gradual underflow (XLA's GPU backend does not flush by default,
// --xla_gpu_ftz=false; not measured here).
constexpr bool kFlushDenormals = true;

// A subnormal becomes the zero of its sign; everything else is unchanged. The ops below take
// kFlush as a parameter: float16 runs them without it, since a float16 widened to float32 is
// never subnormal (|x| >= 2^-24), nor is a sum (a multiple of 2^-24) or a product (>= 2^-48)
// of two such, so the flush is the identity there and only costs time.
template <bool kFlush, class F>
inline F flush(F x) {
  using B = FloatBits<F>;
  using U = typename B::U;
  if constexpr (!kFlush) return x;
  const U u = bit_cast<U>(x);
  const bool sub = (u & B::kExp) == 0;  // zero exponent field: keep the sign only
  return bit_cast<F>(sub ? (u & B::kSign) : u);
}

// NaN bits. When both operands of an add or multiply are NaN, x86 returns the first source
// operand's NaN (quieted), but the compiler may swap the operands of a commutative operation,
// differently in the SSE2 and AVX2 kernels. So a NaN left operand is returned explicitly (as
// the hardware would for a + b): the result bits never depend on the code path. (A NaN right
// operand alone, quieted, is what the hardware gives either way.)
template <class F>
inline F left_nan(F a, F r) {
  using B = FloatBits<F>;
  using U = typename B::U;
  if constexpr (sizeof(F) == 4) {  // float32 (and the 16-bit types): a mask, see mask_if
    return bit_cast<F>(select(mask_if<U>(a != a), bit_cast<U>(a) | B::kQuiet, bit_cast<U>(r)));
  } else {  // float64: a ternary compiles better (cmov / blend)
    return (a != a) ? bit_cast<F>(bit_cast<U>(a) | B::kQuiet) : r;
  }
}

// A sum of two normal (or zero) floats is a multiple of the smallest subnormal, so when it is
// tiny it is exact: flushing the rounded sum when it is subnormal is flushing on the exact sum.
template <class F, bool kFlush>
struct FSum {
  static F apply(F a, F b) {
    a = flush<kFlush>(a);
    b = flush<kFlush>(b);
    return left_nan(a, flush<kFlush>(a + b));
  }
};

// A product's exact value can lie just below MIN and round (IEEE, gradually) to MIN. x86 keeps
// MIN when |exact| >= MIN (1 - 2^-(p+1)) and flushes below that (measured against XLA: exact
// products 0.28 ulp below MIN give MIN, gradual MIN from further below gives 0), so near MIN
// the exact product decides. float32: the product in double is exact; branch-free.
template <class F, bool kFlush>
struct FProd;
template <bool kFlush>
struct FProd<float, kFlush> {
  static float apply(float a, float b) {
    a = flush<kFlush>(a);
    b = flush<kFlush>(b);
    float r = a * b;
    if constexpr (kFlush) {
      const double p = static_cast<double>(a) * static_cast<double>(b);  // exact: 24 + 24 bits
      const double kTiny = static_cast<double>(FLT_MIN) * (1.0 - 0x1p-25);  // exact in double
      const bool tiny = p < kTiny && p > -kTiny;  // false for NaN
      const uint32_t u = bit_cast<uint32_t>(r);
      r = bit_cast<float>(tiny ? (u & 0x80000000u) : u);
    }
    return left_nan(a, r);
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
template <bool kFlush>
struct FProd<double, kFlush> {
  static double apply(double a, double b) {
    a = flush<kFlush>(a);
    b = flush<kFlush>(b);
    double r = a * b;
    if constexpr (kFlush) {
      const double m = r < 0 ? -r : r;
      if (__builtin_expect(m == DBL_MIN, 0) && exact_product_tiny(a, b)) {
        return bit_cast<double>(bit_cast<uint64_t>(r) & FloatBits<double>::kSign);
      }
      r = flush<kFlush>(r);
    }
    return left_nan(a, r);
  }
};

// max/min: IEEE 754-2019 maximum/minimum (after the operands' flush) with the left NaN
// winning, bits unchanged, written branch-free on the bit patterns so the float32 loops
// vectorise (maxps/minps plus masks). float64 takes a well-predicted branch when neither is
// NaN, cheaper in the scalar baseline kernel (SSE2 has no 64-bit integer compare); GCC still
// vectorises the AVX2 kernel:
//   m1 = a > b ? a : b  (b when equal or unordered),  m2 = b > a ? b : a  (a likewise)
//   ordered:   m1 & m2 is the larger value; for equal values it is their bits, and for
//              {-0, +0} it is +0 (min: m1 | m2 gives -0)
//   b NaN:     m1 is b, so m1 & (m2 | all-ones) = b
//   a NaN:     a, overriding the above
// The result is one of the (flushed) operands, so it needs no flush itself.
template <class F, bool kFlush>
struct FMax {
  static F apply(F a, F b) {
    using U = typename FloatBits<F>::U;
    a = flush<kFlush>(a);
    b = flush<kFlush>(b);
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
template <class F, bool kFlush>
struct FMin {
  static F apply(F a, F b) {
    using U = typename FloatBits<F>::U;
    a = flush<kFlush>(a);
    b = flush<kFlush>(b);
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
// (no runtime alias checks, no epilogues) vectorises it. restrict is sound because each
// variant only gets buffers that are disjoint or exactly the same (routed in run()); a buffer
// that is both read and written is reached through one pointer only.
//
// Each kernel is compiled twice on x86-64: for the baseline (SSE2) and for AVX2, picked at run
// time. The flush of subnormals costs a few vector instructions per element, which SSE2 cannot
// hide behind memory (float32 sum 12 GB/s vs 19 GB/s with AVX2 here). Both variants do the
// same IEEE operations on the same values (AVX2 does not bring FMA), so they agree bit for bit;
// test_reduce checks that. The kernels stay out of line: inlined into the big dispatch switch,
// GCC -O2 gave up vectorising some of them.

constexpr size_t kBlockBytes = 256;

template <class T, class Op>
inline void elem(unsigned char* out, const unsigned char* a, const unsigned char* b, size_t i) {
  T x, y;
  std::memcpy(&x, a + i * sizeof(T), sizeof(T));
  std::memcpy(&y, b + i * sizeof(T), sizeof(T));
  const T r = Op::apply(x, y);
  std::memcpy(out + i * sizeof(T), &r, sizeof(T));
}

enum class Alias { kNone, kOutIsA, kOutIsB, kAll };

// kNone: out = x op y, all disjoint. kOutIsA: out = out op y. kOutIsB: out = y op out (x unused).
template <class T, class Op, Alias kAlias>
__attribute__((always_inline)) inline void body(unsigned char* __restrict out, const unsigned char* __restrict x,
                                                const unsigned char* __restrict y, size_t n) {
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    unsigned char* o = out + i * sizeof(T);
    const unsigned char* v = y + i * sizeof(T);
    for (size_t j = 0; j < kBlock; ++j) {
      if constexpr (kAlias == Alias::kNone) {
        elem<T, Op>(o, x + i * sizeof(T), v, j);
      } else if constexpr (kAlias == Alias::kOutIsA) {
        elem<T, Op>(o, o, v, j);
      } else {
        elem<T, Op>(o, v, o, j);
      }
    }
  }
  for (; i < n; ++i) {
    if constexpr (kAlias == Alias::kNone) {
      elem<T, Op>(out, x, y, i);
    } else if constexpr (kAlias == Alias::kOutIsA) {
      elem<T, Op>(out, out, y, i);
    } else {
      elem<T, Op>(out, y, out, i);
    }
  }
}

template <class T, class Op, Alias kAlias>
__attribute__((noinline)) void kernel(unsigned char* __restrict out, const unsigned char* __restrict x,
                                      const unsigned char* __restrict y, size_t n) {
  body<T, Op, kAlias>(out, x, y, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define R2CCL_REDUCE_AVX2 1
template <class T, class Op, Alias kAlias>
__attribute__((noinline, target("avx2"))) void kernel_avx2(unsigned char* __restrict out,
                                                           const unsigned char* __restrict x,
                                                           const unsigned char* __restrict y, size_t n) {
  body<T, Op, kAlias>(out, x, y, n);
}
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// Tests force the baseline kernels to compare them with the AVX2 ones (see below).
std::atomic<bool> g_force_baseline{false};

template <class T, class Op, Alias kAlias>
void dispatch_isa(unsigned char* out, const unsigned char* x, const unsigned char* y, size_t n) {
#ifdef R2CCL_REDUCE_AVX2
  if (!g_force_baseline.load(std::memory_order_relaxed) && cpu_has_avx2()) return kernel_avx2<T, Op, kAlias>(out, x, y, n);
#endif
  kernel<T, Op, kAlias>(out, x, y, n);
}

template <class T, class Op>
void run(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<unsigned char*>(out);
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  if (o == x && o == y) {
    // out = out op out: one pointer for everything, no restrict; rare, so scalar is fine.
    for (size_t i = 0; i < n; ++i) elem<T, Op>(o, o, o, i);
  } else if (o == x) {
    dispatch_isa<T, Op, Alias::kOutIsA>(o, nullptr, y, n);
  } else if (o == y) {
    dispatch_isa<T, Op, Alias::kOutIsB>(o, nullptr, x, n);
  } else {
    dispatch_isa<T, Op, Alias::kNone>(o, x, y, n);  // a == b is fine: two read-only views
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

template <class F, bool kFlush>
void dispatch_float(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum: return run<F, FSum<F, kFlush>>(out, a, b, n);
    case ReduceOp::kProd: return run<F, FProd<F, kFlush>>(out, a, b, n);
    case ReduceOp::kMin: return run<F, FMin<F, kFlush>>(out, a, b, n);
    case ReduceOp::kMax: return run<F, FMax<F, kFlush>>(out, a, b, n);
  }
}

template <template <class> class Wrap, bool kFlush>
void dispatch_half(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum: return run<uint16_t, Wrap<FSum<float, kFlush>>>(out, a, b, n);
    case ReduceOp::kProd: return run<uint16_t, Wrap<FProd<float, kFlush>>>(out, a, b, n);
    case ReduceOp::kMin: return run<uint16_t, Wrap<FMin<float, kFlush>>>(out, a, b, n);
    case ReduceOp::kMax: return run<uint16_t, Wrap<FMax<float, kFlush>>>(out, a, b, n);
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

// Element sizes in DType order (the names are kDTypeNames in reduce.h).
constexpr size_t kDTypeSizes[] = {4, 8, 2, 2, 1, 1, 4, 4, 8, 8, 1};
static_assert(std::size(kDTypeSizes) == std::size(kDTypeNames), "a DType without a size");

inline bool valid(DType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && static_cast<size_t>(i) < std::size(kDTypeSizes);
}

}  // namespace

size_t dtype_size(DType t) { return valid(t) ? kDTypeSizes[static_cast<int>(t)] : 0; }

const char* dtype_name(DType t) { return valid(t) ? kDTypeNames[static_cast<int>(t)] : "unknown"; }

const char* reduce_op_name(ReduceOp op) { return enum_name(kReduceOpNames, op, "unknown"); }

bool parse_dtype(const std::string& name, DType* out) { return parse_enum(kDTypeNames, name, out); }

bool parse_reduce_op(const std::string& name, ReduceOp* out) { return parse_enum(kReduceOpNames, name, out); }

void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  switch (t) {
    case DType::kF32: return dispatch_float<float, kFlushDenormals>(op, out, a, b, count);
    case DType::kF64: return dispatch_float<double, kFlushDenormals>(op, out, a, b, count);
    case DType::kF16: return dispatch_half<F16, false>(op, out, a, b, count);  // see flush()
    case DType::kBF16: return dispatch_half<BF16, kFlushDenormals>(op, out, a, b, count);
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

// Not in reduce.h: for tests only (declared there). Forces the baseline kernels even where
// AVX2 is available; returns whether an AVX2 variant exists and is in use otherwise.
bool reduce_force_baseline_for_testing(bool force) {
  g_force_baseline.store(force, std::memory_order_relaxed);
#ifdef R2CCL_REDUCE_AVX2
  return cpu_has_avx2();
#else
  return false;
#endif
}

}  // namespace r2ccl::coll
