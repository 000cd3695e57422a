// The verbs backend's devices (verbs_internal.h): opening one (context, protection domain),
// its ports' state as the async events tell it, the thread that releases dead links' resources,
// and the registry mapping each NIC to its device and port. Nothing of links' set-up or frames.
#if R2CCL_HAVE_IBVERBS

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "base/error.h"
#include "base/log.h"
#include "net/ibverbs/rdma_ports.h"
#include "net/ibverbs/verbs_internal.h"

namespace r2ccl::verbs {

Device::~Device() {
  {
    std::lock_guard<std::mutex> g(reap_mu);
    reap_stop = true;
  }
  reap_cv.notify_one();
  if (reaper.joinable()) reaper.join();   // every retired link's resources are released first
  if (pd) api->dealloc_pd(pd);
  if (ctx) api->close_device(ctx);
}

void Device::retire(std::function<void()> job) {
  std::unique_lock<std::mutex> g(reap_mu);
  if (!reaper.joinable()) {
    try {
      reaper = std::thread([this] { reap(); });
    } catch (const std::system_error&) {
      g.unlock();
      job();
      return;
    }
  }
  reap_jobs.push_back(std::move(job));
  g.unlock();
  reap_cv.notify_one();
}

void Device::reap() {
  name_this_thread("r2ccl-verbs-reap");
  std::unique_lock<std::mutex> g(reap_mu);
  for (;;) {
    reap_cv.wait(g, [this] { return reap_stop || !reap_jobs.empty(); });
    if (reap_jobs.empty()) return;   // stopping, and nothing is left to release
    std::function<void()> job = std::move(reap_jobs.front());
    reap_jobs.pop_front();
    g.unlock();
    job();
    g.lock();
  }
}

bool Device::query_active(int port, std::string* why) {
  ibv_port_attr pa{};
  if (api->query_port(ctx, static_cast<uint8_t>(port), &pa) != 0) {
    *why = name + ":" + std::to_string(port) + ": ibv_query_port failed";
    return false;
  }
  const bool up = pa.state == IBV_PORT_ACTIVE || pa.state == IBV_PORT_ACTIVE_DEFER;
  if (!up) *why = "RDMA port " + name + ":" + std::to_string(port) + " is not ACTIVE (state " +
                  std::to_string(static_cast<int>(pa.state)) + ")";
  return up;
}

void Device::pump() {
  std::lock_guard<std::mutex> g(mu);
  ibv_async_event ev;
  while (api->get_async_event(ctx, &ev) == 0) {
    std::vector<int> wake;
    const char* what = api->event_type_str(ev.event_type);
    switch (ev.event_type) {
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_PORT_ACTIVE: {
        const int port = ev.element.port_num;
        const bool up = ev.event_type == IBV_EVENT_PORT_ACTIVE;
        port_active[port] = up;
        char at[32];
        std::snprintf(at, sizeof at, "%.3f", unix_time_s());
        port_why[port] = up ? "" : "RDMA port " + name + ":" + std::to_string(port) +
                                       " went down (IBV_EVENT_PORT_ERR at unix time " + at + ")";
        R2_INFO("RDMA %s:%d: %s", name.c_str(), port, what);
        for (auto& [fd, p] : watchers)
          if (p == port) wake.push_back(fd);
        break;
      }
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        dead_qps.insert(ev.element.qp->qp_num);
        R2_INFO("RDMA %s: QP 0x%x: %s", name.c_str(), ev.element.qp->qp_num, what);
        for (auto& [fd, p] : watchers) wake.push_back(fd);
        break;
      case IBV_EVENT_DEVICE_FATAL:
        for (auto& [p, up] : port_active) {
          up = false;
          port_why[p] = "RDMA device " + name + " failed (IBV_EVENT_DEVICE_FATAL)";
        }
        R2_WARN("RDMA %s: %s", name.c_str(), what);
        for (auto& [fd, p] : watchers) wake.push_back(fd);
        break;
      default:
        R2_TRACE("RDMA %s: async event %s", name.c_str(), what);
        break;
    }
    api->ack_async_event(&ev);
    for (int fd : wake) {
      uint64_t one = 1;
      (void)!::write(fd, &one, sizeof one);
    }
  }
}

std::string Device::port_down(int port) {
  std::lock_guard<std::mutex> g(mu);
  auto it = port_active.find(port);
  if (it == port_active.end() || it->second) return "";
  return port_why[port];
}

bool Device::qp_dead(uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu);
  return dead_qps.count(qpn) != 0;
}

