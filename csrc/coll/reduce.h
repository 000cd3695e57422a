// Elementwise reduction kernels for the collectives: acc (op) src over a buffer, per dtype,
// with results bit-identical to XLA CPU's lax.add/mul/max/min on the same two operands.
// Pure computation; knows nothing of sockets, rails or JAX.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace r2ccl::coll {

enum class DType : int { kF32 = 0, kF64, kF16, kBF16, kI8, kU8, kI32, kU32, kI64, kU64, kBool };
enum class ReduceOp : int { kSum = 0, kProd, kMin, kMax };

size_t dtype_size(DType t);
const char* dtype_name(DType t);          // "float32", "float64", "float16", "bfloat16", "int8", "uint8",
                                          // "int32", "uint32", "int64", "uint64", "bool"
const char* reduce_op_name(ReduceOp op);  // "sum", "prod", "min", "max"
bool parse_dtype(const std::string& name, DType* out);  // inverse of dtype_name

// acc[i] = acc[i] (op) src[i] for i < count, in the element type (acc on the left).
//
// Semantics (checked bit for bit against XLA CPU, see reduce.cc):
//   float32/float64: one IEEE operation in that type, round-to-nearest-even.
//     max/min are IEEE 754-2019 maximum/minimum: NaN if either operand is NaN,
//     and -0.0 < +0.0 (max(-0, +0) = +0, min(-0, +0) = -0 in either order).
//   float16/bfloat16: both operands widened exactly to float32, the float32 operation,
//     rounded back to nearest-even (overflow to inf, NaN stays NaN).
//   integers: sum and prod wrap modulo 2^bits; min/max as usual.
//   bool (any nonzero byte is true, 0/1 written): sum = max = OR, prod = min = AND.
// NaN payloads: when both operands are NaN the left one's is kept for min/max; for sum/prod
// the payload is whatever the hardware gives (deterministic for one binary, not specified).
void reduce_into(DType t, ReduceOp op, void* acc, const void* src, size_t count);

// out[i] = a[i] (op) b[i]; out may alias a (or b) exactly; no partial overlap.
void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count);

}  // namespace r2ccl::coll
