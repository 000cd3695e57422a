// The element operations of the reductions: one IEEE operation on two operands per dtype and
// op, with XLA CPU's subnormal flushing and NaN/zero ordering reproduced in integer logic
// (see reduce.cc for the measured semantics). Written once for both the host kernels
// (reduce.cc) and the CUDA kernels (csrc/cuda/kernels.cu): under nvcc every function is
// __host__ __device__, so a GPU computes the same bits as the CPU. Pure computation.
#pragma once
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "coll/reduce.h"

#if defined(__CUDACC__)
#define R2CCL_HD __host__ __device__
#else
#define R2CCL_HD
#endif

namespace r2ccl::coll::ops {


// ---- bit helpers -------------------------------------------------------------------------

template <class To, class From>
R2CCL_HD inline To bit_cast(From v) {
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
R2CCL_HD inline U mask_if(bool c) {
  return static_cast<U>(U(0) - static_cast<U>(c));  // all ones or zero
}
template <class U>
R2CCL_HD inline U select(U mask, U a, U b) {
  return (a & mask) | (b & ~mask);
}

// ---- float16 / bfloat16 <-> float32 ------------------------------------------------------

// Checked exhaustively, all 2^16 halves and all 2^32 floats, against a straightforward
// bit-by-bit version, with and without DAZ/FTZ set.

R2CCL_HD inline float f16_to_f32(uint16_t h) {
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

R2CCL_HD inline uint16_t f32_to_f16(float f) {
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

R2CCL_HD inline float bf16_to_f32(uint16_t h) { return bit_cast<float>(static_cast<uint32_t>(h) << 16); }

R2CCL_HD inline uint16_t f32_to_bf16(float f) {
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
R2CCL_HD inline F flush(F x) {
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
R2CCL_HD inline F left_nan(F a, F r) {
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
  R2CCL_HD static F apply(F a, F b) {
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
  R2CCL_HD static float apply(float a, float b) {
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
R2CCL_HD inline bool exact_product_tiny(double a, double b) {
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
  R2CCL_HD static double apply(double a, double b) {
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
  R2CCL_HD static F apply(F a, F b) {
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
  R2CCL_HD static F apply(F a, F b) {
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
  R2CCL_HD static T apply(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b))); }
};
template <class T>
struct IProd {
  using U = std::make_unsigned_t<T>;
  R2CCL_HD static T apply(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b))); }
};
template <class T>
struct IMax {
  R2CCL_HD static T apply(T a, T b) { return a < b ? b : a; }
};
template <class T>
struct IMin {
  R2CCL_HD static T apply(T a, T b) { return b < a ? b : a; }
};

// bool as bytes: nonzero is true; the result is 0 or 1.
struct BOr {
  R2CCL_HD static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) | (b != 0)); }
};
struct BAnd {
  R2CCL_HD static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};

// 16-bit floats through float32.
// (Conversions as types, not function pointers: device code cannot take a host function's address.)
struct F16Conv {
  R2CCL_HD static float to_f32(uint16_t h) { return f16_to_f32(h); }
  R2CCL_HD static uint16_t from_f32(float f) { return f32_to_f16(f); }
};
struct BF16Conv {
  R2CCL_HD static float to_f32(uint16_t h) { return bf16_to_f32(h); }
  R2CCL_HD static uint16_t from_f32(float f) { return f32_to_bf16(f); }
};
template <class FOp, class Conv>
struct Half {
  R2CCL_HD static uint16_t apply(uint16_t a, uint16_t b) {
    return Conv::from_f32(FOp::apply(Conv::to_f32(a), Conv::to_f32(b)));
  }
};
template <class FOp>
using F16 = Half<FOp, F16Conv>;
template <class FOp>
using BF16 = Half<FOp, BF16Conv>;

// ---- which element operation a (dtype, op) uses: the one table --------------------------
//
// Calls fn.template run<T, Op>() with the storage type and element operation of (t, op);
// false when either is outside the enums. Both the host kernels and the CUDA kernels
// instantiate their loops through it, so the two cannot disagree about an operation.
template <class T, template <class> class Sum, template <class> class Prod, template <class> class Min,
          template <class> class Max, class Fn>
inline bool dispatch_int(ReduceOp op, Fn& fn) {
  switch (op) {
    case ReduceOp::kSum: fn.template run<T, Sum<T>>(); return true;
    case ReduceOp::kProd: fn.template run<T, Prod<T>>(); return true;
    case ReduceOp::kMin: fn.template run<T, Min<T>>(); return true;
    case ReduceOp::kMax: fn.template run<T, Max<T>>(); return true;
  }
  return false;
}

template <class F, bool kFlush, class Fn>
inline bool dispatch_float(ReduceOp op, Fn& fn) {
  switch (op) {
    case ReduceOp::kSum: fn.template run<F, FSum<F, kFlush>>(); return true;
    case ReduceOp::kProd: fn.template run<F, FProd<F, kFlush>>(); return true;
    case ReduceOp::kMin: fn.template run<F, FMin<F, kFlush>>(); return true;
    case ReduceOp::kMax: fn.template run<F, FMax<F, kFlush>>(); return true;
  }
  return false;
}

template <template <class> class Wrap, bool kFlush, class Fn>
inline bool dispatch_half(ReduceOp op, Fn& fn) {
  switch (op) {
    case ReduceOp::kSum: fn.template run<uint16_t, Wrap<FSum<float, kFlush>>>(); return true;
    case ReduceOp::kProd: fn.template run<uint16_t, Wrap<FProd<float, kFlush>>>(); return true;
    case ReduceOp::kMin: fn.template run<uint16_t, Wrap<FMin<float, kFlush>>>(); return true;
    case ReduceOp::kMax: fn.template run<uint16_t, Wrap<FMax<float, kFlush>>>(); return true;
  }
  return false;
}

template <class Fn>
inline bool dispatch(DType t, ReduceOp op, Fn& fn) {
  switch (t) {
    case DType::kF32: return dispatch_float<float, kFlushDenormals>(op, fn);
    case DType::kF64: return dispatch_float<double, kFlushDenormals>(op, fn);
    case DType::kF16: return dispatch_half<F16, false>(op, fn);  // see flush()
    case DType::kBF16: return dispatch_half<BF16, kFlushDenormals>(op, fn);
    case DType::kI8: return dispatch_int<int8_t, ISum, IProd, IMin, IMax>(op, fn);
    case DType::kU8: return dispatch_int<uint8_t, ISum, IProd, IMin, IMax>(op, fn);
    case DType::kI32: return dispatch_int<int32_t, ISum, IProd, IMin, IMax>(op, fn);
    case DType::kU32: return dispatch_int<uint32_t, ISum, IProd, IMin, IMax>(op, fn);
    case DType::kI64: return dispatch_int<int64_t, ISum, IProd, IMin, IMax>(op, fn);
    case DType::kU64: return dispatch_int<uint64_t, ISum, IProd, IMin, IMax>(op, fn);
    case DType::kBool:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMax: fn.template run<uint8_t, BOr>(); return true;
        case ReduceOp::kProd:
        case ReduceOp::kMin: fn.template run<uint8_t, BAnd>(); return true;
      }
      return false;
  }
  return false;
}

}  // namespace r2ccl::coll::ops
