// Known-answer and consistency tests for csrc/coll/reduce.{h,cc}.
// Standalone: exits non-zero and names each failing check.
//
// kKnown below holds XLA CPU's answers (jax 0.10.2, jax.lax.add/mul/min/max under jit, with
// jax_enable_x64) for edge operands of every dtype: signed zeros, NaN, +-inf, overflow,
// integer wraparound, subnormals (which XLA CPU flushes for float32/float64/bfloat16 but not
// float16), rounding ties, and products just below the smallest normal. A NaN answer matches
// any NaN (payloads are not part of the contract with jax). bool is not in the table: jax has
// no add/mul on bool (psum promotes it to int32), and its max/min are OR/AND, checked below.
#include "coll/reduce.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "check.h"

namespace r2ccl::coll {
bool reduce_force_baseline_for_testing(bool force);  // reduce.cc, not in the header
}

using namespace r2ccl::coll;

namespace {

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t rnd() {  // splitmix64: deterministic, so failures reproduce
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8, DType::kU8,
                           DType::kI32, DType::kU32, DType::kI64, DType::kU64, DType::kBool};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};

// Element i of a buffer as its bit pattern, and back.
uint64_t get(DType t, const std::vector<uint8_t>& buf, size_t i, size_t offset = 0) {
  uint64_t v = 0;
  std::memcpy(&v, buf.data() + offset + i * dtype_size(t), dtype_size(t));  // little-endian host
  return v;
}
void put(DType t, std::vector<uint8_t>& buf, size_t i, uint64_t v, size_t offset = 0) {
  std::memcpy(buf.data() + offset + i * dtype_size(t), &v, dtype_size(t));
}

