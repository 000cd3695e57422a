// Memory a caller registered with the endpoint (Endpoint::register_memory; the NCCL plugin's
// regMr): registered with every transport the endpoint's NICs use, so that any rail can write a
// chunk of it into the peer (a send) or the peer can write into it through any NIC (an
// advertised receive). Held by the endpoint's cache until deregistered, and by every request
// that uses it until that request finishes: the memory stays registered while a write may
// still read or land in it. Knows transports only through the seam and the registry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "net/registry.h"
#include "net/transport.h"

namespace r2ccl {

class Registration {
 public:
  // Throws Error(kSystem) naming the transport and the cause when one cannot register it.
  // `dmabuf`: the memory is a dma-buf's (Transport::register_dmabuf on every transport in
  // use; one that takes none refuses with Error(kInvalidArgument) naming why). Its fd is
  // duplicated: the caller may close its own when this returns (NCCL does).
  Registration(const void* base, size_t len, const NicTransports& transports, const std::vector<Nic>& nics,
               const DmaBuf* dmabuf = nullptr);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  const uint8_t* base() const { return base_; }
  size_t len() const { return len_; }
  bool covers(const void* p, size_t n) const {
    auto b = reinterpret_cast<uintptr_t>(base_), x = reinterpret_cast<uintptr_t>(p);
    return x >= b && n <= len_ && x - b <= len_ - n;
  }
  // Engine thread only (renew() changes both):
  // its region on `t`, or null where `t` has none;
  const MemRegion* on(const Transport& t) const;
  // the key of each local NIC, in NIC order (0: that NIC cannot take one-sided writes);
  const std::vector<uint32_t>& keys() const { return keys_; }
  // registers the memory again under new keys, so that a write still on its way with the
  // old ones fails at its sender instead of landing (a receive's revoke).
  void renew();

 private:
  void register_all();
  void deregister_all();

  const uint8_t* base_;
  size_t len_;
  std::vector<std::shared_ptr<Transport>> nic_transport_;   // each local NIC's (shared: it outlives us)
  std::vector<Nic> nics_;
  std::vector<std::pair<std::shared_ptr<Transport>, MemRegion>> regions_;   // one per transport in use
  std::vector<uint32_t> keys_;
  DmaBuf dmabuf_;   // fd -1: plain memory; else our dup of the caller's fd, closed with us
};

}  // namespace r2ccl
