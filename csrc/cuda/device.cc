// GPU resources and the CUDA copy engine (see device.h).
#include "cuda/device.h"

#include <algorithm>
#include <map>

#include "base/error.h"
#include "base/log.h"
#include "cuda/kernels.h"
#include "stage/pipeline.h"

namespace r2ccl::cuda {

void check(cudaError_t st, const char* what) {
  if (st != cudaSuccess)
    throw Error(Cause::kDevice, -1, std::string(what) + " failed: " + cudaGetErrorName(st) + " (" +
                                        cudaGetErrorString(st) + ")");
}

namespace {

class PinnedAllocator final : public stage::Allocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc of staging");
    return p;
  }
  void release(void* p) noexcept override { cudaFreeHost(p); }
  const char* kind() const override { return "pinned"; }
};

// Runs a batch's `done` from the stream (a driver thread; it must not call CUDA, and does not).
void CUDART_CB call_done(void* p) {
  auto* fn = static_cast<std::function<void()>*>(p);
  (*fn)();
  delete fn;
}

class CudaCopyEngine final : public stage::CopyEngine {
 public:
  CudaCopyEngine(Device& d, cudaStream_t xla) : d_(d), xla_(xla) {}
  void begin() override {
    // Both directions follow what XLA queued before the call (the input's producer, and any
    // earlier reader of the memory now given to the result).
    check(cudaEventRecord(d_.begin, xla_), "cudaEventRecord on XLA's stream");
    check(cudaStreamWaitEvent(d_.to_host, d_.begin, 0), "cudaStreamWaitEvent (copy in)");
    check(cudaStreamWaitEvent(d_.to_device, d_.begin, 0), "cudaStreamWaitEvent (copy out)");
  }
  void to_host(const std::vector<stage::Copy>& copies, std::function<void()> done) override {
    queue(copies, cudaMemcpyDeviceToHost, d_.to_host, std::move(done));
  }
  void to_device(const std::vector<stage::Copy>& copies, std::function<void()> done) override {
    queue(copies, cudaMemcpyHostToDevice, d_.to_device, std::move(done));
  }
  void finish() override {
    check(cudaEventRecord(d_.end, d_.to_device), "cudaEventRecord (copy out)");
    check(cudaStreamWaitEvent(xla_, d_.end, 0), "cudaStreamWaitEvent on XLA's stream");
  }
  // The small path on XLA's stream: the reads after what XLA queued, one wait; the last
  // small result copy is then done too when it was on this stream (the event wait returns
  // at once), else waited for here, before its host memory is written again.
  void read_now(const std::vector<stage::Copy>& copies) override {
    enqueue(copies, cudaMemcpyDeviceToHost, xla_, "cudaMemcpy2DAsync (operands to host)");
    check(cudaStreamSynchronize(xla_), "cudaStreamSynchronize (XLA's stream)");
    if (d_.small_pending) {
      check(cudaEventSynchronize(d_.small_written), "cudaEventSynchronize (the last small result)");
      d_.small_pending = false;
    }
  }
  void write_later(const std::vector<stage::Copy>& copies) override {
    enqueue(copies, cudaMemcpyHostToDevice, xla_, "cudaMemcpy2DAsync (small result to device)");
    check(cudaEventRecord(d_.small_written, xla_), "cudaEventRecord (small result)");
    d_.small_pending = true;
  }
  // The leader's fold: after each member's begin event, acc = in_0 (op) in_1 (op) ... on this
  // GPU (peers read over peer access where the GPUs have it, else copied here first), then
  // one copy of the fold to host staging. All on the copy-in stream, so chunks stay in order.
  bool fold_to_host(void* dst, const std::vector<const void*>& srcs, const std::vector<stage::CopyEngine*>& peers,
                    coll::DType t, coll::ReduceOp op, stage::FoldShape sh, std::function<void()> done) override {
    const size_t es = coll::dtype_size(t);
    const size_t bytes = sh.width * sh.rows * es;   // the packed fold
    grow_fold(bytes);
    for (size_t i = 1; i < peers.size(); i++) {
      auto* p = static_cast<CudaCopyEngine*>(peers[i]);
      check(cudaStreamWaitEvent(d_.to_host, p->d_.begin, 0), "cudaStreamWaitEvent (a local GPU's input)");
    }
    // Source i as (pointer, pitch in elements): read in place on this GPU or over peer access,
    // else copied here (packed) first.
    auto src_of = [&](size_t i) -> std::pair<const void*, size_t> {
      const int peer = i == 0 ? d_.ordinal : static_cast<CudaCopyEngine*>(peers[i])->d_.ordinal;
      if (peer == d_.ordinal || can_read(peer)) return {srcs[i], sh.src_pitch};
      check(cudaMemcpy2DAsync(d_.fold_peer, sh.width * es, srcs[i], sh.src_pitch * es, sh.width * es, sh.rows,
                              cudaMemcpyDefault, d_.to_host),
            "cudaMemcpy2DAsync (a local GPU's input without peer access)");
      return {d_.fold_peer, sh.width};
    };
    if (bytes > 0) {
      auto [a, pa] = src_of(0);
      if (srcs.size() == 1) {
        check(cudaMemcpy2DAsync(d_.fold_acc, sh.width * es, a, pa * es, sh.width * es, sh.rows,
                                cudaMemcpyDeviceToDevice, d_.to_host),
              "cudaMemcpy2DAsync");
      } else {
        auto [b, pb] = src_of(1);
        check(reduce_2d(t, op, d_.fold_acc, sh.width, a, pa, b, pb, sh.width, sh.rows, d_.to_host),
              "reduction kernel launch");
        for (size_t i = 2; i < srcs.size(); i++) {
          auto [c, pc] = src_of(i);
          check(reduce_2d(t, op, d_.fold_acc, sh.width, d_.fold_acc, sh.width, c, pc, sh.width, sh.rows, d_.to_host),
                "reduction kernel launch");
        }
      }
    }
    queue({{dst, d_.fold_acc, bytes, 1, bytes, bytes}}, cudaMemcpyDeviceToHost, d_.to_host, std::move(done));
    return true;
  }
  std::string failure() override {
    for (cudaStream_t s : {d_.to_host, d_.to_device}) {
      cudaError_t st = cudaStreamQuery(s);
      if (st != cudaSuccess && st != cudaErrorNotReady)
        return std::string("a staging copy failed: ") + cudaGetErrorName(st) + " (" + cudaGetErrorString(st) + ")";
    }
    return {};
  }
  void sync() override {
    cudaError_t a = cudaStreamSynchronize(d_.to_host);
    cudaError_t b = cudaStreamSynchronize(d_.to_device);
    check(a, "cudaStreamSynchronize (copy in)");
    check(b, "cudaStreamSynchronize (copy out)");
  }