void Device::watch(int fd, int port) {
  std::lock_guard<std::mutex> g(mu);
  watchers[fd] = port;
}

void Device::unwatch(int fd) {
  std::lock_guard<std::mutex> g(mu);
  watchers.erase(fd);
}

// ---------------------------------------------------------------- the registry of devices

PortRef Devices::port_for(const Nic& nic, const VerbsOptions& opt) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = by_nic_.find(nic.addr_str());
    if (it != by_nic_.end()) return it->second;
  }
  RdmaPort rp;
  int gid = 0;
  std::string why;
  if (!rdma_port_for(nic, rdma_ports(), opt.gid_index, &rp, &gid, &why))
    throw Error(Cause::kSystem, -1, "NIC " + nic.name + " has no RDMA port: " + why);
  PortRef ref;
  ref.dev = open(rp.device);
  ref.port = rp.port;
  ref.gid_index = gid;
  ref.roce = rp.link_layer != "InfiniBand";
  ibv_port_attr pa{};
  if (api_->query_port(ref.dev->ctx, static_cast<uint8_t>(rp.port), &pa) != 0)
    throw Error(Cause::kSystem, -1, "ibv_query_port(" + rp.device + ":" + std::to_string(rp.port) + ") failed");
  if (api_->query_gid(ref.dev->ctx, static_cast<uint8_t>(rp.port), gid, &ref.gid) != 0)
    throw Error(Cause::kSystem, -1, "ibv_query_gid(" + rp.device + ":" + std::to_string(rp.port) + ", " +
                                        std::to_string(gid) + ") failed");
  ref.lid = pa.lid;
  ref.mtu = pa.active_mtu;
  ref.max_msg = pa.max_msg_sz;
  std::lock_guard<std::mutex> g(mu_);
  by_nic_[nic.addr_str()] = ref;
  return ref;
}

std::vector<std::shared_ptr<Device>> Devices::all() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::shared_ptr<Device>> out;
  for (auto& [name, d] : open_) out.push_back(d);
  return out;
}

std::shared_ptr<Device> Devices::open(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  return open_locked(name);
}

std::string probe_dmabuf(const VerbsApi& api, ibv_pd* pd, const std::string& name) {
  if (!api.reg_dmabuf_mr) return name + ": libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34+ has it)";
  errno = 0;
  ibv_mr* mr = api.reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
  const int e = errno;
  if (mr) {   // no driver registers a buffer it was not given; if one did, undo it
    api.dereg_mr(mr);
    return "";
  }
  if (e == EOPNOTSUPP || e == EPROTONOSUPPORT)
    return name + "'s driver registers no dma-buf (ibv_reg_dmabuf_mr: " + std::strerror(e) + ")";
  return "";
}

std::shared_ptr<Device> Devices::open_locked(const std::string& name) {
  auto it = open_.find(name);
  if (it != open_.end()) return it->second;
  int n = 0;
  ibv_device** list = api_->get_device_list(&n);
  if (!list) throw Error(Cause::kSystem, -1, std::string("ibv_get_device_list failed: ") + std::strerror(errno));
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && !ctx; i++)
    if (name == api_->get_device_name(list[i])) ctx = api_->open_device(list[i]);
  api_->free_device_list(list);
  if (!ctx) throw Error(Cause::kSystem, -1, "RDMA device " + name + " could not be opened");
  auto d = std::make_shared<Device>();
  d->api = api_;
  d->ctx = ctx;
  d->name = name;
  d->pd = api_->alloc_pd(ctx);
  if (!d->pd) throw Error(Cause::kSystem, -1, "ibv_alloc_pd on " + name + " failed");
  api_->query_device(ctx, &d->attr);
  fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
  open_[name] = d;
  // Memory registered before this device opened: on it too, so its rails can write it.
  d->dmabuf_why = probe_dmabuf(*api_, d->pd, name);
  for (const auto& [handle, r] : regions_) {
    ibv_mr* mr = reg_on(*d, r);
    if (!mr) {
      R2_WARN("verbs: registering %zu bytes on %s, opened after they were registered, failed (%s): its rails carry "
              "them in frames", r.len, name.c_str(), std::strerror(errno));
      continue;
    }
    std::lock_guard<std::mutex> g(d->mr_mu);
    d->mrs[handle] = mr;
  }
  return d;
}

}  // namespace r2ccl::verbs

#endif  // R2CCL_HAVE_IBVERBS
