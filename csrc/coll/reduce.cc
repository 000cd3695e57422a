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
#include "coll/reduce_ops.h"
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
using namespace ops;   // the element operations (reduce_ops.h), shared with the CUDA kernels

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

// The loop of one (storage type, operation), picked through ops::dispatch.
struct Runner {
  void* out;
  const void* a;
  const void* b;
  size_t n;
  template <class T, class Op>
  void run() {
    coll::run<T, Op>(out, a, b, n);
  }
};

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
  Runner r{out, a, b, count};
  ops::dispatch(t, op, r);
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
