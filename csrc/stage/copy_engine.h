// The copy engine between a device's memory and host staging, as the chunk pipeline sees it.
// CUDA: cudaMemcpy2DAsync on streams of our own, ordered after XLA's stream (csrc/cuda);
// tests and CPU: plain memcpy on a worker thread (host_copy.h). Knows nothing of CUDA or XLA.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "coll/reduce.h"

namespace r2ccl::stage {

// `rows` runs of `width` bytes: run i goes from src + i * src_pitch to dst + i * dst_pitch.
struct Copy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t width = 0;
  size_t rows = 1;
  size_t dst_pitch = 0;
  size_t src_pitch = 0;
};

// The region a fold reads from each source: `rows` runs of `width` elements, run r starting
// at src + r * src_pitch elements. The fold's result is packed (run r at dst + r * width).
struct FoldShape {
  size_t width = 0;
  size_t rows = 1;
  size_t src_pitch = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Copies queued from now on start only after the work the caller queued before this call.
  virtual void begin() = 0;
  // Queue device -> host (to_host) or host -> device (to_device) copies; `done` runs once,
  // on any thread, when they finished. It must be quick and must not call the engine.
  // Throws r2ccl::Error (cause device) when the copies cannot be queued.
  virtual void to_host(const std::vector<Copy>& copies, std::function<void()> done) = 0;
  virtual void to_device(const std::vector<Copy>& copies, std::function<void()> done) = 0;
  // The device-side fold of a process's local ranks (all_reduce / reduce_scatter with several
  // local devices): host `dst` = srcs[0] (op) srcs[1] (op) ... over the region `shape`, in
  // that order, where srcs[i] is device memory of the device whose engine is peers[i]
  // (peers[0] is this one; each peer's begin() has been called). Reads every source after
  // the work its own caller queued before; `done` as above. Returns false when the engine
  // cannot fold, without queueing anything.
  virtual bool fold_to_host(void* dst, const std::vector<const void*>& srcs, const std::vector<CopyEngine*>& peers,
                            coll::DType t, coll::ReduceOp op, FoldShape shape, std::function<void()> done) = 0;
  // The caller's work queued after this call sees every to_device copy's bytes.
  virtual void finish() = 0;
  // The small path, on the caller's own order (CUDA: XLA's stream), not the engine's:
  // read_now copies device -> host after the work the caller queued before, and returns
  // when the bytes are on the host (one wait), and when the host memory of the last
  // write_later may be written again. write_later queues host -> device copies that the
  // caller's later work sees, and returns at once. Both throw r2ccl::Error (device).
  virtual void read_now(const std::vector<Copy>& copies) = 0;
  virtual void write_later(const std::vector<Copy>& copies) = 0;
  // Without waiting: empty, or why a queued copy failed (its `done` will then never run).
  virtual std::string failure() = 0;
  // Waits until every queued copy finished; throws r2ccl::Error (device) if one failed.
  virtual void sync() = 0;
};

}  // namespace r2ccl::stage
