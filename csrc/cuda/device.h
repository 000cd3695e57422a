// One GPU as the chunk pipeline uses it: two copy streams of our own (device -> host and
// host -> device, so both copy engines run at once), the events that order them against
// XLA's stream, and the GPU's pinned staging pool. Created on first use, kept for the
// process. Plus the CopyEngine over them. Knows CUDA; nothing of XLA or sockets.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/config.h"
#include "stage/copy_engine.h"
#include "stage/pool.h"

namespace r2ccl::cuda {

// Throws r2ccl::Error (cause device) naming the call when `st` is not cudaSuccess.
void check(cudaError_t st, const char* what);

struct Device {
  int ordinal = -1;
  cudaStream_t to_host = nullptr, to_device = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  std::unique_ptr<stage::StagingPool> pool;
  int32_t* scalars = nullptr;   // pinned: the group and rank operands, read per call
  std::mutex busy;              // one collective per GPU at a time (XLA's launch thread blocks in it)
  // The device fold (leader of a process's local GPUs): its accumulator, and a landing place
  // for a peer's chunk when there is no peer access; grown on demand, kept.
  void* fold_acc = nullptr;
  void* fold_peer = nullptr;
  size_t fold_bytes = 0;
  std::map<int, bool> peer_access;   // peer ordinal -> this GPU reads it directly
};

// The GPU's resources (made on first use with `cfg`'s staging bound); throws Error.
Device& device_state(int ordinal, const Config& cfg);
// The GPU a device pointer lives on; throws Error.
int device_of(const void* p);

// A CopyEngine on `dev` ordered against `xla_stream`.
std::unique_ptr<stage::CopyEngine> copy_engine(Device& dev, cudaStream_t xla_stream);

// Page-locked host memory (cudaHostAlloc, portable across GPUs).
std::unique_ptr<stage::Allocator> pinned_allocator();

}  // namespace r2ccl::cuda
