// Registered memory (registration.h): one region per transport in use, each local NIC's key.
#include "core/registration.h"

#include <algorithm>

namespace r2ccl {

Registration::Registration(const void* base, size_t len, const NicTransports& transports, const std::vector<Nic>& nics)
    : base_(static_cast<const uint8_t*>(base)), len_(len), nics_(nics) {
  for (size_t i = 0; i < transports.size(); i++) nic_transport_.push_back(transports.shared(i));
  register_all();
}

Registration::~Registration() { deregister_all(); }

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
      if (!on(*t)) regions_.push_back({t, t->register_memory(base_, len_)});
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
