// Elementwise reduction kernels for the collectives: acc (op) src over a buffer, per dtype,
// with results bit-identical to XLA CPU's lax.add/mul/max/min (NaN payloads aside).
// Pure computation; knows nothing of sockets, rails or JAX.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

namespace r2ccl::coll {

enum class DType : int { kF32 = 0, kF64, kF16, kBF16, kI8, kU8, kI32, kU32, kI64, kU64, kBool };
enum class ReduceOp : int { kSum = 0, kProd, kMin, kMax };

// The names in enum order (numpy's dtype names; jax.lax's reductions): the one list of each,
// exported by _core.names(). The FFI attribute `reduce_op` is the index into kReduceOpNames.
inline constexpr const char* kDTypeNames[] = {"float32", "float64", "float16", "bfloat16", "int8", "uint8",
                                              "int32",   "uint32",  "int64",   "uint64",   "bool"};
inline constexpr const char* kReduceOpNames[] = {"sum", "prod", "min", "max"};
static_assert(std::size(kDTypeNames) == static_cast<size_t>(DType::kBool) + 1, "a DType without a name");
static_assert(std::size(kReduceOpNames) == static_cast<size_t>(ReduceOp::kMax) + 1, "a ReduceOp without a name");

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* reduce_op_name(ReduceOp op);
bool parse_dtype(const std::string& name, DType* out);        // inverse of dtype_name
bool parse_reduce_op(const std::string& name, ReduceOp* out);  // inverse of reduce_op_name

// acc[i] = acc[i] (op) src[i] for i < count, in the element type (acc on the left).
//
// Semantics: those of XLA CPU's lax.add/mul/min/max on the same two operands, checked bit for
// bit against jax (details and measurements at the top of reduce.cc):
//   float32/float64: one IEEE operation, round to nearest even, with XLA CPU's flush of
//     subnormals: a subnormal operand reads as a zero of its sign, a tiny result (x86's rule,
//     tininess after rounding) becomes a zero of its sign.
//   bfloat16: both operands widened to float32 exactly, the float32 operation as above, rounded
//     back to nearest even (overflow to inf, NaN stays NaN). float16: the same; no flush
//     happens there (float16 subnormals are float32 normals), so float16 subnormals survive.
//   max/min: IEEE 754-2019 maximum/minimum: NaN if either operand is NaN (the left one's bits
//     when it is NaN), and -0 < +0 (max(-0, +0) = +0, min(-0, +0) = -0, in either order).
//   integers: sum and prod wrap modulo 2^bits; min/max as usual.
//   bool (any nonzero byte is true, 0 or 1 written): sum = max = OR, prod = min = AND. Note:
//     jax.lax.psum on bool promotes to int32 and counts; pmax/pmin are OR/AND.
// NaN results are fully determined by the operands (no dependence on the code path or CPU
// features), but their payloads are not promised to equal XLA's.
// count == 0 touches nothing (the pointers may be null). Buffers need no alignment. A dtype
// or op outside the enums does nothing (callers validate what they read off the wire).
void reduce_into(DType t, ReduceOp op, void* acc, const void* src, size_t count);

// out[i] = a[i] (op) b[i]; out may alias a or b (or both) exactly; no partial overlap.
void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count);

}  // namespace r2ccl::coll
