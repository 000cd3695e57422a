// Registered memory (registration.h): one region per transport in use, each local NIC's key.
#include "core/registration.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/error.h"

namespace r2ccl {

Registration::Registration(const void* base, size_t len, const NicTransports& transports, const std::vector<Nic>& nics,
                           const DmaBuf* dmabuf)
    : base_(static_cast<const uint8_t*>(base)), len_(len), nics_(nics) {
  for (size_t i = 0; i < transports.size(); i++) nic_transport_.push_back(transports.shared(i));
  if (dmabuf) {
    dmabuf_.offset = dmabuf->offset;
    dmabuf_.fd = fcntl(dmabuf->fd, F_DUPFD_CLOEXEC, 0);
    if (dmabuf_.fd < 0)
      throw Error(Cause::kInvalidArgument, -1, "registering a dma-buf: its fd " + std::to_string(dmabuf->fd) +
                                                   " cannot be duplicated: " + std::strerror(errno));
  }
  try {
    register_all();
  } catch (...) {
    if (dmabuf_.fd >= 0) close(dmabuf_.fd);
    throw;
  }
}

Registration::~Registration() {
  deregister_all();
  if (dmabuf_.fd >= 0) close(dmabuf_.fd);
}

const MemRegion* Registration::on(const Transport& t) const {
  for (auto& [tp, region] : regions_)
    if (tp.get() == &t) return &region;
  return nullptr;
}

void Registration::renew() {
  deregister_all();
  register_all();
}

void Registration::register_all() {
  try {
    for (auto& t : nic_transport_)
      if (!on(*t))
        regions_.push_back({t, dmabuf_.fd >= 0 ? t->register_dmabuf(base_, len_, dmabuf_) : t->register_memory(base_, len_)});
  } catch (...) {
    deregister_all();
    throw;
  }
  keys_.assign(nics_.size(), 0);
  for (size_t i = 0; i < nics_.size(); i++)
    if (const MemRegion* m = on(*nic_transport_[i])) keys_[i] = nic_transport_[i]->remote_key(*m, nics_[i]);
}

void Registration::deregister_all() {
  for (auto& [tp, region] : regions_) tp->deregister_memory(region);
  regions_.clear();
  std::fill(keys_.begin(), keys_.end(), 0u);
}

}  // namespace r2ccl
