// What the Python bindings may call in the CUDA part, in types that need no CUDA header (the
// bindings build with or without CUDA; api_absent.cc answers when the part is not built).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coll/reduce.h"

namespace r2ccl {
struct Config;
}

namespace r2ccl::cuda {

// Makes each GPU's resources now (streams, events, the pinned staging pool with its slots),
// outside any collective: jax_r2ccl.initialize() calls it for the process's GPUs. Returns a
// line per GPU (what was made), or throws r2ccl::Error.
std::vector<std::string> prepare(const std::vector<int>& ordinals, const Config& cfg);

// Testing: out = a (op) b for `count` elements, computed by the CUDA kernel on `device`
// (host buffers in and out). Returns empty, or why it could not run.
std::string testing_reduce(coll::DType t, coll::ReduceOp op, void* out, const void* a, const void* b, size_t count,
                           int device);

// One row of the GPU check's table: our path's rate beside its baseline's, in the same run.
struct BenchRow {
  std::string what, baseline;
  uint64_t bytes = 0;
  double seconds = 0, baseline_seconds = 0;   // median per iteration
  double gbps = 0, baseline_gbps = 0;         // bytes moved (or touched) per second / 1e9
};

// On `device`, `iters` times each: staging copies D2H and H2D through the copy engine and a
// pinned pool in `chunk_bytes` steps, beside one cudaMemcpyAsync of the same bytes to pinned
// memory; the reduction kernel (float32 and bfloat16 sum, out = a + b) beside a
// device-to-device copy, both as bytes touched per second. Throws r2ccl::Error.
std::vector<BenchRow> bench(uint64_t bytes, int iters, int device, uint64_t chunk_bytes);

}  // namespace r2ccl::cuda
