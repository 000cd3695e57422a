// The verbs backend's memory registration (verbs_internal.h): each link's bounce buffers,
// registered with its device's protection domain for local access only, and the caller's
// regions (Transport::register_memory), registered with every device the transport serves so
// that any surviving rail can write any chunk of them: local access for WRITEs from them,
// remote write for WRITEs into them (a receive advertised to its peer). A region backed by a
// dma-buf goes through ibv_reg_dmabuf_mr instead (GPUDirect; Transport::register_dmabuf).
#if R2CCL_HAVE_IBVERBS

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"

#include "net/ibverbs/verbs_internal.h"

namespace r2ccl::verbs {

bool VerbsLink::register_buffers() {
  const size_t bytes = size_t{n_send_ + n_recv_} * buf_bytes_ + kCtrlBuffers * kCtrlSlotBytes;
  mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095}));
  if (!mem_) return sys_fail("bounce buffer allocation");
  mr_ = api_->reg_mr(at_.dev->pd, mem_, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (!mr_) return sys_fail("ibv_reg_mr of " + std::to_string(bytes) + " bytes of bounce buffers (RLIMIT_MEMLOCK?)");
  return true;
}

bool Device::keys_of(uint64_t handle, uint32_t* lkey, uint32_t* rkey) {
  std::lock_guard<std::mutex> g(mr_mu);
  auto it = mrs.find(handle);
  if (it == mrs.end()) return false;
  if (lkey) *lkey = it->second->lkey;
  if (rkey) *rkey = it->second->rkey;
  return true;
}

ibv_mr* Devices::reg_on(Device& d, const Region& r) {
  if (r.fd < 0) return api_->reg_mr(d.pd, const_cast<void*>(r.base), r.len, kRegionAccess);
  if (!api_->reg_dmabuf_mr) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return api_->reg_dmabuf_mr(d.pd, r.offset, r.len, reinterpret_cast<uint64_t>(r.base), r.fd, kRegionAccess);
}

void Devices::register_region(const void* base, size_t len, uint64_t handle, const DmaBuf* buf) {
  std::lock_guard<std::mutex> g(mu_);   // no device opens meanwhile (open_locked registers the list)
  Region region{base, len};
  if (buf) {
    const std::string no = dmabuf_why_locked();
    if (!no.empty()) throw Error(Cause::kInvalidArgument, -1, "registering a dma-buf (GPUDirect) over ibverbs: " + no);
    region.fd = fcntl(buf->fd, F_DUPFD_CLOEXEC, 0);
    if (region.fd < 0)
      throw Error(Cause::kInvalidArgument, -1,
                  "registering a dma-buf: its fd " + std::to_string(buf->fd) + " cannot be duplicated: " +
                      std::strerror(errno));
    region.offset = buf->offset;
  }
  regions_[handle] = region;
  for (auto& [name, d] : open_) {
    ibv_mr* mr = reg_on(*d, region);
    if (!mr) {
      const int e = errno;
      deregister_locked(handle);
      throw Error(Cause::kSystem, -1,
                  std::string(buf ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr") + " of " + std::to_string(len) + " bytes on " +
                      name + " failed: " + std::strerror(e) +
                      (e == ENOMEM || e == EPERM ? " (RLIMIT_MEMLOCK: ulimit -l)" : ""));
    }
    std::lock_guard<std::mutex> mg(d->mr_mu);
    d->mrs[handle] = mr;
  }
}

std::string Devices::dmabuf_support() {
  std::lock_guard<std::mutex> g(mu_);
  return dmabuf_why_locked();
}

std::string Devices::dmabuf_why_locked() const {
  if (open_.empty()) return "no RDMA device is open";
  std::string why;
  for (auto& [name, d] : open_)
    if (!d->dmabuf_why.empty()) why += (why.empty() ? "" : "; ") + d->dmabuf_why;
  return why;
}

void Devices::deregister_region(uint64_t handle) {
  std::lock_guard<std::mutex> g(mu_);
  deregister_locked(handle);
}

void Devices::deregister_locked(uint64_t handle) {
  auto it = regions_.find(handle);
  if (it != regions_.end()) {
    if (it->second.fd >= 0) close(it->second.fd);
    regions_.erase(it);
  }
  for (auto& [name, d] : open_) {
    ibv_mr* mr = nullptr;
    {
      std::lock_guard<std::mutex> mg(d->mr_mu);
      auto it = d->mrs.find(handle);
      if (it == d->mrs.end()) continue;
      mr = it->second;
      d->mrs.erase(it);
    }
    api_->dereg_mr(mr);
  }
}

}  // namespace r2ccl::verbs

#endif  // R2CCL_HAVE_IBVERBS
