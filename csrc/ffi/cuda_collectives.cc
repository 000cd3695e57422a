// The CUDA custom call behind jax_r2ccl.psum and friends (platform "CUDA"), same target name,
// operands and attributes as the CPU one (cpu_collectives.cc).
//
// Execution model: blocking, as XLA:GPU requires (its custom-call thunk blocks the launching
// thread on an ffi::Future anyway, so a Future buys nothing). On XLA's launching thread:
//   1. read the group and rank operands (8 bytes D2H, after the work queued before),
//   2. run the chunk pipeline (stage/pipeline.h): our copy streams wait on an event recorded
//      on XLA's stream, chunks go device -> pinned staging -> transport -> pinned staging ->
//      device with copies, network and reduction of different chunks overlapping,
//   3. make XLA's stream wait on the last copy out, and return once every copy finished.
// The launching thread waits exactly as long as its collective. Each local GPU's thread does
// this at the same time; the runtime's rendezvous joins them, and the process's part of each
// chunk is reduced in canonical order by the same code as on CPU (bit-identical results).
// Not kCmdBufferCompatible: it does host networking and must not be captured into a graph.
#include <cuda_runtime_api.h>

#include <cctype>
#include <string>

#include "coll/runtime.h"
#include "cuda/device.h"
#include "ffi/boundary.h"
#include "ffi/handlers.h"
#include "stage/pipeline.h"

namespace r2ccl::ffi {
namespace {

struct Progress {
  std::shared_ptr<coll::Runtime> rt;
  coll::Runtime::CallToken active;   // Runtime::enter_call: until the handler returns
  coll::DeviceCall call;
  stage::PipelineOptions opt;
  bool decoded = false;   // group and rank known
  bool staged = false;    // run_staged took over (it abandons its own chunks on an error)
};

xffi::Error collective_body(Progress& pr, cudaStream_t stream, xffi::RunId run_id, xffi::AnyBuffer x, xffi::Buffer<xffi::S32> group,
                            xffi::Buffer<xffi::S32> rank, xffi::Result<xffi::AnyBuffer> out, int64_t comm_id,
                            int64_t op_id, int64_t kind, int64_t reduce_op, int64_t root) {
  pr.rt = coll::Runtime::current();
  auto& rt = pr.rt;
  if (!rt) return invalid("jax_r2ccl.initialize() has not been called in this process");
  pr.active = rt->enter_call();
  coll::DeviceCall& c = pr.call;
  pr.opt.chunk_bytes = rt->config().staging_chunk_bytes;
  pr.opt.timeout_s = rt->config().timeout_s;
  std::string bad = decode(c, static_cast<uint64_t>(run_id.run_id), x, 0, 0, *out, comm_id, op_id, kind, reduce_op, root);
  if (!bad.empty()) return invalid(bad);
  if (group.element_count() != 1 || rank.element_count() != 1) return invalid("group and rank must be s32 scalars");
  int prev = -1;
  cuda::check(cudaGetDevice(&prev), "cudaGetDevice");
  const int ordinal = c.count > 0 ? cuda::device_of(c.in) : prev;
  cuda::Device& dev = cuda::device_state(ordinal, rt->config());
  std::lock_guard<std::mutex> one_at_a_time(dev.busy);
  cuda::check(cudaSetDevice(ordinal), "cudaSetDevice");
  struct Restore {
    int d;
    ~Restore() { cudaSetDevice(d); }
  } restore{prev};
  // The group and rank come from partition_id inside the program: read them after the work
  // XLA queued before this call.
  cuda::check(cudaMemcpyAsync(dev.scalars, group.typed_data(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (group)");
  cuda::check(cudaMemcpyAsync(dev.scalars + 1, rank.typed_data(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (rank)");
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (XLA's stream)");
  c.group = dev.scalars[0];
  c.rank = dev.scalars[1];
  pr.decoded = true;
  maybe_throw_injected();
  auto engine = cuda::copy_engine(dev, stream);
  pr.staged = true;
  stage::run_staged(*rt, c, *engine, *dev.pool, pr.opt);
  return xffi::Error::Success();
}

xffi::Error collective(cudaStream_t stream, xffi::RunId run_id, xffi::AnyBuffer x, xffi::Buffer<xffi::S32> group,
                       xffi::Buffer<xffi::S32> rank, xffi::Result<xffi::AnyBuffer> out, int64_t comm_id, int64_t op_id,
                       int64_t kind, int64_t reduce_op, int64_t root) {
  Progress pr;
  return guard(
      "r2ccl_collective (cuda)",
      [&] { return collective_body(pr, stream, run_id, x, group, rank, out, comm_id, op_id, kind, reduce_op, root); },
      [&](const Error& e) {
        if (pr.decoded && !pr.staged && pr.rt) stage::abandon_staged(*pr.rt, pr.call, pr.opt, e);
        return to_ffi_error(e);
      });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(R2cclCollectiveCuda, collective,
                              bind_collective(xffi::Ffi::Bind().Ctx<xffi::PlatformStream<cudaStream_t>>()));

void* collective_cuda_handler() { return reinterpret_cast<void*>(R2cclCollectiveCuda); }

CudaInfo cuda_info() {
  CudaInfo i;
  i.built = true;
  i.archs = {R2CCL_CUDA_ARCHS_LIST};
  cudaRuntimeGetVersion(&i.runtime_version);
  if (cudaDriverGetVersion(&i.driver_version) != cudaSuccess) i.driver_version = 0;
  cudaError_t st = cudaGetDeviceCount(&i.devices);
  if (st != cudaSuccess) {
    i.devices = 0;
    i.error = std::string(cudaGetErrorName(st)) + ": " + cudaGetErrorString(st);
    cudaGetLastError();   // not sticky: clear it
    return i;
  }
  for (int d = 0; d < i.devices; d++) {
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, d) == cudaSuccess) {
      std::string b(bus);
      for (auto& ch : b) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (b.size() > 12) b = b.substr(b.size() - 12);   // 00000000:3B:00.0 -> 0000:3b:00.0
      i.pci_bus_ids.push_back(b);
    }
  }
  return i;
}

}  // namespace r2ccl::ffi
