// A monitor's snapshot as JSON: what a host program that holds no Python objects hands out
// (the NCCL net plugin's r2ccl_nccl_plugin_health_v1, read by jax_r2ccl.health()). The same
// fields as the Python snapshot (jax_r2ccl/transport/health.py) for rails and NICs, the peer
// named as the engine names it, and the monitor's latest events.
#pragma once
#include <string>

#include "core/endpoint.h"
#include "monitor/monitor.h"

namespace r2ccl::monitor {

// {"rails": [{"peer", "peer_name", "rail", "nic", "transport", "state", "standby", "weight",
//   "bandwidth_Bps", "rtt_us", "tx_bytes", "rx_bytes", "acked_bytes", "inflight_bytes",
//   "retransmitted_chunks", "failures", "recoveries", "last_event", "last_error"}...],
//  "nics": [{"name", "ifname", "addr", "link_up", "admitted", "source", "link_downs"}...],
//  "events": [{"seq", "t_unix", "kind", "peer", "peer_name", "rail", "nic", "detail"}...]}
// with at most `max_events` events, the newest.
std::string health_json(Monitor& mon, const Endpoint& ep, size_t max_events = 64);

// `s` as a JSON string literal (quotes included; control characters escaped).
std::string json_string(const std::string& s);

}  // namespace r2ccl::monitor
