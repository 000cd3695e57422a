// The registry of transports (registry.h): the list of this build's backends, the choice per
// NIC, and the published address format. The only file of net/ outside a backend's folder
// that names the backends.
#include "net/registry.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "net/ibverbs/verbs_backend.h"
#include "net/socket/socket_backend.h"

namespace r2ccl {

const std::vector<const TransportBackend*>& transport_backends() {
  static const std::vector<const TransportBackend*> all = {&verbs_backend(), &socket_backend()};
  return all;
}

const TransportBackend* backend_named(const std::string& name) {
  for (const TransportBackend* b : transport_backends())
    if (name == b->name) return b;
  return nullptr;
}

const TransportBackend* backend_with_wire_id(uint8_t id) {
  for (const TransportBackend* b : transport_backends())
    if (b->wire_id == id) return b;
  return nullptr;
}

std::string publish_address(const TransportBackend& be, const NetAddr& a) {
  return (*be.scheme ? std::string(be.scheme) + ":" : std::string()) + a.str();
}

PeerAddress parse_address(const std::string& text) {
  PeerAddress out;
  std::string rest = text;
  // "IP:PORT" has one colon; "SCHEME:IP:PORT" two.
  if (std::count(text.begin(), text.end(), ':') >= 2) {
    const std::string scheme = text.substr(0, text.find(':'));
    for (const TransportBackend* b : transport_backends())
      if (*b->scheme && scheme == b->scheme) out.backend = b;
    if (!out.backend)
      throw Error(Cause::kInvalidArgument, -1,
                  "address '" + text + "' names transport '" + scheme + "', which this build does not have");
    rest = text.substr(scheme.size() + 1);
  } else {
    for (const TransportBackend* b : transport_backends())
      if (!*b->scheme) out.backend = b;
  }
  out.addr = NetAddr::parse(rest);
  return out;
}

NicTransports::NicTransports(const std::vector<Nic>& nics, const Config& cfg) {
  const auto& all = transport_backends();
  const TransportBackend* forced = nullptr;
  if (cfg.transport != "auto") {
    forced = backend_named(cfg.transport);
    if (!forced) throw Error(Cause::kInvalidArgument, -1, "R2CCL_TRANSPORT=" + cfg.transport + " names no transport of this build");
  }
  std::vector<const TransportBackend*> chosen(nics.size(), nullptr);
  for (const TransportBackend* b : all) {
    if (forced && b != forced) continue;
    std::vector<size_t> open;   // NICs no backend took yet
    std::vector<Nic> asked;
    for (size_t i = 0; i < nics.size(); i++)
      if (!chosen[i]) {
        open.push_back(i);
        asked.push_back(nics[i]);
      }
    if (asked.empty()) break;
    const std::vector<std::string> why = b->serves(asked, cfg);
    for (size_t k = 0; k < open.size(); k++) {
      if (why[k].empty()) {
        chosen[open[k]] = b;
        R2_INFO("NIC %s: %s", nics[open[k]].name.c_str(), b->name);
      } else if (forced) {
        throw Error(Cause::kSystem, -1, "R2CCL_TRANSPORT=" + cfg.transport + ": NIC " + nics[open[k]].name + ": " + why[k]);
      } else {
        R2_INFO("NIC %s: not %s (%s)", nics[open[k]].name.c_str(), b->name, why[k].c_str());
      }
    }
  }
  for (size_t i = 0; i < nics.size(); i++)
    if (!chosen[i])   // the registry's last backend serves every NIC
      throw Error(Cause::kInternal, -1, "no transport serves NIC " + nics[i].name);
  per_nic_.resize(nics.size());
  for (const TransportBackend* b : all) {
    if (std::find(chosen.begin(), chosen.end(), b) == chosen.end()) continue;
    std::shared_ptr<Transport> t = b->make(cfg, nics.size());
    for (size_t i = 0; i < nics.size(); i++)
      if (chosen[i] == b) per_nic_[i] = Slot{b, t};
  }
}

}  // namespace r2ccl
