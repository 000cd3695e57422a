// The CUDA part's Python entry points when it is not built.
#include "base/error.h"
#include "cuda/api.h"

namespace r2ccl::cuda {

namespace {
const char* kAbsent = "this build of jax_r2ccl has no CUDA part (R2CCL_CUDA=off or no CUDA toolkit at build time)";
}

std::string testing_reduce(coll::DType, coll::ReduceOp, void*, const void*, const void*, size_t, int) {
  return kAbsent;
}

std::vector<std::string> prepare(const std::vector<int>&, const Config&) { throw Error(Cause::kDevice, -1, kAbsent); }

std::vector<BenchRow> bench(uint64_t, int, int, uint64_t) { throw Error(Cause::kDevice, -1, kAbsent); }

}  // namespace r2ccl::cuda
