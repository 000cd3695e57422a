// The CUDA part's Python entry points (see api.h).
#include "cuda/api.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "base/error.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "stage/pool.h"

namespace r2ccl::cuda {

namespace {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t n) { check(cudaMalloc(&p, std::max<size_t>(n, 1)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
};

struct PinnedBuffer {
  void* p = nullptr;
  explicit PinnedBuffer(size_t n) { check(cudaHostAlloc(&p, std::max<size_t>(n, 1), cudaHostAllocPortable), "cudaHostAlloc"); }
  ~PinnedBuffer() { cudaFreeHost(p); }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double time_it(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string testing_reduce(coll::DType t, coll::ReduceOp op, void* out, const void* a, const void* b, size_t count,
                           int device) {
  try {
    check(cudaSetDevice(device), "cudaSetDevice");
    const size_t bytes = count * coll::dtype_size(t);
    DeviceBuffer da(bytes), db(bytes);
    Stream s;
    check(cudaMemcpy(da.p, a, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(db.p, b, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(reduce(t, op, da.p, da.p, db.p, count, s.s), "reduction kernel launch");
    check(cudaStreamSynchronize(s.s), "cudaStreamSynchronize");
    check(cudaMemcpy(out, da.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

std::vector<std::string> prepare(const std::vector<int>& ordinals, const Config& cfg) {
  std::vector<std::string> lines;
  for (int o : ordinals) {
    Device& d = device_state(o, cfg);
    const stage::PoolStats ps = d.pool->stats();
    lines.push_back("device " + std::to_string(o) + ": " + std::to_string(ps.allocated_bytes / ps.slot_bytes) +
                    " staging slots of " + std::to_string(ps.slot_bytes) + " bytes pinned");
  }
  return lines;
}

std::vector<BenchRow> bench(uint64_t bytes, int iters, int device, uint64_t chunk_bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  iters = std::max(1, iters);
  std::vector<BenchRow> rows;
  DeviceBuffer dev(bytes), dev2(bytes), dev3(bytes);
  PinnedBuffer pinned(bytes);
  Stream xla;   // stands in for XLA's stream
  Config cfg;
  cfg.staging_chunk_bytes = chunk_bytes;
  cfg.staging_bytes = std::max<uint64_t>(cfg.staging_bytes, 8 * chunk_bytes);
  Device& d = device_state(device, cfg);
  check(cudaMemset(dev.p, 1, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  // Staging: the pipeline's copies of `bytes` in chunk steps over 3 pool slots, each slot
  // reused as soon as its copy finished (the network is left out: copies only).
  auto staged = [&](bool to_host) {
    std::vector<stage::StagingPool::Lease> slots;
    for (int i = 0; i < 3; i++) slots.push_back(d.pool->try_acquire(chunk_bytes));
    if (!slots.back()) throw Error(Cause::kInvalidArgument, -1, "staging bound too small for the bench");
    auto engine = copy_engine(d, xla.s);
    const uint64_t n = (bytes + chunk_bytes - 1) / chunk_bytes;
    std::atomic<uint64_t> done{0};
    std::vector<std::atomic<int>> busy(3);
    for (auto& b : busy) b.store(0);
    engine->begin();
    for (uint64_t c = 0; c < n; c++) {
      const int s = static_cast<int>(c % 3);
      while (busy[s].load(std::memory_order_acquire)) std::this_thread::yield();
      busy[s].store(1);
      const size_t w = std::min<uint64_t>(chunk_bytes, bytes - c * chunk_bytes);
      auto* devp = static_cast<uint8_t*>(dev.p) + c * chunk_bytes;
      stage::Copy cp = to_host ? stage::Copy{slots[s].data(), devp, w, 1, w, w}
                               : stage::Copy{devp, slots[s].data(), w, 1, w, w};
      auto cb = [&done, &busy, s] {
        busy[s].store(0, std::memory_order_release);
        done.fetch_add(1);
      };
      if (to_host)
        engine->to_host({cp}, cb);
      else
        engine->to_device({cp}, cb);
    }
    engine->finish();
    engine->sync();
    while (done.load() < n) std::this_thread::yield();
  };
  for (bool to_host : {true, false}) {
    BenchRow r;
    r.what = to_host ? "staging D2H" : "staging H2D";
    r.baseline = "cudaMemcpy pinned";
    r.bytes = bytes;
    std::vector<double> ours, base;
    staged(to_host);   // warm-up: the pool's buffers, the streams
    for (int i = 0; i < iters; i++) {
      ours.push_back(time_it([&] { staged(to_host); }));
      base.push_back(time_it([&] {
        check(cudaMemcpyAsync(to_host ? pinned.p : dev.p, to_host ? dev.p : pinned.p, bytes,
                              to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, xla.s),
              "cudaMemcpyAsync");
        check(cudaStreamSynchronize(xla.s), "cudaStreamSynchronize");
      }));
    }
    r.seconds = median(ours);
    r.baseline_seconds = median(base);
    r.gbps = bytes / r.seconds / 1e9;
    r.baseline_gbps = bytes / r.baseline_seconds / 1e9;
    rows.push_back(r);
  }
  // Reduction kernel (out = a + b: reads 2, writes 1 buffer) beside a D2D copy (reads 1,
  // writes 1), both as bytes of device memory touched per second.
  for (coll::DType t : {coll::DType::kF32, coll::DType::kBF16}) {
    BenchRow r;
    r.what = std::string("reduce kernel ") + coll::dtype_name(t) + " sum";
    r.baseline = "cudaMemcpy D2D";
    r.bytes = bytes;
    const size_t count = bytes / coll::dtype_size(t);
    std::vector<double> ours, base;
    check(reduce(t, coll::ReduceOp::kSum, dev3.p, dev.p, dev2.p, count, xla.s), "reduction kernel launch");
    check(cudaStreamSynchronize(xla.s), "cudaStreamSynchronize");
    for (int i = 0; i < iters; i++) {
      ours.push_back(time_it([&] {
        check(reduce(t, coll::ReduceOp::kSum, dev3.p, dev.p, dev2.p, count, xla.s), "reduction kernel launch");
        check(cudaStreamSynchronize(xla.s), "cudaStreamSynchronize");
      }));
      base.push_back(time_it([&] {
        check(cudaMemcpyAsync(dev3.p, dev.p, bytes, cudaMemcpyDeviceToDevice, xla.s), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(xla.s), "cudaStreamSynchronize");
      }));
    }
    r.seconds = median(ours);
    r.baseline_seconds = median(base);
    r.gbps = 3.0 * bytes / r.seconds / 1e9;
    r.baseline_gbps = 2.0 * bytes / r.baseline_seconds / 1e9;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace r2ccl::cuda