bool is_nan(DType t, uint64_t v) {
  switch (t) {
    case DType::kF32: return (v & 0x7F800000u) == 0x7F800000u && (v & 0x007FFFFFu) != 0;
    case DType::kF64:
      return (v & 0x7FF0000000000000ull) == 0x7FF0000000000000ull && (v & 0x000FFFFFFFFFFFFFull) != 0;
    case DType::kF16: return (v & 0x7C00u) == 0x7C00u && (v & 0x03FFu) != 0;
    case DType::kBF16: return (v & 0x7F80u) == 0x7F80u && (v & 0x007Fu) != 0;
    default: return false;
  }
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::string label(DType t, ReduceOp op) { return std::string(dtype_name(t)) + " " + reduce_op_name(op); }

std::string label(DType t, ReduceOp op, uint64_t a, uint64_t b) {
  return label(t, op) + "(" + hex(a) + ", " + hex(b) + ")";
}

struct Known {
  DType t;
  ReduceOp op;
  uint64_t a, b, want;
};

// clang-format off
const Known kKnown[] = {
// Generated from jax 0.10.2 (XLA CPU, jax.lax.add/mul/min/max under jit, x64 enabled).
    {DType::kF32, ReduceOp::kSum, 0x3f800000, 0x40000000, 0x40400000},  // sum(1.0, 2.0) = 3.0
    {DType::kF32, ReduceOp::kProd, 0x3f800000, 0x40000000, 0x40000000},  // prod(1.0, 2.0) = 2.0
    {DType::kF32, ReduceOp::kMin, 0x3f800000, 0x40000000, 0x3f800000},  // min(1.0, 2.0) = 1.0
    {DType::kF32, ReduceOp::kMax, 0x3f800000, 0x40000000, 0x40000000},  // max(1.0, 2.0) = 2.0
    {DType::kF32, ReduceOp::kSum, 0xbfc00000, 0x3e800000, 0xbfa00000},  // sum(-1.5, 0.25) = -1.25
    {DType::kF32, ReduceOp::kProd, 0xbfc00000, 0x3e800000, 0xbec00000},  // prod(-1.5, 0.25) = -0.375
    {DType::kF32, ReduceOp::kMin, 0xbfc00000, 0x3e800000, 0xbfc00000},  // min(-1.5, 0.25) = -1.5
    {DType::kF32, ReduceOp::kMax, 0xbfc00000, 0x3e800000, 0x3e800000},  // max(-1.5, 0.25) = 0.25
    {DType::kF32, ReduceOp::kSum, 0x80000000, 0x00000000, 0x00000000},  // sum(-0, 0) = 0  IEEE 754-2019 maximum/minimum on signed zeros
    {DType::kF32, ReduceOp::kProd, 0x80000000, 0x00000000, 0x80000000},  // prod(-0, 0) = -0
    {DType::kF32, ReduceOp::kMin, 0x80000000, 0x00000000, 0x80000000},  // min(-0, 0) = -0
    {DType::kF32, ReduceOp::kMax, 0x80000000, 0x00000000, 0x00000000},  // max(-0, 0) = 0
    {DType::kF32, ReduceOp::kSum, 0x00000000, 0x80000000, 0x00000000},  // sum(0, -0) = 0
    {DType::kF32, ReduceOp::kProd, 0x00000000, 0x80000000, 0x80000000},  // prod(0, -0) = -0
    {DType::kF32, ReduceOp::kMin, 0x00000000, 0x80000000, 0x80000000},  // min(0, -0) = -0
    {DType::kF32, ReduceOp::kMax, 0x00000000, 0x80000000, 0x00000000},  // max(0, -0) = 0
    {DType::kF32, ReduceOp::kSum, 0x80000000, 0x80000000, 0x80000000},  // sum(-0, -0) = -0
    {DType::kF32, ReduceOp::kProd, 0x80000000, 0x80000000, 0x00000000},  // prod(-0, -0) = 0
    {DType::kF32, ReduceOp::kMin, 0x80000000, 0x80000000, 0x80000000},  // min(-0, -0) = -0
    {DType::kF32, ReduceOp::kMax, 0x80000000, 0x80000000, 0x80000000},  // max(-0, -0) = -0
    {DType::kF32, ReduceOp::kSum, 0x7fc00000, 0x3f800000, 0x7fc00000},  // sum(nan, 1.0) = nan  NaN propagates
    {DType::kF32, ReduceOp::kProd, 0x7fc00000, 0x3f800000, 0x7fc00000},  // prod(nan, 1.0) = nan
    {DType::kF32, ReduceOp::kMin, 0x7fc00000, 0x3f800000, 0x7fc00000},  // min(nan, 1.0) = nan
    {DType::kF32, ReduceOp::kMax, 0x7fc00000, 0x3f800000, 0x7fc00000},  // max(nan, 1.0) = nan
    {DType::kF32, ReduceOp::kSum, 0x3f800000, 0x7fc00000, 0x7fc00000},  // sum(1.0, nan) = nan
    {DType::kF32, ReduceOp::kProd, 0x3f800000, 0x7fc00000, 0x7fc00000},  // prod(1.0, nan) = nan
    {DType::kF32, ReduceOp::kMin, 0x3f800000, 0x7fc00000, 0x7fc00000},  // min(1.0, nan) = nan
    {DType::kF32, ReduceOp::kMax, 0x3f800000, 0x7fc00000, 0x7fc00000},  // max(1.0, nan) = nan
    {DType::kF32, ReduceOp::kSum, 0x7fc00000, 0x7f800000, 0x7fc00000},  // sum(nan, inf) = nan
    {DType::kF32, ReduceOp::kProd, 0x7fc00000, 0x7f800000, 0x7fc00000},  // prod(nan, inf) = nan
    {DType::kF32, ReduceOp::kMin, 0x7fc00000, 0x7f800000, 0x7fc00000},  // min(nan, inf) = nan
    {DType::kF32, ReduceOp::kMax, 0x7fc00000, 0x7f800000, 0x7fc00000},  // max(nan, inf) = nan
    {DType::kF32, ReduceOp::kSum, 0xff800000, 0x7fc00000, 0x7fc00000},  // sum(-inf, nan) = nan
    {DType::kF32, ReduceOp::kProd, 0xff800000, 0x7fc00000, 0x7fc00000},  // prod(-inf, nan) = nan
    {DType::kF32, ReduceOp::kMin, 0xff800000, 0x7fc00000, 0xffc00000},  // min(-inf, nan) = nan
    {DType::kF32, ReduceOp::kMax, 0xff800000, 0x7fc00000, 0x7fc00000},  // max(-inf, nan) = nan
    {DType::kF32, ReduceOp::kSum, 0x7f800000, 0xff800000, 0xffc00000},  // sum(inf, -inf) = nan
    {DType::kF32, ReduceOp::kProd, 0x7f800000, 0xff800000, 0xff800000},  // prod(inf, -inf) = -inf
    {DType::kF32, ReduceOp::kMin, 0x7f800000, 0xff800000, 0xff800000},  // min(inf, -inf) = -inf
    {DType::kF32, ReduceOp::kMax, 0x7f800000, 0xff800000, 0x7f800000},  // max(inf, -inf) = inf
    {DType::kF32, ReduceOp::kSum, 0x7f800000, 0x00000000, 0x7f800000},  // sum(inf, 0) = inf
    {DType::kF32, ReduceOp::kProd, 0x7f800000, 0x00000000, 0xffc00000},  // prod(inf, 0) = nan
    {DType::kF32, ReduceOp::kMin, 0x7f800000, 0x00000000, 0x00000000},  // min(inf, 0) = 0
    {DType::kF32, ReduceOp::kMax, 0x7f800000, 0x00000000, 0x7f800000},  // max(inf, 0) = inf
    {DType::kF32, ReduceOp::kSum, 0x7f7fffff, 0x7f7fffff, 0x7f800000},  // sum(3.40282347e+38, 3.40282347e+38) = inf  overflow
    {DType::kF32, ReduceOp::kProd, 0x7f7fffff, 0x7f7fffff, 0x7f800000},  // prod(3.40282347e+38, 3.40282347e+38) = inf
    {DType::kF32, ReduceOp::kMin, 0x7f7fffff, 0x7f7fffff, 0x7f7fffff},  // min(3.40282347e+38, 3.40282347e+38) = 3.40282347e+38
    {DType::kF32, ReduceOp::kMax, 0x7f7fffff, 0x7f7fffff, 0x7f7fffff},  // max(3.40282347e+38, 3.40282347e+38) = 3.40282347e+38
    {DType::kF32, ReduceOp::kSum, 0x7f7fffff, 0xc0000000, 0x7f7fffff},  // sum(3.40282347e+38, -2.0) = 3.40282347e+38
    {DType::kF32, ReduceOp::kProd, 0x7f7fffff, 0xc0000000, 0xff800000},  // prod(3.40282347e+38, -2.0) = -inf
    {DType::kF32, ReduceOp::kMin, 0x7f7fffff, 0xc0000000, 0xc0000000},  // min(3.40282347e+38, -2.0) = -2.0
    {DType::kF32, ReduceOp::kMax, 0x7f7fffff, 0xc0000000, 0x7f7fffff},  // max(3.40282347e+38, -2.0) = 3.40282347e+38
    {DType::kF32, ReduceOp::kSum, 0x00000001, 0x00000000, 0x00000000},  // sum(1.40129846e-45, 0) = 0  subnormal read as zero (XLA CPU flushes: DAZ)
    {DType::kF32, ReduceOp::kProd, 0x00000001, 0x00000000, 0x00000000},  // prod(1.40129846e-45, 0) = 0
    {DType::kF32, ReduceOp::kMin, 0x00000001, 0x00000000, 0x00000000},  // min(1.40129846e-45, 0) = 0
    {DType::kF32, ReduceOp::kMax, 0x00000001, 0x00000000, 0x00000000},  // max(1.40129846e-45, 0) = 0
    {DType::kF32, ReduceOp::kSum, 0x807fffff, 0x00000001, 0x00000000},  // sum(-1.17549421e-38, 1.40129846e-45) = 0
    {DType::kF32, ReduceOp::kProd, 0x807fffff, 0x00000001, 0x80000000},  // prod(-1.17549421e-38, 1.40129846e-45) = -0
    {DType::kF32, ReduceOp::kMin, 0x807fffff, 0x00000001, 0x80000000},  // min(-1.17549421e-38, 1.40129846e-45) = -0
    {DType::kF32, ReduceOp::kMax, 0x807fffff, 0x00000001, 0x00000000},  // max(-1.17549421e-38, 1.40129846e-45) = 0
    {DType::kF32, ReduceOp::kSum, 0x00000001, 0xbf800000, 0xbf800000},  // sum(1.40129846e-45, -1.0) = -1.0
    {DType::kF32, ReduceOp::kProd, 0x00000001, 0xbf800000, 0x80000000},  // prod(1.40129846e-45, -1.0) = -0
    {DType::kF32, ReduceOp::kMin, 0x00000001, 0xbf800000, 0xbf800000},  // min(1.40129846e-45, -1.0) = -1.0
    {DType::kF32, ReduceOp::kMax, 0x00000001, 0xbf800000, 0x00000000},  // max(1.40129846e-45, -1.0) = 0
    {DType::kF32, ReduceOp::kSum, 0x807fffff, 0x40000000, 0x40000000},  // sum(-1.17549421e-38, 2.0) = 2.0
    {DType::kF32, ReduceOp::kProd, 0x807fffff, 0x40000000, 0x80000000},  // prod(-1.17549421e-38, 2.0) = -0
    {DType::kF32, ReduceOp::kMin, 0x807fffff, 0x40000000, 0x80000000},  // min(-1.17549421e-38, 2.0) = -0
    {DType::kF32, ReduceOp::kMax, 0x807fffff, 0x40000000, 0x40000000},  // max(-1.17549421e-38, 2.0) = 2.0
    {DType::kF32, ReduceOp::kSum, 0x00000001, 0x00800000, 0x00800000},  // sum(1.40129846e-45, 1.17549435e-38) = 1.17549435e-38
    {DType::kF32, ReduceOp::kProd, 0x00000001, 0x00800000, 0x00000000},  // prod(1.40129846e-45, 1.17549435e-38) = 0
    {DType::kF32, ReduceOp::kMin, 0x00000001, 0x00800000, 0x00000000},  // min(1.40129846e-45, 1.17549435e-38) = 0
    {DType::kF32, ReduceOp::kMax, 0x00000001, 0x00800000, 0x00800000},  // max(1.40129846e-45, 1.17549435e-38) = 1.17549435e-38
    {DType::kF32, ReduceOp::kSum, 0x00800000, 0x00800000, 0x01000000},  // sum(1.17549435e-38, 1.17549435e-38) = 2.3509887e-38
    {DType::kF32, ReduceOp::kProd, 0x00800000, 0x00800000, 0x00000000},  // prod(1.17549435e-38, 1.17549435e-38) = 0
    {DType::kF32, ReduceOp::kMin, 0x00800000, 0x00800000, 0x00800000},  // min(1.17549435e-38, 1.17549435e-38) = 1.17549435e-38
    {DType::kF32, ReduceOp::kMax, 0x00800000, 0x00800000, 0x00800000},  // max(1.17549435e-38, 1.17549435e-38) = 1.17549435e-38
    {DType::kF32, ReduceOp::kSum, 0x00800001, 0x80800000, 0x00000000},  // sum(1.17549449e-38, -1.17549435e-38) = 0  tiny sum flushed to +0 (FTZ)
    {DType::kF32, ReduceOp::kSum, 0x00800000, 0x80800003, 0x80000000},  // sum(1.17549435e-38, -1.17549477e-38) = -0  tiny sum flushed to -0
    {DType::kF32, ReduceOp::kSum, 0x00c00000, 0x80800000, 0x00000000},  // sum(1.76324153e-38, -1.17549435e-38) = 0  0.5 MIN flushed
    {DType::kF32, ReduceOp::kSum, 0x01000000, 0x80800000, 0x00800000},  // sum(2.3509887e-38, -1.17549435e-38) = 1.17549435e-38  exactly MIN: kept
    {DType::kF32, ReduceOp::kSum, 0x3f800000, 0x33800000, 0x3f800000},  // sum(1.0, 5.96046448e-08) = 1.0  tie: to even (down)
    {DType::kF32, ReduceOp::kSum, 0x3f800001, 0x33800000, 0x3f800002},  // sum(1.0000001192092896, 5.96046448e-08) = 1.000000238418579  tie: to even (up)
    {DType::kF32, ReduceOp::kSum, 0x3f800000, 0x33c00000, 0x3f800001},  // sum(1.0, 8.94069672e-08) = 1.0000001192092896  above the tie
    {DType::kF32, ReduceOp::kSum, 0x3dcccccd, 0x3e4ccccd, 0x3e99999a},  // sum(0.10000000149011612, 0.20000000298023224) = 0.30000001192092896
    {DType::kF32, ReduceOp::kProd, 0x3dcccccd, 0x40400000, 0x3e99999a},  // prod(0.10000000149011612, 3.0) = 0.30000001192092896
    {DType::kF32, ReduceOp::kProd, 0x80000000, 0x40a00000, 0x80000000},  // prod(-0, 5.0) = -0
    {DType::kF32, ReduceOp::kProd, 0x20000000, 0x20000000, 0x00800000},  // prod(1.08420217e-19, 1.08420217e-19) = 1.17549435e-38  exactly MIN
    {DType::kF32, ReduceOp::kProd, 0x1f800000, 0x20000000, 0x00000000},  // prod(5.42101086e-20, 1.08420217e-19) = 0  MIN/2: flushed
    {DType::kF32, ReduceOp::kProd, 0x9f800000, 0x20000000, 0x80000000},  // prod(-5.42101086e-20, 1.08420217e-19) = -0  flushed to -0
    {DType::kF32, ReduceOp::kProd, 0x00000001, 0x71800000, 0x00000000},  // prod(1.40129846e-45, 1.2676506e+30) = 0  subnormal operand read as zero
    {DType::kF32, ReduceOp::kProd, 0x219cd397, 0x1e50f1ba, 0x00800000},  // prod(1.06269785e-18, 1.10614162e-20) = 1.17549435e-38  exact just below MIN, rounds to MIN: kept
    {DType::kF32, ReduceOp::kProd, 0xa19cd397, 0x1e50f1ba, 0x80800000},  // prod(-1.06269785e-18, 1.10614162e-20) = -1.17549435e-38  same, negative
    {DType::kF32, ReduceOp::kProd, 0x21f2d7e7, 0x1e06ef49, 0x00000000},  // prod(1.64557067e-18, 7.14338394e-21) = 0  gradual rounding would give MIN; tiny by x86: flushed
    {DType::kF32, ReduceOp::kMin, 0x7fc00000, 0xffc00001, 0x7fc00000},  // min(nan, nan) = nan  both NaN
    {DType::kF32, ReduceOp::kMax, 0xffc00001, 0x7fc00000, 0xffc00001},  // max(nan, nan) = nan
    {DType::kF64, ReduceOp::kSum, 0x3ff0000000000000, 0x4000000000000000, 0x4008000000000000},  // sum(1.0, 2.0) = 3.0
    {DType::kF64, ReduceOp::kProd, 0x3ff0000000000000, 0x4000000000000000, 0x4000000000000000},  // prod(1.0, 2.0) = 2.0
    {DType::kF64, ReduceOp::kMin, 0x3ff0000000000000, 0x4000000000000000, 0x3ff0000000000000},  // min(1.0, 2.0) = 1.0
    {DType::kF64, ReduceOp::kMax, 0x3ff0000000000000, 0x4000000000000000, 0x4000000000000000},  // max(1.0, 2.0) = 2.0
    {DType::kF64, ReduceOp::kSum, 0xbff8000000000000, 0x3fd0000000000000, 0xbff4000000000000},  // sum(-1.5, 0.25) = -1.25
    {DType::kF64, ReduceOp::kProd, 0xbff8000000000000, 0x3fd0000000000000, 0xbfd8000000000000},  // prod(-1.5, 0.25) = -0.375
    {DType::kF64, ReduceOp::kMin, 0xbff8000000000000, 0x3fd0000000000000, 0xbff8000000000000},  // min(-1.5, 0.25) = -1.5
    {DType::kF64, ReduceOp::kMax, 0xbff8000000000000, 0x3fd0000000000000, 0x3fd0000000000000},  // max(-1.5, 0.25) = 0.25
    {DType::kF64, ReduceOp::kSum, 0x8000000000000000, 0x0000000000000000, 0x0000000000000000},  // sum(-0, 0) = 0  IEEE 754-2019 maximum/minimum on signed zeros
    {DType::kF64, ReduceOp::kProd, 0x8000000000000000, 0x0000000000000000, 0x8000000000000000},  // prod(-0, 0) = -0
    {DType::kF64, ReduceOp::kMin, 0x8000000000000000, 0x0000000000000000, 0x8000000000000000},  // min(-0, 0) = -0
    {DType::kF64, ReduceOp::kMax, 0x8000000000000000, 0x0000000000000000, 0x0000000000000000},  // max(-0, 0) = 0
    {DType::kF64, ReduceOp::kSum, 0x0000000000000000, 0x8000000000000000, 0x0000000000000000},  // sum(0, -0) = 0
    {DType::kF64, ReduceOp::kProd, 0x0000000000000000, 0x8000000000000000, 0x8000000000000000},  // prod(0, -0) = -0
    {DType::kF64, ReduceOp::kMin, 0x0000000000000000, 0x8000000000000000, 0x8000000000000000},  // min(0, -0) = -0
    {DType::kF64, ReduceOp::kMax, 0x0000000000000000, 0x8000000000000000, 0x0000000000000000},  // max(0, -0) = 0
    {DType::kF64, ReduceOp::kSum, 0x8000000000000000, 0x8000000000000000, 0x8000000000000000},  // sum(-0, -0) = -0
    {DType::kF64, ReduceOp::kProd, 0x8000000000000000, 0x8000000000000000, 0x0000000000000000},  // prod(-0, -0) = 0
    {DType::kF64, ReduceOp::kMin, 0x8000000000000000, 0x8000000000000000, 0x8000000000000000},  // min(-0, -0) = -0
    {DType::kF64, ReduceOp::kMax, 0x8000000000000000, 0x8000000000000000, 0x8000000000000000},  // max(-0, -0) = -0
    {DType::kF64, ReduceOp::kSum, 0x7ff8000000000000, 0x3ff0000000000000, 0x7ff8000000000000},  // sum(nan, 1.0) = nan  NaN propagates
    {DType::kF64, ReduceOp::kProd, 0x7ff8000000000000, 0x3ff0000000000000, 0x7ff8000000000000},  // prod(nan, 1.0) = nan
    {DType::kF64, ReduceOp::kMin, 0x7ff8000000000000, 0x3ff0000000000000, 0x7ff8000000000000},  // min(nan, 1.0) = nan
    {DType::kF64, ReduceOp::kMax, 0x7ff8000000000000, 0x3ff0000000000000, 0x7ff8000000000000},  // max(nan, 1.0) = nan
    {DType::kF64, ReduceOp::kSum, 0x3ff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // sum(1.0, nan) = nan
    {DType::kF64, ReduceOp::kProd, 0x3ff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // prod(1.0, nan) = nan
    {DType::kF64, ReduceOp::kMin, 0x3ff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // min(1.0, nan) = nan
    {DType::kF64, ReduceOp::kMax, 0x3ff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // max(1.0, nan) = nan
    {DType::kF64, ReduceOp::kSum, 0x7ff8000000000000, 0x7ff0000000000000, 0x7ff8000000000000},  // sum(nan, inf) = nan
    {DType::kF64, ReduceOp::kProd, 0x7ff8000000000000, 0x7ff0000000000000, 0x7ff8000000000000},  // prod(nan, inf) = nan
    {DType::kF64, ReduceOp::kMin, 0x7ff8000000000000, 0x7ff0000000000000, 0x7ff8000000000000},  // min(nan, inf) = nan
    {DType::kF64, ReduceOp::kMax, 0x7ff8000000000000, 0x7ff0000000000000, 0x7ff8000000000000},  // max(nan, inf) = nan
    {DType::kF64, ReduceOp::kSum, 0xfff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // sum(-inf, nan) = nan
    {DType::kF64, ReduceOp::kProd, 0xfff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // prod(-inf, nan) = nan
    {DType::kF64, ReduceOp::kMin, 0xfff0000000000000, 0x7ff8000000000000, 0xfff8000000000000},  // min(-inf, nan) = nan
    {DType::kF64, ReduceOp::kMax, 0xfff0000000000000, 0x7ff8000000000000, 0x7ff8000000000000},  // max(-inf, nan) = nan
    {DType::kF64, ReduceOp::kSum, 0x7ff0000000000000, 0xfff0000000000000, 0xfff8000000000000},  // sum(inf, -inf) = nan
    {DType::kF64, ReduceOp::kProd, 0x7ff0000000000000, 0xfff0000000000000, 0xfff0000000000000},  // prod(inf, -inf) = -inf
    {DType::kF64, ReduceOp::kMin, 0x7ff0000000000000, 0xfff0000000000000, 0xfff0000000000000},  // min(inf, -inf) = -inf
    {DType::kF64, ReduceOp::kMax, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff0000000000000},  // max(inf, -inf) = inf
    {DType::kF64, ReduceOp::kSum, 0x7ff0000000000000, 0x0000000000000000, 0x7ff0000000000000},  // sum(inf, 0) = inf
    {DType::kF64, ReduceOp::kProd, 0x7ff0000000000000, 0x0000000000000000, 0xfff8000000000000},  // prod(inf, 0) = nan
    {DType::kF64, ReduceOp::kMin, 0x7ff0000000000000, 0x0000000000000000, 0x0000000000000000},  // min(inf, 0) = 0
    {DType::kF64, ReduceOp::kMax, 0x7ff0000000000000, 0x0000000000000000, 0x7ff0000000000000},  // max(inf, 0) = inf
    {DType::kF64, ReduceOp::kSum, 0x7fefffffffffffff, 0x7fefffffffffffff, 0x7ff0000000000000},  // sum(1.79769313e+308, 1.79769313e+308) = inf  overflow
    {DType::kF64, ReduceOp::kProd, 0x7fefffffffffffff, 0x7fefffffffffffff, 0x7ff0000000000000},  // prod(1.79769313e+308, 1.79769313e+308) = inf
    {DType::kF64, ReduceOp::kMin, 0x7fefffffffffffff, 0x7fefffffffffffff, 0x7fefffffffffffff},  // min(1.79769313e+308, 1.79769313e+308) = 1.79769313e+308
    {DType::kF64, ReduceOp::kMax, 0x7fefffffffffffff, 0x7fefffffffffffff, 0x7fefffffffffffff},  // max(1.79769313e+308, 1.79769313e+308) = 1.79769313e+308
    {DType::kF64, ReduceOp::kSum, 0x7fefffffffffffff, 0xc000000000000000, 0x7fefffffffffffff},  // sum(1.79769313e+308, -2.0) = 1.79769313e+308
    {DType::kF64, ReduceOp::kProd, 0x7fefffffffffffff, 0xc000000000000000, 0xfff0000000000000},  // prod(1.79769313e+308, -2.0) = -inf
    {DType::kF64, ReduceOp::kMin, 0x7fefffffffffffff, 0xc000000000000000, 0xc000000000000000},  // min(1.79769313e+308, -2.0) = -2.0
    {DType::kF64, ReduceOp::kMax, 0x7fefffffffffffff, 0xc000000000000000, 0x7fefffffffffffff},  // max(1.79769313e+308, -2.0) = 1.79769313e+308
    {DType::kF64, ReduceOp::kSum, 0x0000000000000001, 0x0000000000000000, 0x0000000000000000},  // sum(4.94065646e-324, 0) = 0  subnormal read as zero (XLA CPU flushes: DAZ)
    {DType::kF64, ReduceOp::kProd, 0x0000000000000001, 0x0000000000000000, 0x0000000000000000},  // prod(4.94065646e-324, 0) = 0
    {DType::kF64, ReduceOp::kMin, 0x0000000000000001, 0x0000000000000000, 0x0000000000000000},  // min(4.94065646e-324, 0) = 0
    {DType::kF64, ReduceOp::kMax, 0x0000000000000001, 0x0000000000000000, 0x0000000000000000},  // max(4.94065646e-324, 0) = 0
    {DType::kF64, ReduceOp::kSum, 0x800fffffffffffff, 0x0000000000000001, 0x0000000000000000},  // sum(-2.22507386e-308, 4.94065646e-324) = 0
    {DType::kF64, ReduceOp::kProd, 0x800fffffffffffff, 0x0000000000000001, 0x8000000000000000},  // prod(-2.22507386e-308, 4.94065646e-324) = -0
    {DType::kF64, ReduceOp::kMin, 0x800fffffffffffff, 0x0000000000000001, 0x8000000000000000},  // min(-2.22507386e-308, 4.94065646e-324) = -0
    {DType::kF64, ReduceOp::kMax, 0x800fffffffffffff, 0x0000000000000001, 0x0000000000000000},  // max(-2.22507386e-308, 4.94065646e-324) = 0
    {DType::kF64, ReduceOp::kSum, 0x0000000000000001, 0xbff0000000000000, 0xbff0000000000000},  // sum(4.94065646e-324, -1.0) = -1.0
    {DType::kF64, ReduceOp::kProd, 0x0000000000000001, 0xbff0000000000000, 0x8000000000000000},  // prod(4.94065646e-324, -1.0) = -0
    {DType::kF64, ReduceOp::kMin, 0x0000000000000001, 0xbff0000000000000, 0xbff0000000000000},  // min(4.94065646e-324, -1.0) = -1.0
    {DType::kF64, ReduceOp::kMax, 0x0000000000000001, 0xbff0000000000000, 0x0000000000000000},  // max(4.94065646e-324, -1.0) = 0
    {DType::kF64, ReduceOp::kSum, 0x800fffffffffffff, 0x4000000000000000, 0x4000000000000000},  // sum(-2.22507386e-308, 2.0) = 2.0
    {DType::kF64, ReduceOp::kProd, 0x800fffffffffffff, 0x4000000000000000, 0x8000000000000000},  // prod(-2.22507386e-308, 2.0) = -0
    {DType::kF64, ReduceOp::kMin, 0x800fffffffffffff, 0x4000000000000000, 0x8000000000000000},  // min(-2.22507386e-308, 2.0) = -0
    {DType::kF64, ReduceOp::kMax, 0x800fffffffffffff, 0x4000000000000000, 0x4000000000000000},  // max(-2.22507386e-308, 2.0) = 2.0
    {DType::kF64, ReduceOp::kSum, 0x0000000000000001, 0x0010000000000000, 0x0010000000000000},  // sum(4.94065646e-324, 2.22507386e-308) = 2.22507386e-308
    {DType::kF64, ReduceOp::kProd, 0x0000000000000001, 0x0010000000000000, 0x0000000000000000},  // prod(4.94065646e-324, 2.22507386e-308) = 0
    {DType::kF64, ReduceOp::kMin, 0x0000000000000001, 0x0010000000000000, 0x0000000000000000},  // min(4.94065646e-324, 2.22507386e-308) = 0
    {DType::kF64, ReduceOp::kMax, 0x0000000000000001, 0x0010000000000000, 0x0010000000000000},  // max(4.94065646e-324, 2.22507386e-308) = 2.22507386e-308
    {DType::kF64, ReduceOp::kSum, 0x0010000000000000, 0x0010000000000000, 0x0020000000000000},  // sum(2.22507386e-308, 2.22507386e-308) = 4.45014772e-308
    {DType::kF64, ReduceOp::kProd, 0x0010000000000000, 0x0010000000000000, 0x0000000000000000},  // prod(2.22507386e-308, 2.22507386e-308) = 0
    {DType::kF64, ReduceOp::kMin, 0x0010000000000000, 0x0010000000000000, 0x0010000000000000},  // min(2.22507386e-308, 2.22507386e-308) = 2.22507386e-308
    {DType::kF64, ReduceOp::kMax, 0x0010000000000000, 0x0010000000000000, 0x0010000000000000},  // max(2.22507386e-308, 2.22507386e-308) = 2.22507386e-308
    {DType::kF64, ReduceOp::kSum, 0x0010000000000001, 0x8010000000000000, 0x0000000000000000},  // sum(2.22507386e-308, -2.22507386e-308) = 0  tiny sum flushed to +0 (FTZ)
    {DType::kF64, ReduceOp::kSum, 0x0010000000000000, 0x8010000000000003, 0x8000000000000000},  // sum(2.22507386e-308, -2.22507386e-308) = -0  tiny sum flushed to -0
    {DType::kF64, ReduceOp::kSum, 0x0018000000000000, 0x8010000000000000, 0x0000000000000000},  // sum(3.33761079e-308, -2.22507386e-308) = 0  0.5 MIN flushed
    {DType::kF64, ReduceOp::kSum, 0x0020000000000000, 0x8010000000000000, 0x0010000000000000},  // sum(4.45014772e-308, -2.22507386e-308) = 2.22507386e-308  exactly MIN: kept
    {DType::kF64, ReduceOp::kSum, 0x3ff0000000000000, 0x3ca0000000000000, 0x3ff0000000000000},  // sum(1.0, 1.11022302e-16) = 1.0  tie: to even (down)
    {DType::kF64, ReduceOp::kSum, 0x3ff0000000000001, 0x3ca0000000000000, 0x3ff0000000000002},  // sum(1.0000000000000002, 1.11022302e-16) = 1.0000000000000004  tie: to even (up)
    {DType::kF64, ReduceOp::kSum, 0x3ff0000000000000, 0x3ca8000000000000, 0x3ff0000000000001},  // sum(1.0, 1.66533454e-16) = 1.0000000000000002  above the tie
    {DType::kF64, ReduceOp::kSum, 0x3fb999999999999a, 0x3fc999999999999a, 0x3fd3333333333334},  // sum(0.1, 0.2) = 0.30000000000000004
    {DType::kF64, ReduceOp::kProd, 0x3fb999999999999a, 0x4008000000000000, 0x3fd3333333333334},  // prod(0.1, 3.0) = 0.30000000000000004
    {DType::kF64, ReduceOp::kProd, 0x8000000000000000, 0x4014000000000000, 0x8000000000000000},  // prod(-0, 5.0) = -0
    {DType::kF64, ReduceOp::kProd, 0x3c00000000000000, 0x0400000000000000, 0x0010000000000000},  // prod(1.08420217e-19, 2.0522684e-289) = 2.22507386e-308  exactly MIN
    {DType::kF64, ReduceOp::kProd, 0x3bf0000000000000, 0x0400000000000000, 0x0000000000000000},  // prod(5.42101086e-20, 2.0522684e-289) = 0  MIN/2: flushed
    {DType::kF64, ReduceOp::kProd, 0xbbf0000000000000, 0x0400000000000000, 0x8000000000000000},  // prod(-5.42101086e-20, 2.0522684e-289) = -0  flushed to -0
    {DType::kF64, ReduceOp::kProd, 0x0000000000000001, 0x4630000000000000, 0x0000000000000000},  // prod(4.94065646e-324, 1.2676506e+30) = 0  subnormal operand read as zero
    {DType::kF64, ReduceOp::kProd, 0x3c3e5afcdbcaf266, 0x03c0dde92b8830de, 0x0010000000000000},  // prod(1.64557066e-18, 1.35215941e-290) = 2.22507386e-308  exact just below MIN, rounds to MIN: kept
    {DType::kF64, ReduceOp::kProd, 0xbc3e5afcdbcaf266, 0x03c0dde92b8830de, 0x8010000000000000},  // prod(-1.64557066e-18, 1.35215941e-290) = -2.22507386e-308  same, negative
    {DType::kF64, ReduceOp::kProd, 0x3c3a00641a9f1e54, 0x03c3b0ef435201be, 0x0000000000000000},  // prod(1.40954563e-18, 1.57857526e-290) = 0  gradual rounding would give MIN; tiny by x86: flushed
    {DType::kF64, ReduceOp::kMin, 0x7ff8000000000000, 0xfff8000000000001, 0x7ff8000000000000},  // min(nan, nan) = nan  both NaN
    {DType::kF64, ReduceOp::kMax, 0xfff8000000000001, 0x7ff8000000000000, 0xfff8000000000001},  // max(nan, nan) = nan
    {DType::kF16, ReduceOp::kSum, 0x3c00, 0x4000, 0x4200},  // sum(1.0, 2.0) = 3.0
    {DType::kF16, ReduceOp::kProd, 0x3c00, 0x4000, 0x4000},  // prod(1.0, 2.0) = 2.0
    {DType::kF16, ReduceOp::kMin, 0x3c00, 0x4000, 0x3c00},  // min(1.0, 2.0) = 1.0
    {DType::kF16, ReduceOp::kMax, 0x3c00, 0x4000, 0x4000},  // max(1.0, 2.0) = 2.0
    {DType::kF16, ReduceOp::kSum, 0x8000, 0x0000, 0x0000},  // sum(-0, 0) = 0
    {DType::kF16, ReduceOp::kProd, 0x8000, 0x0000, 0x8000},  // prod(-0, 0) = -0
    {DType::kF16, ReduceOp::kMin, 0x8000, 0x0000, 0x8000},  // min(-0, 0) = -0
    {DType::kF16, ReduceOp::kMax, 0x8000, 0x0000, 0x0000},  // max(-0, 0) = 0
    {DType::kF16, ReduceOp::kSum, 0x0000, 0x8000, 0x0000},  // sum(0, -0) = 0
    {DType::kF16, ReduceOp::kProd, 0x0000, 0x8000, 0x8000},  // prod(0, -0) = -0
    {DType::kF16, ReduceOp::kMin, 0x0000, 0x8000, 0x8000},  // min(0, -0) = -0
    {DType::kF16, ReduceOp::kMax, 0x0000, 0x8000, 0x0000},  // max(0, -0) = 0
    {DType::kF16, ReduceOp::kSum, 0x7e00, 0x3c00, 0x7e00},  // sum(nan, 1.0) = nan
    {DType::kF16, ReduceOp::kProd, 0x7e00, 0x3c00, 0x7e00},  // prod(nan, 1.0) = nan
    {DType::kF16, ReduceOp::kMin, 0x7e00, 0x3c00, 0x7e00},  // min(nan, 1.0) = nan
    {DType::kF16, ReduceOp::kMax, 0x7e00, 0x3c00, 0x7e00},  // max(nan, 1.0) = nan
    {DType::kF16, ReduceOp::kSum, 0x3c00, 0x7e00, 0x7e00},  // sum(1.0, nan) = nan
    {DType::kF16, ReduceOp::kProd, 0x3c00, 0x7e00, 0x7e00},  // prod(1.0, nan) = nan
    {DType::kF16, ReduceOp::kMin, 0x3c00, 0x7e00, 0x7e00},  // min(1.0, nan) = nan
    {DType::kF16, ReduceOp::kMax, 0x3c00, 0x7e00, 0x7e00},  // max(1.0, nan) = nan
    {DType::kF16, ReduceOp::kSum, 0x7c00, 0xfc00, 0xfe00},  // sum(inf, -inf) = nan
    {DType::kF16, ReduceOp::kProd, 0x7c00, 0xfc00, 0xfc00},  // prod(inf, -inf) = -inf
    {DType::kF16, ReduceOp::kMin, 0x7c00, 0xfc00, 0xfc00},  // min(inf, -inf) = -inf
    {DType::kF16, ReduceOp::kMax, 0x7c00, 0xfc00, 0x7c00},  // max(inf, -inf) = inf
    {DType::kF16, ReduceOp::kSum, 0x0001, 0x0000, 0x0001},  // sum(5.96046448e-08, 0) = 5.96046448e-08  float16 subnormals are float32 normals: kept
    {DType::kF16, ReduceOp::kProd, 0x0001, 0x0000, 0x0000},  // prod(5.96046448e-08, 0) = 0
    {DType::kF16, ReduceOp::kMin, 0x0001, 0x0000, 0x0000},  // min(5.96046448e-08, 0) = 0
    {DType::kF16, ReduceOp::kMax, 0x0001, 0x0000, 0x0001},  // max(5.96046448e-08, 0) = 5.96046448e-08
    {DType::kF16, ReduceOp::kSum, 0x0001, 0x8000, 0x0001},  // sum(5.96046448e-08, -0) = 5.96046448e-08
    {DType::kF16, ReduceOp::kProd, 0x0001, 0x8000, 0x8000},  // prod(5.96046448e-08, -0) = -0
    {DType::kF16, ReduceOp::kMin, 0x0001, 0x8000, 0x8000},  // min(5.96046448e-08, -0) = -0
    {DType::kF16, ReduceOp::kMax, 0x0001, 0x8000, 0x0001},  // max(5.96046448e-08, -0) = 5.96046448e-08
    {DType::kF16, ReduceOp::kSum, 0x8001, 0x0001, 0x0000},  // sum(-5.96046448e-08, 5.96046448e-08) = 0
    {DType::kF16, ReduceOp::kProd, 0x8001, 0x0001, 0x8000},  // prod(-5.96046448e-08, 5.96046448e-08) = -0
    {DType::kF16, ReduceOp::kMin, 0x8001, 0x0001, 0x8001},  // min(-5.96046448e-08, 5.96046448e-08) = -5.96046448e-08
    {DType::kF16, ReduceOp::kMax, 0x8001, 0x0001, 0x0001},  // max(-5.96046448e-08, 5.96046448e-08) = 5.96046448e-08
    {DType::kF16, ReduceOp::kSum, 0x03ff, 0x0001, 0x0400},  // sum(6.09755516e-05, 5.96046448e-08) = 6.10351562e-05
    {DType::kF16, ReduceOp::kProd, 0x03ff, 0x0001, 0x0000},  // prod(6.09755516e-05, 5.96046448e-08) = 0
    {DType::kF16, ReduceOp::kMin, 0x03ff, 0x0001, 0x0001},  // min(6.09755516e-05, 5.96046448e-08) = 5.96046448e-08
    {DType::kF16, ReduceOp::kMax, 0x03ff, 0x0001, 0x03ff},  // max(6.09755516e-05, 5.96046448e-08) = 6.09755516e-05
    {DType::kF16, ReduceOp::kSum, 0x7bff, 0x4c00, 0x7c00},  // sum(65504.0, 16.0) = inf  65520 is the tie above 65504: to inf
    {DType::kF16, ReduceOp::kProd, 0x7bff, 0x4c00, 0x7c00},  // prod(65504.0, 16.0) = inf
    {DType::kF16, ReduceOp::kMin, 0x7bff, 0x4c00, 0x4c00},  // min(65504.0, 16.0) = 16.0
    {DType::kF16, ReduceOp::kMax, 0x7bff, 0x4c00, 0x7bff},  // max(65504.0, 16.0) = 65504.0
    {DType::kF16, ReduceOp::kSum, 0x7bff, 0x4800, 0x7bff},  // sum(65504.0, 8.0) = 65504.0
    {DType::kF16, ReduceOp::kProd, 0x7bff, 0x4800, 0x7c00},  // prod(65504.0, 8.0) = inf
    {DType::kF16, ReduceOp::kMin, 0x7bff, 0x4800, 0x4800},  // min(65504.0, 8.0) = 8.0
    {DType::kF16, ReduceOp::kMax, 0x7bff, 0x4800, 0x7bff},  // max(65504.0, 8.0) = 65504.0
    {DType::kF16, ReduceOp::kSum, 0x5c00, 0x5c00, 0x6000},  // sum(256.0, 256.0) = 512.0
    {DType::kF16, ReduceOp::kProd, 0x5c00, 0x5c00, 0x7c00},  // prod(256.0, 256.0) = inf
    {DType::kF16, ReduceOp::kMin, 0x5c00, 0x5c00, 0x5c00},  // min(256.0, 256.0) = 256.0
    {DType::kF16, ReduceOp::kMax, 0x5c00, 0x5c00, 0x5c00},  // max(256.0, 256.0) = 256.0
    {DType::kF16, ReduceOp::kSum, 0x3c00, 0x1000, 0x3c00},  // sum(1.0, 0.00048828125) = 1.0  tie: to even (down)
    {DType::kF16, ReduceOp::kSum, 0x3c01, 0x1000, 0x3c02},  // sum(1.0009765625, 0.00048828125) = 1.001953125  tie: to even (up)
    {DType::kF16, ReduceOp::kSum, 0x3c00, 0x1200, 0x3c01},  // sum(1.0, 0.000732421875) = 1.0009765625
    {DType::kF16, ReduceOp::kSum, 0xfbff, 0xd000, 0xfc00},  // sum(-65504.0, -32.0) = -inf  overflow to -inf
    {DType::kF16, ReduceOp::kSum, 0x0200, 0x0200, 0x0400},  // sum(3.05175781e-05, 3.05175781e-05) = 6.10351562e-05  subnormal + subnormal = smallest normal
    {DType::kF16, ReduceOp::kProd, 0x0001, 0x3800, 0x0000},  // prod(5.96046448e-08, 0.5) = 0  2^-25: tie between 0 and 2^-24, to even 0
    {DType::kF16, ReduceOp::kProd, 0x0003, 0x3800, 0x0002},  // prod(1.78813934e-07, 0.5) = 1.1920929e-07  1.5 * 2^-24: tie, to even 2 * 2^-24
    {DType::kF16, ReduceOp::kProd, 0x0001, 0x3a00, 0x0001},  // prod(5.96046448e-08, 0.75) = 5.96046448e-08  0.75 * 2^-24: up to 2^-24
    {DType::kF16, ReduceOp::kProd, 0x0001, 0xb400, 0x8000},  // prod(5.96046448e-08, -0.25) = -0  underflow to -0
    {DType::kF16, ReduceOp::kProd, 0x2e66, 0x2e66, 0x211e},  // prod(0.0999755859375, 0.0999755859375) = 0.0099945068359375
    {DType::kF16, ReduceOp::kProd, 0x5cb0, 0x5cb0, 0x7c00},  // prod(300.0, 300.0) = inf  overflow
    {DType::kBF16, ReduceOp::kSum, 0x3f80, 0x4000, 0x4040},  // sum(1.0, 2.0) = 3.0
    {DType::kBF16, ReduceOp::kProd, 0x3f80, 0x4000, 0x4000},  // prod(1.0, 2.0) = 2.0
    {DType::kBF16, ReduceOp::kMin, 0x3f80, 0x4000, 0x3f80},  // min(1.0, 2.0) = 1.0
    {DType::kBF16, ReduceOp::kMax, 0x3f80, 0x4000, 0x4000},  // max(1.0, 2.0) = 2.0
    {DType::kBF16, ReduceOp::kSum, 0x8000, 0x0000, 0x0000},  // sum(-0, 0) = 0
    {DType::kBF16, ReduceOp::kProd, 0x8000, 0x0000, 0x8000},  // prod(-0, 0) = -0
    {DType::kBF16, ReduceOp::kMin, 0x8000, 0x0000, 0x8000},  // min(-0, 0) = -0
    {DType::kBF16, ReduceOp::kMax, 0x8000, 0x0000, 0x0000},  // max(-0, 0) = 0
    {DType::kBF16, ReduceOp::kSum, 0x0000, 0x8000, 0x0000},  // sum(0, -0) = 0
    {DType::kBF16, ReduceOp::kProd, 0x0000, 0x8000, 0x8000},  // prod(0, -0) = -0
    {DType::kBF16, ReduceOp::kMin, 0x0000, 0x8000, 0x8000},  // min(0, -0) = -0
    {DType::kBF16, ReduceOp::kMax, 0x0000, 0x8000, 0x0000},  // max(0, -0) = 0
    {DType::kBF16, ReduceOp::kSum, 0x7fc0, 0x3f80, 0x7fc0},  // sum(nan, 1.0) = nan
    {DType::kBF16, ReduceOp::kProd, 0x7fc0, 0x3f80, 0x7fc0},  // prod(nan, 1.0) = nan
    {DType::kBF16, ReduceOp::kMin, 0x7fc0, 0x3f80, 0x7fc0},  // min(nan, 1.0) = nan
    {DType::kBF16, ReduceOp::kMax, 0x7fc0, 0x3f80, 0x7fc0},  // max(nan, 1.0) = nan
    {DType::kBF16, ReduceOp::kSum, 0xbf80, 0xffc0, 0xffc0},  // sum(-1.0, nan) = nan
    {DType::kBF16, ReduceOp::kProd, 0xbf80, 0xffc0, 0xffc0},  // prod(-1.0, nan) = nan
    {DType::kBF16, ReduceOp::kMin, 0xbf80, 0xffc0, 0xffc0},  // min(-1.0, nan) = nan
    {DType::kBF16, ReduceOp::kMax, 0xbf80, 0xffc0, 0xffc0},  // max(-1.0, nan) = nan
    {DType::kBF16, ReduceOp::kSum, 0x7f80, 0xff80, 0xffc0},  // sum(inf, -inf) = nan
    {DType::kBF16, ReduceOp::kProd, 0x7f80, 0xff80, 0xff80},  // prod(inf, -inf) = -inf
    {DType::kBF16, ReduceOp::kMin, 0x7f80, 0xff80, 0xff80},  // min(inf, -inf) = -inf
    {DType::kBF16, ReduceOp::kMax, 0x7f80, 0xff80, 0x7f80},  // max(inf, -inf) = inf
    {DType::kBF16, ReduceOp::kSum, 0x0001, 0x0000, 0x0000},  // sum(9.18354962e-41, 0) = 0  bfloat16 subnormals are float32 subnormals: read as zero
    {DType::kBF16, ReduceOp::kProd, 0x0001, 0x0000, 0x0000},  // prod(9.18354962e-41, 0) = 0
    {DType::kBF16, ReduceOp::kMin, 0x0001, 0x0000, 0x0000},  // min(9.18354962e-41, 0) = 0
    {DType::kBF16, ReduceOp::kMax, 0x0001, 0x0000, 0x0000},  // max(9.18354962e-41, 0) = 0
    {DType::kBF16, ReduceOp::kSum, 0x8001, 0x0001, 0x0000},  // sum(-9.18354962e-41, 9.18354962e-41) = 0
    {DType::kBF16, ReduceOp::kProd, 0x8001, 0x0001, 0x8000},  // prod(-9.18354962e-41, 9.18354962e-41) = -0
    {DType::kBF16, ReduceOp::kMin, 0x8001, 0x0001, 0x8000},  // min(-9.18354962e-41, 9.18354962e-41) = -0
    {DType::kBF16, ReduceOp::kMax, 0x8001, 0x0001, 0x0000},  // max(-9.18354962e-41, 9.18354962e-41) = 0
    {DType::kBF16, ReduceOp::kSum, 0x0001, 0x3f80, 0x3f80},  // sum(9.18354962e-41, 1.0) = 1.0
    {DType::kBF16, ReduceOp::kProd, 0x0001, 0x3f80, 0x0000},  // prod(9.18354962e-41, 1.0) = 0
    {DType::kBF16, ReduceOp::kMin, 0x0001, 0x3f80, 0x0000},  // min(9.18354962e-41, 1.0) = 0
    {DType::kBF16, ReduceOp::kMax, 0x0001, 0x3f80, 0x3f80},  // max(9.18354962e-41, 1.0) = 1.0
    {DType::kBF16, ReduceOp::kSum, 0x0080, 0x0001, 0x0080},  // sum(1.17549435e-38, 9.18354962e-41) = 1.17549435e-38
    {DType::kBF16, ReduceOp::kProd, 0x0080, 0x0001, 0x0000},  // prod(1.17549435e-38, 9.18354962e-41) = 0
    {DType::kBF16, ReduceOp::kMin, 0x0080, 0x0001, 0x0000},  // min(1.17549435e-38, 9.18354962e-41) = 0
    {DType::kBF16, ReduceOp::kMax, 0x0080, 0x0001, 0x0080},  // max(1.17549435e-38, 9.18354962e-41) = 1.17549435e-38
    {DType::kBF16, ReduceOp::kSum, 0x7f7f, 0x7f7f, 0x7f80},  // sum(3.38953139e+38, 3.38953139e+38) = inf  overflow
    {DType::kBF16, ReduceOp::kProd, 0x7f7f, 0x7f7f, 0x7f80},  // prod(3.38953139e+38, 3.38953139e+38) = inf
    {DType::kBF16, ReduceOp::kMin, 0x7f7f, 0x7f7f, 0x7f7f},  // min(3.38953139e+38, 3.38953139e+38) = 3.38953139e+38
    {DType::kBF16, ReduceOp::kMax, 0x7f7f, 0x7f7f, 0x7f7f},  // max(3.38953139e+38, 3.38953139e+38) = 3.38953139e+38
    {DType::kBF16, ReduceOp::kSum, 0x7f7f, 0x7b80, 0x7f80},  // sum(3.38953139e+38, 1.329228e+36) = inf
    {DType::kBF16, ReduceOp::kProd, 0x7f7f, 0x7b80, 0x7f80},  // prod(3.38953139e+38, 1.329228e+36) = inf
    {DType::kBF16, ReduceOp::kMin, 0x7f7f, 0x7b80, 0x7b80},  // min(3.38953139e+38, 1.329228e+36) = 1.329228e+36
    {DType::kBF16, ReduceOp::kMax, 0x7f7f, 0x7b80, 0x7f7f},  // max(3.38953139e+38, 1.329228e+36) = 3.38953139e+38
    {DType::kBF16, ReduceOp::kSum, 0x3f80, 0x3b80, 0x3f80},  // sum(1.0, 0.00390625) = 1.0  tie: to even (down)
    {DType::kBF16, ReduceOp::kSum, 0x3f81, 0x3b80, 0x3f82},  // sum(1.0078125, 0.00390625) = 1.015625  tie: to even (up)
    {DType::kBF16, ReduceOp::kSum, 0x3f80, 0x3bc0, 0x3f81},  // sum(1.0, 0.005859375) = 1.0078125
    {DType::kBF16, ReduceOp::kSum, 0x4380, 0x3f80, 0x4380},  // sum(256.0, 1.0) = 256.0  1 is half an ulp of 256: tie to even
    {DType::kBF16, ReduceOp::kSum, 0x4381, 0x3f80, 0x4382},  // sum(258.0, 1.0) = 260.0  258 + 1: tie to even (up to 260)
    {DType::kBF16, ReduceOp::kSum, 0x00c0, 0x8080, 0x0000},  // sum(1.76324153e-38, -1.17549435e-38) = 0  0.5 MIN: flushed
    {DType::kBF16, ReduceOp::kSum, 0x0100, 0x8080, 0x0080},  // sum(2.3509887e-38, -1.17549435e-38) = 1.17549435e-38  exactly MIN: kept
    {DType::kBF16, ReduceOp::kProd, 0x2000, 0x2000, 0x0080},  // prod(1.08420217e-19, 1.08420217e-19) = 1.17549435e-38  exactly MIN
    {DType::kBF16, ReduceOp::kProd, 0x1f80, 0x2000, 0x0000},  // prod(5.42101086e-20, 1.08420217e-19) = 0  MIN/2: flushed
    {DType::kBF16, ReduceOp::kProd, 0x3f81, 0x3f81, 0x3f82},  // prod(1.0078125, 1.0078125) = 1.015625  (1+2^-7)^2 rounds to nearest
    {DType::kBF16, ReduceOp::kProd, 0x3fc1, 0x3fc1, 0x4012},  // prod(1.5078125, 1.5078125) = 2.28125
    {DType::kBF16, ReduceOp::kProd, 0x3dcd, 0x4040, 0x3e9a},  // prod(0.10009765625, 3.0) = 0.30078125
    {DType::kI8, ReduceOp::kSum, 0x7f, 0x01, 0x80},  // sum(127, 1) = -128  wraps
    {DType::kI8, ReduceOp::kProd, 0x7f, 0x01, 0x7f},  // prod(127, 1) = 127
    {DType::kI8, ReduceOp::kMin, 0x7f, 0x01, 0x01},  // min(127, 1) = 1
    {DType::kI8, ReduceOp::kMax, 0x7f, 0x01, 0x7f},  // max(127, 1) = 127
    {DType::kI8, ReduceOp::kSum, 0x80, 0x7f, 0xff},  // sum(-128, 127) = -1
    {DType::kI8, ReduceOp::kProd, 0x80, 0x7f, 0x80},  // prod(-128, 127) = -128
    {DType::kI8, ReduceOp::kMin, 0x80, 0x7f, 0x80},  // min(-128, 127) = -128
    {DType::kI8, ReduceOp::kMax, 0x80, 0x7f, 0x7f},  // max(-128, 127) = 127
    {DType::kI8, ReduceOp::kSum, 0x7f, 0x7f, 0xfe},  // sum(127, 127) = -2
    {DType::kI8, ReduceOp::kProd, 0x7f, 0x7f, 0x01},  // prod(127, 127) = 1
    {DType::kI8, ReduceOp::kMin, 0x7f, 0x7f, 0x7f},  // min(127, 127) = 127
    {DType::kI8, ReduceOp::kMax, 0x7f, 0x7f, 0x7f},  // max(127, 127) = 127
    {DType::kI8, ReduceOp::kSum, 0x02, 0x03, 0x05},  // sum(2, 3) = 5
    {DType::kI8, ReduceOp::kProd, 0x02, 0x03, 0x06},  // prod(2, 3) = 6
    {DType::kI8, ReduceOp::kMin, 0x02, 0x03, 0x02},  // min(2, 3) = 2
    {DType::kI8, ReduceOp::kMax, 0x02, 0x03, 0x03},  // max(2, 3) = 3
    {DType::kI8, ReduceOp::kSum, 0x80, 0xff, 0x7f},  // sum(-128, -1) = 127
    {DType::kI8, ReduceOp::kProd, 0x80, 0xff, 0x80},  // prod(-128, -1) = -128
    {DType::kI8, ReduceOp::kMin, 0x80, 0xff, 0x80},  // min(-128, -1) = -128
    {DType::kI8, ReduceOp::kMax, 0x80, 0xff, 0xff},  // max(-128, -1) = -1
    {DType::kI8, ReduceOp::kSum, 0xff, 0x01, 0x00},  // sum(-1, 1) = 0
    {DType::kI8, ReduceOp::kProd, 0xff, 0x01, 0xff},  // prod(-1, 1) = -1
    {DType::kI8, ReduceOp::kMin, 0xff, 0x01, 0xff},  // min(-1, 1) = -1
    {DType::kI8, ReduceOp::kMax, 0xff, 0x01, 0x01},  // max(-1, 1) = 1
    {DType::kI8, ReduceOp::kSum, 0x80, 0x80, 0x00},  // sum(-128, -128) = 0
    {DType::kI8, ReduceOp::kProd, 0x80, 0x80, 0x00},  // prod(-128, -128) = 0
    {DType::kI8, ReduceOp::kMin, 0x80, 0x80, 0x80},  // min(-128, -128) = -128
    {DType::kI8, ReduceOp::kMax, 0x80, 0x80, 0x80},  // max(-128, -128) = -128
    {DType::kI8, ReduceOp::kProd, 0xfd, 0x05, 0xf1},  // prod(-3, 5) = -15
    {DType::kI8, ReduceOp::kProd, 0x10, 0x10, 0x00},  // prod(16, 16) = 0  2^(bits/2) squared wraps to 0
    {DType::kI8, ReduceOp::kProd, 0x11, 0x0f, 0xff},  // prod(17, 15) = -1
    {DType::kU8, ReduceOp::kSum, 0xff, 0x01, 0x00},  // sum(255, 1) = 0  wraps
    {DType::kU8, ReduceOp::kProd, 0xff, 0x01, 0xff},  // prod(255, 1) = 255
    {DType::kU8, ReduceOp::kMin, 0xff, 0x01, 0x01},  // min(255, 1) = 1
    {DType::kU8, ReduceOp::kMax, 0xff, 0x01, 0xff},  // max(255, 1) = 255
    {DType::kU8, ReduceOp::kSum, 0x00, 0xff, 0xff},  // sum(0, 255) = 255
    {DType::kU8, ReduceOp::kProd, 0x00, 0xff, 0x00},  // prod(0, 255) = 0
    {DType::kU8, ReduceOp::kMin, 0x00, 0xff, 0x00},  // min(0, 255) = 0
    {DType::kU8, ReduceOp::kMax, 0x00, 0xff, 0xff},  // max(0, 255) = 255
    {DType::kU8, ReduceOp::kSum, 0xff, 0xff, 0xfe},  // sum(255, 255) = 254
    {DType::kU8, ReduceOp::kProd, 0xff, 0xff, 0x01},  // prod(255, 255) = 1
    {DType::kU8, ReduceOp::kMin, 0xff, 0xff, 0xff},  // min(255, 255) = 255
    {DType::kU8, ReduceOp::kMax, 0xff, 0xff, 0xff},  // max(255, 255) = 255
    {DType::kU8, ReduceOp::kSum, 0x02, 0x03, 0x05},  // sum(2, 3) = 5
    {DType::kU8, ReduceOp::kProd, 0x02, 0x03, 0x06},  // prod(2, 3) = 6
    {DType::kU8, ReduceOp::kMin, 0x02, 0x03, 0x02},  // min(2, 3) = 2
    {DType::kU8, ReduceOp::kMax, 0x02, 0x03, 0x03},  // max(2, 3) = 3
    {DType::kU8, ReduceOp::kSum, 0xff, 0x00, 0xff},  // sum(255, 0) = 255
    {DType::kU8, ReduceOp::kProd, 0xff, 0x00, 0x00},  // prod(255, 0) = 0
    {DType::kU8, ReduceOp::kMin, 0xff, 0x00, 0x00},  // min(255, 0) = 0
    {DType::kU8, ReduceOp::kMax, 0xff, 0x00, 0xff},  // max(255, 0) = 255
    {DType::kU8, ReduceOp::kSum, 0xfe, 0x02, 0x00},  // sum(254, 2) = 0
    {DType::kU8, ReduceOp::kProd, 0xfe, 0x02, 0xfc},  // prod(254, 2) = 252
    {DType::kU8, ReduceOp::kMin, 0xfe, 0x02, 0x02},  // min(254, 2) = 2
    {DType::kU8, ReduceOp::kMax, 0xfe, 0x02, 0xfe},  // max(254, 2) = 254
    {DType::kU8, ReduceOp::kProd, 0x10, 0x10, 0x00},  // prod(16, 16) = 0  2^(bits/2) squared wraps to 0
    {DType::kU8, ReduceOp::kProd, 0x11, 0x0f, 0xff},  // prod(17, 15) = 255
    {DType::kI32, ReduceOp::kSum, 0x7fffffff, 0x00000001, 0x80000000},  // sum(2147483647, 1) = -2147483648  wraps
    {DType::kI32, ReduceOp::kProd, 0x7fffffff, 0x00000001, 0x7fffffff},  // prod(2147483647, 1) = 2147483647
    {DType::kI32, ReduceOp::kMin, 0x7fffffff, 0x00000001, 0x00000001},  // min(2147483647, 1) = 1
    {DType::kI32, ReduceOp::kMax, 0x7fffffff, 0x00000001, 0x7fffffff},  // max(2147483647, 1) = 2147483647
    {DType::kI32, ReduceOp::kSum, 0x80000000, 0x7fffffff, 0xffffffff},  // sum(-2147483648, 2147483647) = -1
    {DType::kI32, ReduceOp::kProd, 0x80000000, 0x7fffffff, 0x80000000},  // prod(-2147483648, 2147483647) = -2147483648
    {DType::kI32, ReduceOp::kMin, 0x80000000, 0x7fffffff, 0x80000000},  // min(-2147483648, 2147483647) = -2147483648
    {DType::kI32, ReduceOp::kMax, 0x80000000, 0x7fffffff, 0x7fffffff},  // max(-2147483648, 2147483647) = 2147483647
    {DType::kI32, ReduceOp::kSum, 0x7fffffff, 0x7fffffff, 0xfffffffe},  // sum(2147483647, 2147483647) = -2
    {DType::kI32, ReduceOp::kProd, 0x7fffffff, 0x7fffffff, 0x00000001},  // prod(2147483647, 2147483647) = 1
    {DType::kI32, ReduceOp::kMin, 0x7fffffff, 0x7fffffff, 0x7fffffff},  // min(2147483647, 2147483647) = 2147483647
    {DType::kI32, ReduceOp::kMax, 0x7fffffff, 0x7fffffff, 0x7fffffff},  // max(2147483647, 2147483647) = 2147483647
    {DType::kI32, ReduceOp::kSum, 0x00000002, 0x00000003, 0x00000005},  // sum(2, 3) = 5
    {DType::kI32, ReduceOp::kProd, 0x00000002, 0x00000003, 0x00000006},  // prod(2, 3) = 6
    {DType::kI32, ReduceOp::kMin, 0x00000002, 0x00000003, 0x00000002},  // min(2, 3) = 2
    {DType::kI32, ReduceOp::kMax, 0x00000002, 0x00000003, 0x00000003},  // max(2, 3) = 3
    {DType::kI32, ReduceOp::kSum, 0x80000000, 0xffffffff, 0x7fffffff},  // sum(-2147483648, -1) = 2147483647
    {DType::kI32, ReduceOp::kProd, 0x80000000, 0xffffffff, 0x80000000},  // prod(-2147483648, -1) = -2147483648
    {DType::kI32, ReduceOp::kMin, 0x80000000, 0xffffffff, 0x80000000},  // min(-2147483648, -1) = -2147483648
    {DType::kI32, ReduceOp::kMax, 0x80000000, 0xffffffff, 0xffffffff},  // max(-2147483648, -1) = -1
    {DType::kI32, ReduceOp::kSum, 0xffffffff, 0x00000001, 0x00000000},  // sum(-1, 1) = 0
    {DType::kI32, ReduceOp::kProd, 0xffffffff, 0x00000001, 0xffffffff},  // prod(-1, 1) = -1
    {DType::kI32, ReduceOp::kMin, 0xffffffff, 0x00000001, 0xffffffff},  // min(-1, 1) = -1
    {DType::kI32, ReduceOp::kMax, 0xffffffff, 0x00000001, 0x00000001},  // max(-1, 1) = 1
    {DType::kI32, ReduceOp::kSum, 0x80000000, 0x80000000, 0x00000000},  // sum(-2147483648, -2147483648) = 0
    {DType::kI32, ReduceOp::kProd, 0x80000000, 0x80000000, 0x00000000},  // prod(-2147483648, -2147483648) = 0
    {DType::kI32, ReduceOp::kMin, 0x80000000, 0x80000000, 0x80000000},  // min(-2147483648, -2147483648) = -2147483648
    {DType::kI32, ReduceOp::kMax, 0x80000000, 0x80000000, 0x80000000},  // max(-2147483648, -2147483648) = -2147483648
    {DType::kI32, ReduceOp::kProd, 0xfffffffd, 0x00000005, 0xfffffff1},  // prod(-3, 5) = -15
    {DType::kI32, ReduceOp::kProd, 0x00010000, 0x00010000, 0x00000000},  // prod(65536, 65536) = 0  2^(bits/2) squared wraps to 0
    {DType::kI32, ReduceOp::kProd, 0x00010001, 0x0000ffff, 0xffffffff},  // prod(65537, 65535) = -1
    {DType::kU32, ReduceOp::kSum, 0xffffffff, 0x00000001, 0x00000000},  // sum(4294967295, 1) = 0  wraps
    {DType::kU32, ReduceOp::kProd, 0xffffffff, 0x00000001, 0xffffffff},  // prod(4294967295, 1) = 4294967295
    {DType::kU32, ReduceOp::kMin, 0xffffffff, 0x00000001, 0x00000001},  // min(4294967295, 1) = 1
    {DType::kU32, ReduceOp::kMax, 0xffffffff, 0x00000001, 0xffffffff},  // max(4294967295, 1) = 4294967295
    {DType::kU32, ReduceOp::kSum, 0x00000000, 0xffffffff, 0xffffffff},  // sum(0, 4294967295) = 4294967295
    {DType::kU32, ReduceOp::kProd, 0x00000000, 0xffffffff, 0x00000000},  // prod(0, 4294967295) = 0
    {DType::kU32, ReduceOp::kMin, 0x00000000, 0xffffffff, 0x00000000},  // min(0, 4294967295) = 0
    {DType::kU32, ReduceOp::kMax, 0x00000000, 0xffffffff, 0xffffffff},  // max(0, 4294967295) = 4294967295
    {DType::kU32, ReduceOp::kSum, 0xffffffff, 0xffffffff, 0xfffffffe},  // sum(4294967295, 4294967295) = 4294967294
    {DType::kU32, ReduceOp::kProd, 0xffffffff, 0xffffffff, 0x00000001},  // prod(4294967295, 4294967295) = 1
    {DType::kU32, ReduceOp::kMin, 0xffffffff, 0xffffffff, 0xffffffff},  // min(4294967295, 4294967295) = 4294967295
    {DType::kU32, ReduceOp::kMax, 0xffffffff, 0xffffffff, 0xffffffff},  // max(4294967295, 4294967295) = 4294967295
    {DType::kU32, ReduceOp::kSum, 0x00000002, 0x00000003, 0x00000005},  // sum(2, 3) = 5
    {DType::kU32, ReduceOp::kProd, 0x00000002, 0x00000003, 0x00000006},  // prod(2, 3) = 6
    {DType::kU32, ReduceOp::kMin, 0x00000002, 0x00000003, 0x00000002},  // min(2, 3) = 2
    {DType::kU32, ReduceOp::kMax, 0x00000002, 0x00000003, 0x00000003},  // max(2, 3) = 3
    {DType::kU32, ReduceOp::kSum, 0xffffffff, 0x00000000, 0xffffffff},  // sum(4294967295, 0) = 4294967295
    {DType::kU32, ReduceOp::kProd, 0xffffffff, 0x00000000, 0x00000000},  // prod(4294967295, 0) = 0
    {DType::kU32, ReduceOp::kMin, 0xffffffff, 0x00000000, 0x00000000},  // min(4294967295, 0) = 0
    {DType::kU32, ReduceOp::kMax, 0xffffffff, 0x00000000, 0xffffffff},  // max(4294967295, 0) = 4294967295
    {DType::kU32, ReduceOp::kSum, 0xfffffffe, 0x00000002, 0x00000000},  // sum(4294967294, 2) = 0
    {DType::kU32, ReduceOp::kProd, 0xfffffffe, 0x00000002, 0xfffffffc},  // prod(4294967294, 2) = 4294967292
    {DType::kU32, ReduceOp::kMin, 0xfffffffe, 0x00000002, 0x00000002},  // min(4294967294, 2) = 2
    {DType::kU32, ReduceOp::kMax, 0xfffffffe, 0x00000002, 0xfffffffe},  // max(4294967294, 2) = 4294967294
    {DType::kU32, ReduceOp::kProd, 0x00010000, 0x00010000, 0x00000000},  // prod(65536, 65536) = 0  2^(bits/2) squared wraps to 0
    {DType::kU32, ReduceOp::kProd, 0x00010001, 0x0000ffff, 0xffffffff},  // prod(65537, 65535) = 4294967295
    {DType::kI64, ReduceOp::kSum, 0x7fffffffffffffff, 0x0000000000000001, 0x8000000000000000},  // sum(9223372036854775807, 1) = -9223372036854775808  wraps
    {DType::kI64, ReduceOp::kProd, 0x7fffffffffffffff, 0x0000000000000001, 0x7fffffffffffffff},  // prod(9223372036854775807, 1) = 9223372036854775807
    {DType::kI64, ReduceOp::kMin, 0x7fffffffffffffff, 0x0000000000000001, 0x0000000000000001},  // min(9223372036854775807, 1) = 1
    {DType::kI64, ReduceOp::kMax, 0x7fffffffffffffff, 0x0000000000000001, 0x7fffffffffffffff},  // max(9223372036854775807, 1) = 9223372036854775807
    {DType::kI64, ReduceOp::kSum, 0x8000000000000000, 0x7fffffffffffffff, 0xffffffffffffffff},  // sum(-9223372036854775808, 9223372036854775807) = -1
    {DType::kI64, ReduceOp::kProd, 0x8000000000000000, 0x7fffffffffffffff, 0x8000000000000000},  // prod(-9223372036854775808, 9223372036854775807) = -9223372036854775808
    {DType::kI64, ReduceOp::kMin, 0x8000000000000000, 0x7fffffffffffffff, 0x8000000000000000},  // min(-9223372036854775808, 9223372036854775807) = -9223372036854775808
    {DType::kI64, ReduceOp::kMax, 0x8000000000000000, 0x7fffffffffffffff, 0x7fffffffffffffff},  // max(-9223372036854775808, 9223372036854775807) = 9223372036854775807
    {DType::kI64, ReduceOp::kSum, 0x7fffffffffffffff, 0x7fffffffffffffff, 0xfffffffffffffffe},  // sum(9223372036854775807, 9223372036854775807) = -2
    {DType::kI64, ReduceOp::kProd, 0x7fffffffffffffff, 0x7fffffffffffffff, 0x0000000000000001},  // prod(9223372036854775807, 9223372036854775807) = 1
    {DType::kI64, ReduceOp::kMin, 0x7fffffffffffffff, 0x7fffffffffffffff, 0x7fffffffffffffff},  // min(9223372036854775807, 9223372036854775807) = 9223372036854775807
    {DType::kI64, ReduceOp::kMax, 0x7fffffffffffffff, 0x7fffffffffffffff, 0x7fffffffffffffff},  // max(9223372036854775807, 9223372036854775807) = 9223372036854775807
    {DType::kI64, ReduceOp::kSum, 0x0000000000000002, 0x0000000000000003, 0x0000000000000005},  // sum(2, 3) = 5
    {DType::kI64, ReduceOp::kProd, 0x0000000000000002, 0x0000000000000003, 0x0000000000000006},  // prod(2, 3) = 6
    {DType::kI64, ReduceOp::kMin, 0x0000000000000002, 0x0000000000000003, 0x0000000000000002},  // min(2, 3) = 2
    {DType::kI64, ReduceOp::kMax, 0x0000000000000002, 0x0000000000000003, 0x0000000000000003},  // max(2, 3) = 3
    {DType::kI64, ReduceOp::kSum, 0x8000000000000000, 0xffffffffffffffff, 0x7fffffffffffffff},  // sum(-9223372036854775808, -1) = 9223372036854775807
    {DType::kI64, ReduceOp::kProd, 0x8000000000000000, 0xffffffffffffffff, 0x8000000000000000},  // prod(-9223372036854775808, -1) = -9223372036854775808
    {DType::kI64, ReduceOp::kMin, 0x8000000000000000, 0xffffffffffffffff, 0x8000000000000000},  // min(-9223372036854775808, -1) = -9223372036854775808
    {DType::kI64, ReduceOp::kMax, 0x8000000000000000, 0xffffffffffffffff, 0xffffffffffffffff},  // max(-9223372036854775808, -1) = -1
    {DType::kI64, ReduceOp::kSum, 0xffffffffffffffff, 0x0000000000000001, 0x0000000000000000},  // sum(-1, 1) = 0
    {DType::kI64, ReduceOp::kProd, 0xffffffffffffffff, 0x0000000000000001, 0xffffffffffffffff},  // prod(-1, 1) = -1
    {DType::kI64, ReduceOp::kMin, 0xffffffffffffffff, 0x0000000000000001, 0xffffffffffffffff},  // min(-1, 1) = -1
    {DType::kI64, ReduceOp::kMax, 0xffffffffffffffff, 0x0000000000000001, 0x0000000000000001},  // max(-1, 1) = 1
    {DType::kI64, ReduceOp::kSum, 0x8000000000000000, 0x8000000000000000, 0x0000000000000000},  // sum(-9223372036854775808, -9223372036854775808) = 0
    {DType::kI64, ReduceOp::kProd, 0x8000000000000000, 0x8000000000000000, 0x0000000000000000},  // prod(-9223372036854775808, -9223372036854775808) = 0
    {DType::kI64, ReduceOp::kMin, 0x8000000000000000, 0x8000000000000000, 0x8000000000000000},  // min(-9223372036854775808, -9223372036854775808) = -9223372036854775808
    {DType::kI64, ReduceOp::kMax, 0x8000000000000000, 0x8000000000000000, 0x8000000000000000},  // max(-9223372036854775808, -9223372036854775808) = -9223372036854775808
    {DType::kI64, ReduceOp::kProd, 0xfffffffffffffffd, 0x0000000000000005, 0xfffffffffffffff1},  // prod(-3, 5) = -15
    {DType::kI64, ReduceOp::kProd, 0x0000000100000000, 0x0000000100000000, 0x0000000000000000},  // prod(4294967296, 4294967296) = 0  2^(bits/2) squared wraps to 0
    {DType::kI64, ReduceOp::kProd, 0x0000000100000001, 0x00000000ffffffff, 0xffffffffffffffff},  // prod(4294967297, 4294967295) = -1
    {DType::kU64, ReduceOp::kSum, 0xffffffffffffffff, 0x0000000000000001, 0x0000000000000000},  // sum(18446744073709551615, 1) = 0  wraps
    {DType::kU64, ReduceOp::kProd, 0xffffffffffffffff, 0x0000000000000001, 0xffffffffffffffff},  // prod(18446744073709551615, 1) = 18446744073709551615
    {DType::kU64, ReduceOp::kMin, 0xffffffffffffffff, 0x0000000000000001, 0x0000000000000001},  // min(18446744073709551615, 1) = 1
    {DType::kU64, ReduceOp::kMax, 0xffffffffffffffff, 0x0000000000000001, 0xffffffffffffffff},  // max(18446744073709551615, 1) = 18446744073709551615
    {DType::kU64, ReduceOp::kSum, 0x0000000000000000, 0xffffffffffffffff, 0xffffffffffffffff},  // sum(0, 18446744073709551615) = 18446744073709551615
    {DType::kU64, ReduceOp::kProd, 0x0000000000000000, 0xffffffffffffffff, 0x0000000000000000},  // prod(0, 18446744073709551615) = 0
    {DType::kU64, ReduceOp::kMin, 0x0000000000000000, 0xffffffffffffffff, 0x0000000000000000},  // min(0, 18446744073709551615) = 0
    {DType::kU64, ReduceOp::kMax, 0x0000000000000000, 0xffffffffffffffff, 0xffffffffffffffff},  // max(0, 18446744073709551615) = 18446744073709551615
    {DType::kU64, ReduceOp::kSum, 0xffffffffffffffff, 0xffffffffffffffff, 0xfffffffffffffffe},  // sum(18446744073709551615, 18446744073709551615) = 18446744073709551614
    {DType::kU64, ReduceOp::kProd, 0xffffffffffffffff, 0xffffffffffffffff, 0x0000000000000001},  // prod(18446744073709551615, 18446744073709551615) = 1
    {DType::kU64, ReduceOp::kMin, 0xffffffffffffffff, 0xffffffffffffffff, 0xffffffffffffffff},  // min(18446744073709551615, 18446744073709551615) = 18446744073709551615
    {DType::kU64, ReduceOp::kMax, 0xffffffffffffffff, 0xffffffffffffffff, 0xffffffffffffffff},  // max(18446744073709551615, 18446744073709551615) = 18446744073709551615
    {DType::kU64, ReduceOp::kSum, 0x0000000000000002, 0x0000000000000003, 0x0000000000000005},  // sum(2, 3) = 5
    {DType::kU64, ReduceOp::kProd, 0x0000000000000002, 0x0000000000000003, 0x0000000000000006},  // prod(2, 3) = 6
    {DType::kU64, ReduceOp::kMin, 0x0000000000000002, 0x0000000000000003, 0x0000000000000002},  // min(2, 3) = 2
    {DType::kU64, ReduceOp::kMax, 0x0000000000000002, 0x0000000000000003, 0x0000000000000003},  // max(2, 3) = 3
    {DType::kU64, ReduceOp::kSum, 0xffffffffffffffff, 0x0000000000000000, 0xffffffffffffffff},  // sum(18446744073709551615, 0) = 18446744073709551615
    {DType::kU64, ReduceOp::kProd, 0xffffffffffffffff, 0x0000000000000000, 0x0000000000000000},  // prod(18446744073709551615, 0) = 0
    {DType::kU64, ReduceOp::kMin, 0xffffffffffffffff, 0x0000000000000000, 0x0000000000000000},  // min(18446744073709551615, 0) = 0
    {DType::kU64, ReduceOp::kMax, 0xffffffffffffffff, 0x0000000000000000, 0xffffffffffffffff},  // max(18446744073709551615, 0) = 18446744073709551615
    {DType::kU64, ReduceOp::kSum, 0xfffffffffffffffe, 0x0000000000000002, 0x0000000000000000},  // sum(18446744073709551614, 2) = 0
    {DType::kU64, ReduceOp::kProd, 0xfffffffffffffffe, 0x0000000000000002, 0xfffffffffffffffc},  // prod(18446744073709551614, 2) = 18446744073709551612
    {DType::kU64, ReduceOp::kMin, 0xfffffffffffffffe, 0x0000000000000002, 0x0000000000000002},  // min(18446744073709551614, 2) = 2
    {DType::kU64, ReduceOp::kMax, 0xfffffffffffffffe, 0x0000000000000002, 0xfffffffffffffffe},  // max(18446744073709551614, 2) = 18446744073709551614
    {DType::kU64, ReduceOp::kProd, 0x0000000100000000, 0x0000000100000000, 0x0000000000000000},  // prod(4294967296, 4294967296) = 0  2^(bits/2) squared wraps to 0
    {DType::kU64, ReduceOp::kProd, 0x0000000100000001, 0x00000000ffffffff, 0xffffffffffffffff},  // prod(4294967297, 4294967295) = 18446744073709551615
};
// clang-format on

// Every kKnown row through every entry point: reduce into a fresh buffer, reduce_into, out
// aliasing b, out aliasing both (checked against a single-element reduce), and a long run of
// the same pair at a misaligned offset so the vector loop (not only the scalar tail) sees it.
void test_known() {
  for (const Known& k : kKnown) {
    const DType t = k.t;
    const size_t sz = dtype_size(t);
    const std::string what = label(t, k.op, k.a, k.b);
    const bool want_nan = is_nan(t, k.want);
    auto matches = [&](uint64_t got) { return want_nan ? is_nan(t, got) : got == k.want; };

    std::vector<uint8_t> a(sz), b(sz), out(sz, 0xA5);
    put(t, a, 0, k.a);
    put(t, b, 0, k.b);
    reduce(t, k.op, out.data(), a.data(), b.data(), 1);
    check(matches(get(t, out, 0)), what + ": reduce gave " + hex(get(t, out, 0)) + ", XLA " + hex(k.want));
    check(get(t, a, 0) == k.a && get(t, b, 0) == k.b, what + ": reduce modified an input");

    std::vector<uint8_t> acc = a;
    reduce_into(t, k.op, acc.data(), b.data(), 1);
    check(matches(get(t, acc, 0)), what + ": reduce_into gave " + hex(get(t, acc, 0)));
    check(get(t, acc, 0) == get(t, out, 0), what + ": reduce_into and reduce differ");

    std::vector<uint8_t> bb = b;  // out == b: still a (op) b, a on the left
    reduce(t, k.op, bb.data(), a.data(), bb.data(), 1);
    check(get(t, bb, 0) == get(t, out, 0), what + ": out aliasing b gave " + hex(get(t, bb, 0)));

    const size_t n = 300, off = 3;  // 300 elements: blocks of the vector loop plus a tail
    std::vector<uint8_t> va(n * sz + off), vb(n * sz + off), vo(n * sz + off);
    for (size_t i = 0; i < n; ++i) {
      put(t, va, i, k.a, off);
      put(t, vb, i, k.b, off);
    }
    reduce(t, k.op, vo.data() + off, va.data() + off, vb.data() + off, n);
    reduce_into(t, k.op, va.data() + off, vb.data() + off, n);
    bool all = true;
    for (size_t i = 0; i < n; ++i) {
      all = all && get(t, vo, i, off) == get(t, out, 0) && get(t, va, i, off) == get(t, out, 0);
    }
    check(all, what + ": 300 misaligned elements differ from the single-element result");
  }
  std::printf("known answers: %zu rows\n", sizeof(kKnown) / sizeof(kKnown[0]));
}

// bool: bytes, any nonzero is true, 0/1 written. sum = max = OR, prod = min = AND. (jax:
// lax.max/min on bool are OR/AND; lax.psum on bool promotes to int32 and counts instead.)
void test_bool() {
  const uint8_t vals[] = {0, 1, 2, 0x80, 0xFF};
  for (ReduceOp op : kAllOps) {
    for (uint8_t x : vals) {
      for (uint8_t y : vals) {
        const bool or_op = op == ReduceOp::kSum || op == ReduceOp::kMax;
        const uint8_t want = or_op ? ((x || y) ? 1 : 0) : ((x && y) ? 1 : 0);
        uint8_t out = 0x55, acc = x;
        reduce(DType::kBool, op, &out, &x, &y, 1);
        reduce_into(DType::kBool, op, &acc, &y, 1);
        check(out == want && acc == want, label(DType::kBool, op, x, y) + ": got " + std::to_string(out) + "/" +
                                              std::to_string(acc) + ", want " + std::to_string(want));
      }
    }
  }
}

void test_names() {
  const char* names[] = {"float32", "float64", "float16", "bfloat16", "int8", "uint8",
                         "int32",   "uint32",  "int64",   "uint64",   "bool"};
  const size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 4, 8, 8, 1};
  for (int i = 0; i < 11; ++i) {
    const DType t = kAllTypes[i];
    check(static_cast<int>(t) == i, std::string("enum value of ") + names[i]);
    check(dtype_size(t) == sizes[i], std::string("dtype_size ") + names[i]);
    check(std::string(dtype_name(t)) == names[i], std::string("dtype_name ") + names[i]);
    DType parsed = DType::kBool;
    check(parse_dtype(names[i], &parsed) && parsed == t, std::string("parse_dtype ") + names[i]);
  }
  DType keep = DType::kI8;
  for (const char* bad : {"", "float", "Float32", "float32 ", "fp32", "int16", "complex64"}) {
    check(!parse_dtype(bad, &keep) && keep == DType::kI8, std::string("parse_dtype rejects '") + bad + "'");
  }
  check(std::string(reduce_op_name(ReduceOp::kSum)) == "sum", "reduce_op_name sum");
  check(std::string(reduce_op_name(ReduceOp::kProd)) == "prod", "reduce_op_name prod");
  check(std::string(reduce_op_name(ReduceOp::kMin)) == "min", "reduce_op_name min");
  check(std::string(reduce_op_name(ReduceOp::kMax)) == "max", "reduce_op_name max");
  check(dtype_size(static_cast<DType>(99)) == 0, "dtype_size of an unknown dtype is 0");
}

// Random bit patterns (NaNs with payloads, subnormals, everything) for every dtype and op.
// Reference: one reduce() call per element (the scalar tail). Every other way of running
// the same reduction must give the same bits, NaN payloads included: reduce over the whole
// buffer (vector loop), reduce_into, out aliasing b, misaligned buffers, and, where the CPU has
// AVX2, the baseline kernels against the AVX2 ones.
std::vector<uint8_t> random_buffer(DType t, size_t n) {
  std::vector<uint8_t> v(n * dtype_size(t));
  for (auto& x : v) x = static_cast<uint8_t>(rnd());
  if (t == DType::kBool) {
    for (auto& x : v) x = (x & 3) == 0 ? 0 : x;  // plenty of false
  }
  return v;
}

std::vector<uint8_t> run_whole(DType t, ReduceOp op, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                               size_t n, int mode, size_t off) {
  const size_t sz = dtype_size(t);
  std::vector<uint8_t> A(n * sz + off), Bv(n * sz + off), O(n * sz + off, 0xCC);
  std::memcpy(A.data() + off, a.data(), n * sz);
  std::memcpy(Bv.data() + off, b.data(), n * sz);
  switch (mode) {
    case 0: reduce(t, op, O.data() + off, A.data() + off, Bv.data() + off, n); break;
    case 1: reduce_into(t, op, A.data() + off, Bv.data() + off, n); O = A; break;
    case 2: reduce(t, op, Bv.data() + off, A.data() + off, Bv.data() + off, n); O = Bv; break;
    default: reduce(t, op, A.data() + off, A.data() + off, Bv.data() + off, n); O = A; break;
  }
  return std::vector<uint8_t>(O.begin() + static_cast<long>(off), O.begin() + static_cast<long>(off + n * sz));
}

void test_consistency(bool baseline) {
  const size_t counts[] = {1, 2, 7, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4099};
  for (DType t : kAllTypes) {
    const size_t sz = dtype_size(t);
    for (ReduceOp op : kAllOps) {
      for (size_t n : counts) {
        auto a = random_buffer(t, n);
        auto b = random_buffer(t, n);
        for (size_t i = 0; i < n; i += 5) std::memcpy(&b[i * sz], &a[i * sz], sz);  // equal pairs
        for (size_t i = 3; i < n; i += 11) std::memset(&a[i * sz], 0, sz);         // zeros
        std::vector<uint8_t> ref(n * sz);
        for (size_t i = 0; i < n; ++i) reduce(t, op, &ref[i * sz], &a[i * sz], &b[i * sz], 1);
        for (int mode = 0; mode < 4; ++mode) {
          for (size_t off : {size_t(0), size_t(1), size_t(5)}) {
            const auto got = run_whole(t, op, a, b, n, mode, off);
            if (got != ref) {
              size_t i = 0;
              while (i < n && std::memcmp(&got[i * sz], &ref[i * sz], sz) == 0) ++i;
              check(false, label(t, op) + (baseline ? " [baseline]" : "") + " count " + std::to_string(n) + " mode " +
                               std::to_string(mode) + " offset " + std::to_string(off) + ": element " +
                               std::to_string(i) + " differs from the single-element result");
            }
          }
        }
      }
    }
  }
}

// The baseline (SSE2) and AVX2 kernels on one large random buffer per dtype and op.
void test_isa_agreement() {
  const size_t n = 10007;
  for (DType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      const auto a = random_buffer(t, n), b = random_buffer(t, n);
      reduce_force_baseline_for_testing(true);
      const auto base = run_whole(t, op, a, b, n, 0, 0);
      reduce_force_baseline_for_testing(false);
      const auto fast = run_whole(t, op, a, b, n, 0, 0);
      check(base == fast, label(t, op) + ": baseline and AVX2 kernels differ");
    }
  }
}

// out == a == b: x (op) x.
void test_self_alias() {
  for (DType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      const size_t n = 300, sz = dtype_size(t);
      auto x = random_buffer(t, n);
      std::vector<uint8_t> want(n * sz);
      reduce(t, op, want.data(), x.data(), x.data(), n);  // a == b, out separate
      reduce(t, op, x.data(), x.data(), x.data(), n);
      check(x == want, label(t, op) + ": out == a == b");
    }
  }
}

void test_count_zero() {
  for (DType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      reduce(t, op, nullptr, nullptr, nullptr, 0);
      reduce_into(t, op, nullptr, nullptr, 0);
      std::vector<uint8_t> a(16, 0x11), b(16, 0x22), o(16, 0x33);
      reduce(t, op, o.data(), a.data(), b.data(), 0);
      reduce_into(t, op, a.data(), b.data(), 0);
      check(o == std::vector<uint8_t>(16, 0x33) && a == std::vector<uint8_t>(16, 0x11),
            label(t, op) + ": count 0 wrote something");
    }
  }
}

// Only the requested elements are written: the bytes around a 37-element reduction stay.
void test_bounds() {
  for (DType t : kAllTypes) {
    const size_t n = 37, sz = dtype_size(t), pad = 16;
    std::vector<uint8_t> a(n * sz + 2 * pad, 0x01), b(n * sz + 2 * pad, 0x01), o(n * sz + 2 * pad, 0x77);
    reduce(t, ReduceOp::kSum, o.data() + pad, a.data() + pad, b.data() + pad, n);
    bool ok = true;
    for (size_t i = 0; i < pad; ++i) ok = ok && o[i] == 0x77 && o[o.size() - 1 - i] == 0x77;
    check(ok, std::string(dtype_name(t)) + ": reduce wrote outside [out, out + count)");
  }
}

}  // namespace

int main() {
  test_names();
  test_known();
  test_bool();
  test_count_zero();
  test_bounds();
  test_self_alias();
  const bool has_avx2 = reduce_force_baseline_for_testing(false);
  test_consistency(false);
  if (has_avx2) {
    reduce_force_baseline_for_testing(true);
    test_known();
    test_consistency(true);
    reduce_force_baseline_for_testing(false);
    test_isa_agreement();
  } else {
    std::printf("no AVX2 kernels on this machine: only the baseline ones were tested\n");
  }
  return checks_passed("test_reduce");
}