 private:
  static void enqueue(const std::vector<stage::Copy>& copies, cudaMemcpyKind kind, cudaStream_t s, const char* what) {
    for (const stage::Copy& c : copies) {
      if (c.width == 0 || c.rows == 0) continue;
      const size_t dp = c.rows == 1 ? c.width : c.dst_pitch, sp = c.rows == 1 ? c.width : c.src_pitch;
      check(cudaMemcpy2DAsync(c.dst, dp, c.src, sp, c.width, c.rows, kind, s), what);
    }
  }
  void queue(const std::vector<stage::Copy>& copies, cudaMemcpyKind kind, cudaStream_t s, std::function<void()> done) {
    enqueue(copies, kind, s, "cudaMemcpy2DAsync (staging)");
    auto* fn = new std::function<void()>(std::move(done));
    cudaError_t st = cudaLaunchHostFunc(s, call_done, fn);
    if (st != cudaSuccess) {
      delete fn;
      check(st, "cudaLaunchHostFunc");
    }
  }
  void grow_fold(size_t bytes) {
    if (d_.fold_bytes >= bytes) return;
    check(cudaStreamSynchronize(d_.to_host), "cudaStreamSynchronize (copy in)");   // nothing uses them now
    cudaFree(d_.fold_acc);
    cudaFree(d_.fold_peer);
    d_.fold_acc = d_.fold_peer = nullptr;
    d_.fold_bytes = 0;
    check(cudaMalloc(&d_.fold_acc, bytes), "cudaMalloc (device fold)");
    check(cudaMalloc(&d_.fold_peer, bytes), "cudaMalloc (device fold)");
    d_.fold_bytes = bytes;
  }
  bool can_read(int peer) {
    auto it = d_.peer_access.find(peer);
    if (it != d_.peer_access.end()) return it->second;
    int ok = 0;
    bool on = cudaDeviceCanAccessPeer(&ok, d_.ordinal, peer) == cudaSuccess && ok;
    if (on) {
      cudaError_t st = cudaDeviceEnablePeerAccess(peer, 0);   // for the current device: this one
      on = st == cudaSuccess || st == cudaErrorPeerAccessAlreadyEnabled;
      cudaGetLastError();   // neither outcome is sticky
    }
    R2_INFO("cuda: device %d reads device %d %s", d_.ordinal, peer, on ? "over peer access" : "through a copy");
    d_.peer_access[peer] = on;
    return on;
  }
  Device& d_;
  cudaStream_t xla_;
};

std::mutex g_mu;
std::map<int, std::unique_ptr<Device>>& devices() {
  static auto* m = new std::map<int, std::unique_ptr<Device>>();   // lives for the process
  return *m;
}

}  // namespace

Device& device_state(int ordinal, const Config& cfg) {
  std::lock_guard<std::mutex> g(g_mu);
  auto& m = devices();
  auto it = m.find(ordinal);
  if (it != m.end()) return *it->second;
  int prev = -1;
  check(cudaGetDevice(&prev), "cudaGetDevice");
  DeviceGuard restore(prev);
  auto d = std::make_unique<Device>();
  d->ordinal = ordinal;
  check(cudaSetDevice(ordinal), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&d->to_host, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&d->to_device, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&d->begin, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&d->end, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&d->small_written, cudaEventDisableTiming), "cudaEventCreate");
  d->pool = std::make_unique<stage::StagingPool>(pinned_allocator(), cfg.staging_bytes,
                                                 stage::slot_bytes(cfg.staging_chunk_bytes),
                                                 stage::small_bytes(cfg.staging_chunk_bytes));
  d->pool->reserve(stage::PipelineOptions{}.depth);   // pinned memory now, not inside a collective
  const stage::PoolStats ps = d->pool->stats();
  R2_INFO("cuda: device %d ready (staging: %llu slots of %llu bytes allocated, bound %llu bytes)", ordinal,
          static_cast<unsigned long long>(ps.allocated_bytes / std::max<uint64_t>(ps.slot_bytes, 1)),
          static_cast<unsigned long long>(ps.slot_bytes), static_cast<unsigned long long>(cfg.staging_bytes));
  Device& ref = *d;
  m[ordinal] = std::move(d);
  return ref;
}

int device_of(const void* p) {
  cudaPointerAttributes a{};
  check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    throw Error(Cause::kInvalidArgument, -1, "the collective's operand is not GPU memory");
  return a.device;
}

std::unique_ptr<stage::CopyEngine> copy_engine(Device& dev, cudaStream_t xla_stream) {
  return std::make_unique<CudaCopyEngine>(dev, xla_stream);
}

std::unique_ptr<stage::Allocator> pinned_allocator() { return std::make_unique<PinnedAllocator>(); }

}  // namespace r2ccl::cuda
