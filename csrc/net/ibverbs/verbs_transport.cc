// The verbs backend (verbs_transport.h): its public functions and the transport, which maps a
// NIC to its device and port (verbs_device.cc) and makes listeners and links (verbs_connect.cc).
// A link's data path, registration and failure: verbs_link.cc, verbs_reg.cc, verbs_fail.cc.
#include "net/ibverbs/verbs_transport.h"

#include "base/error.h"
#include "base/log.h"
#include "net/ibverbs/rdma_ports.h"

namespace r2ccl {

const char* VerbsOptions::problem() const {
  if (gid_index < -1 || gid_index > 255) return "R2CCL_IB_GID_INDEX must be -1 (auto) or 0..255";
  if (timeout < 1 || timeout > 31) return "R2CCL_IB_TIMEOUT must be 1..31";
  if (retry_count < 0 || retry_count > 7) return "R2CCL_IB_RETRY_COUNT must be 0..7";
  if (traffic_class < 0 || traffic_class > 255) return "traffic_class must be 0..255";
  if (segment_bytes < 4096 || segment_bytes > (1u << 24)) return "segment_bytes must be 4 KiB..16 MiB";
  if (send_buffers < 2 || send_buffers > 1024) return "send_buffers must be 2..1024";
  if (recv_buffers < 4 || recv_buffers > 1024) return "recv_buffers must be 4..1024";
  if (bootstrap_timeout_ms < 1) return "bootstrap_timeout_ms must be positive";
  return nullptr;
}

}  // namespace r2ccl

#if !R2CCL_HAVE_IBVERBS

namespace r2ccl {

std::string verbs_unavailable_reason() {
  return "this build of jax_r2ccl has no verbs backend: rdma-core's headers (<infiniband/verbs.h>, Debian's "
         "libibverbs-dev) were not found when it was built; install them and reinstall jax_r2ccl";
}

bool verbs_serves(const Nic&, const VerbsOptions&, const std::vector<RdmaPort>&, std::string* why) {
  if (why) *why = verbs_unavailable_reason();
  return false;
}

std::unique_ptr<Transport> make_verbs_transport(const VerbsOptions&) {
  throw Error(Cause::kSystem, -1, "R2CCL_TRANSPORT=ibverbs: " + verbs_unavailable_reason());
}

std::string gpudirect_report() { return "not built (no verbs backend in this build)"; }

}  // namespace r2ccl

#else

#include <unistd.h>

#include <atomic>

#include "net/ibverbs/verbs_api.h"
#include "net/ibverbs/verbs_internal.h"

namespace r2ccl {
namespace {

using verbs::connect_verbs;
using verbs::Devices;
using verbs::listen_verbs;
using verbs::PortRef;

class VerbsTransport final : public Transport {
 public:
  VerbsTransport(const VerbsApi* api, const VerbsOptions& opt) : api_(api), devices_(api), opt_(opt) {}
  const char* name() const override { return "ibverbs"; }
  std::unique_ptr<FrameListener> listen(const Nic& nic, int port, const LinkOptions& opt) override {
    PortRef at = devices_.port_for(nic, opt_);
    return listen_verbs(std::move(at), nic, port, opt, opt_);
  }
  std::unique_ptr<FrameLink> connect(const Nic& local, const NetAddr& remote, const LinkOptions& opt) override {
    PortRef at = devices_.port_for(local, opt_);
    return connect_verbs(std::move(at), local, remote, opt, opt_);
  }
  // Registration (verbs_reg.cc): a caller's region on every device, for one-sided writes from
  // and into it. Frames need none: they are copied into the link's own registered buffers.
  MemRegion register_memory(const void* base, size_t len) override {
    MemRegion m;
    m.base = base;
    m.len = len;
    m.handle = next_region_.fetch_add(1) + 1;
    devices_.register_region(base, len, m.handle);
    return m;
  }
  std::string dmabuf_support() const override { return devices_.dmabuf_support(); }
  MemRegion register_dmabuf(const void* base, size_t len, const DmaBuf& buf) override {
    MemRegion m;
    m.base = base;
    m.len = len;
    m.handle = next_region_.fetch_add(1) + 1;
    devices_.register_region(base, len, m.handle, &buf);
    return m;
  }
  void deregister_memory(const MemRegion& m) override {
    if (m.handle) devices_.deregister_region(m.handle);
  }
  uint32_t remote_key(const MemRegion& m, const Nic& nic) override {
    uint32_t rkey = 0;
    return m.handle && devices_.port_for(nic, opt_).dev->keys_of(m.handle, nullptr, &rkey) ? rkey : 0;
  }

 private:
  const VerbsApi* api_;
  mutable Devices devices_;   // dmabuf_support reads the open devices under their lock
  VerbsOptions opt_;
  std::atomic<uint64_t> next_region_{0};
};

}  // namespace

std::string verbs_unavailable_reason() {
  std::string why;
  const VerbsApi* api = verbs_api(&why);
  if (!api) return why;
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  if (list) api->free_device_list(list);
  if (!list || n == 0) return "libibverbs found no RDMA device on this host";
  return "";
}

std::string gpudirect_report() {
  std::string why;
  const VerbsApi* api = verbs_api(&why);
  const bool peermem = access("/sys/module/nvidia_peermem", F_OK) == 0;
  std::string s = "device memory is not moved yet (registered host memory is, by one-sided writes); this host has: ";
  if (!api) return s + "no libibverbs";
  s += api->reg_dmabuf_mr ? "ibv_reg_dmabuf_mr in libibverbs" : "no ibv_reg_dmabuf_mr in libibverbs";
  s += peermem ? ", nvidia_peermem loaded" : ", no nvidia_peermem module";
  // Each device's own answer (the probe the transport runs when it opens one).
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  for (int i = 0; list && i < n; i++) {
    const std::string name = api->get_device_name(list[i]);
    ibv_context* ctx = api->open_device(list[i]);
    ibv_pd* pd = ctx ? api->alloc_pd(ctx) : nullptr;
    const std::string no = pd ? verbs::probe_dmabuf(*api, pd, name) : name + " could not be opened";
    s += "; " + (no.empty() ? name + " registers dma-bufs" : no);
    if (pd) api->dealloc_pd(pd);
    if (ctx) api->close_device(ctx);
  }
  if (list) api->free_device_list(list);
  return s;
}

bool verbs_serves(const Nic& nic, const VerbsOptions& opt, const std::vector<RdmaPort>& ports, std::string* why) {
  std::string w = verbs_unavailable_reason();
  RdmaPort rp;
  int gid = 0;
  if (w.empty() && rdma_port_for(nic, ports, opt.gid_index, &rp, &gid, &w) && !rp.active())
    w = "RDMA port " + rp.device + ":" + std::to_string(rp.port) + " of NIC " + nic.name + " is " + rp.state_name;
  if (why) *why = w;
  return w.empty();
}

std::unique_ptr<Transport> make_verbs_transport(const VerbsOptions& opt) {
  if (const char* bad = opt.problem()) throw Error(Cause::kInvalidArgument, -1, bad);
  std::string why = verbs_unavailable_reason();
  if (!why.empty()) throw Error(Cause::kSystem, -1, "R2CCL_TRANSPORT=ibverbs: " + why);
  return std::make_unique<VerbsTransport>(verbs_api(nullptr), opt);
}

}  // namespace r2ccl

#endif  // R2CCL_HAVE_IBVERBS
