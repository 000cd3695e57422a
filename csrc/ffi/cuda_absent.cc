// The CUDA entry points when the CUDA part is not built (R2CCL_CUDA=off, or no toolkit).
#include "ffi/handlers.h"

namespace r2ccl::ffi {

void* collective_cuda_handler() { return nullptr; }

CudaInfo cuda_info() {
  CudaInfo i;
  i.error = "this build of jax_r2ccl has no CUDA part (built with R2CCL_CUDA=off or without a CUDA toolkit)";
  return i;
}

}  // namespace r2ccl::ffi
