// A monitor's snapshot as JSON (monitor/health_json.h).
#include "monitor/health_json.h"

#include <cstdio>
#include <sstream>

#include "core/rail_state.h"

namespace r2ccl::monitor {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

namespace {
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}
}  // namespace

std::string health_json(Monitor& mon, const Endpoint& ep, size_t max_events) {
  std::ostringstream o;
  o << "{\"rails\": [";
  bool first = true;
  for (const RailHealth& r : mon.rails()) {
    const RailStats& s = r.stats;
    o << (first ? "" : ", ") << "{\"peer\": " << r.peer << ", \"peer_name\": " << json_string(ep.peer_name(r.peer))
      << ", \"rail\": " << s.rail << ", \"nic\": " << json_string(s.local_nic_name)
      << ", \"transport\": " << json_string(s.transport) << ", \"state\": " << json_string(rail_state_name(s.state))
      << ", \"standby\": " << (s.standby ? "true" : "false") << ", \"weight\": " << num(s.weight)
      << ", \"bandwidth_Bps\": " << num(r.bandwidth_Bps) << ", \"rtt_us\": " << num(s.rtt_us)
      << ", \"tx_bytes\": " << s.tx_bytes << ", \"rx_bytes\": " << s.rx_bytes << ", \"acked_bytes\": " << s.acked_bytes
      << ", \"tx_copied_bytes\": " << s.tx_copied_bytes << ", \"rx_copied_bytes\": " << s.rx_copied_bytes
      << ", \"inflight_bytes\": " << s.inflight_bytes << ", \"retransmitted_chunks\": " << s.retransmitted_chunks
      << ", \"failures\": " << s.failures << ", \"recoveries\": " << s.recoveries
      << ", \"last_event\": " << json_string(r.last_event) << ", \"last_error\": " << json_string(s.last_error) << "}";
    first = false;
  }
  o << "], \"nics\": [";
  first = true;
  for (const NicHealth& n : mon.nics()) {
    o << (first ? "" : ", ") << "{\"name\": " << json_string(n.name) << ", \"ifname\": " << json_string(n.ifname)
      << ", \"addr\": " << json_string(n.addr) << ", \"link_up\": " << (n.link_up ? "true" : "false")
      << ", \"admitted\": " << (n.admitted ? "true" : "false") << ", \"source\": " << json_string(n.source)
      << ", \"link_downs\": " << n.downs << "}";
    first = false;
  }
  o << "], \"events\": [";
  std::vector<Event> ev = mon.events(0, 0.0);
  const size_t from = ev.size() > max_events ? ev.size() - max_events : 0;
  for (size_t i = from; i < ev.size(); i++) {
    const Event& e = ev[i];
    o << (i == from ? "" : ", ") << "{\"seq\": " << e.seq << ", \"t_unix\": " << num(e.t_unix)
      << ", \"kind\": " << json_string(e.kind) << ", \"peer\": " << e.peer
      << ", \"peer_name\": " << json_string(e.peer >= 0 ? ep.peer_name(e.peer) : std::string())
      << ", \"rail\": " << e.rail << ", \"nic\": " << json_string(e.nic) << ", \"detail\": " << json_string(e.detail) << "}";
  }
  o << "]}";
  return o.str();
}

}  // namespace r2ccl::monitor
