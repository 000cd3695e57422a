// The transports this build can carry rails over, and the one place that knows them by name:
// which backend serves which NIC (R2CCL_TRANSPORT), and how a listener's address is written
// for peers and read back. The engine and the host programs see transports only through this
// and the seam (net/transport.h); they never name a backend. A new backend is a folder under
// net/ that fills the seam plus one entry in registry.cc. Knows nothing of rails or peers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "net/transport.h"

namespace r2ccl {

// One backend as the registry knows it. Entries are constant and live for the process.
struct TransportBackend {
  const char* name;     // R2CCL_TRANSPORT's word for it, and what rail stats show: "socket", "ibverbs"
  // The prefix of its listeners' published addresses: "ibverbs" publishes "ibverbs:IP:PORT";
  // "" publishes plain "IP:PORT" (the socket backend's, as before there were backends).
  const char* scheme;
  uint8_t wire_id;      // its number where an address travels as bytes (the NCCL plugin's handle); never reused
  // For each of `nics`: "" when this backend can carry it, else why not, as a sentence. One
  // call serves every NIC (finding RDMA ports is a scan of ~0.3 s under emulation).
  std::vector<std::string> (*serves)(const std::vector<Nic>& nics, const Config& cfg);
  // The transport, set up from cfg for a process with `nics` NICs. Throws Error naming the cause.
  std::unique_ptr<Transport> (*make)(const Config& cfg, size_t nics);
};

// Every backend of this build, in the order R2CCL_TRANSPORT=auto prefers them; the last
// serves every NIC.
const std::vector<const TransportBackend*>& transport_backends();
const TransportBackend* backend_named(const std::string& name);    // null when none
const TransportBackend* backend_with_wire_id(uint8_t id);          // null when none

// A listener's address as peers are given it, and read back.
std::string publish_address(const TransportBackend& be, const NetAddr& a);
struct PeerAddress {
  const TransportBackend* backend = nullptr;
  NetAddr addr;
};
// Throws Error(kInvalidArgument) naming the text when it is malformed or names a transport
// this build does not have.
PeerAddress parse_address(const std::string& text);

// Each of a process's NICs and the transport that serves it, chosen once from cfg.transport:
// a backend's name puts that backend on every NIC (a NIC it cannot serve is an
// Error(kSystem) naming the NIC and why); "auto" puts on each NIC the first backend, in
// registry order, that serves it. One transport per backend in use, shared by its NICs.
class NicTransports {
 public:
  NicTransports(const std::vector<Nic>& nics, const Config& cfg);
  size_t size() const { return per_nic_.size(); }
  Transport& of(size_t nic) const { return *per_nic_[nic].transport; }
  // The same, shared: what must outlive the endpoint (registered memory) holds it so.
  std::shared_ptr<Transport> shared(size_t nic) const { return per_nic_[nic].transport; }
  const TransportBackend& backend(size_t nic) const { return *per_nic_[nic].backend; }
  // Listener `a` on `nic`, as its peers are given it.
  std::string publish(size_t nic, const NetAddr& a) const { return publish_address(backend(nic), a); }

 private:
  struct Slot {
    const TransportBackend* backend;
    std::shared_ptr<Transport> transport;
  };
  std::vector<Slot> per_nic_;
};

}  // namespace r2ccl
