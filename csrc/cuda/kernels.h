// CUDA kernels of the reductions: the same element operations as the host (coll/reduce_ops.h,
// compiled __host__ __device__), so a GPU folds to the same bits as the CPU, subnormal
// flushing and NaN/zero ordering included. Knows CUDA; nothing of XLA or sockets.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "coll/reduce.h"

namespace r2ccl::cuda {

// out[i] = a[i] (op) b[i] for i < count, queued on `stream`. Device pointers (b may live on a
// peer GPU when peer access is enabled); out may equal a or b. Returns the launch status
// (cudaErrorInvalidValue for a dtype or op outside the enums).
cudaError_t reduce(coll::DType t, coll::ReduceOp op, void* out, const void* a, const void* b, size_t count,
                   cudaStream_t stream);

// The same over `rows` runs of `width` elements: run r of out / a / b starts at r * its pitch
// (in elements). rows == 1 is reduce().
cudaError_t reduce_2d(coll::DType t, coll::ReduceOp op, void* out, size_t out_pitch, const void* a, size_t a_pitch,
                      const void* b, size_t b_pitch, size_t width, size_t rows, cudaStream_t stream);

}  // namespace r2ccl::cuda
