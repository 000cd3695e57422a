// One GPU as the chunk pipeline uses it: two copy streams of our own (device -> host and
// host -> device, so both copy engines run at once), the events that order them against
// XLA's stream, and the GPU's pinned staging pool (its slots and its small area). Made by
// prepare() when jax_r2ccl.initialize() runs on a GPU process (else on first use), kept for
// the process; its pinned memory is never freed while the process runs (cudaFreeHost would
// synchronise the device). Plus the CopyEngine over them. Knows CUDA; nothing of XLA or sockets.
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
  cudaEvent_t small_written = nullptr;   // after the last small call's result copy (write_later)
  bool small_pending = false;            // that event was recorded
  std::unique_ptr<stage::StagingPool> pool;   // pinned; its small area's head holds the group and rank
  std::mutex busy;              // one collective per GPU at a time (XLA's launch thread blocks in it)
  // The device fold (leader of a process's local GPUs): its accumulator, and a landing place
  // for a peer's chunk when there is no peer access; grown on demand, kept.
  void* fold_acc = nullptr;
  void* fold_peer = nullptr;
  size_t fold_bytes = 0;
  std::map<int, bool> peer_access;   // peer ordinal -> this GPU reads it directly
};

// The GPU's resources (made on first use with `cfg`'s staging settings: the pool's slots
// are allocated then); throws Error. Leaves the current device as it found it.
Device& device_state(int ordinal, const Config& cfg);
// Sets the current device back to `prev` on every way out of a scope.
struct DeviceGuard {
  int prev;
  explicit DeviceGuard(int p) : prev(p) {}
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

// The GPU a device pointer lives on; throws Error.
int device_of(const void* p);

// A CopyEngine on `dev` ordered against `xla_stream`.
std::unique_ptr<stage::CopyEngine> copy_engine(Device& dev, cudaStream_t xla_stream);

// Page-locked host memory (cudaHostAlloc, portable across GPUs).
std::unique_ptr<stage::Allocator> pinned_allocator();

}  // namespace r2ccl::cuda
