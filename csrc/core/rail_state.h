// A rail's state, why it last failed and the fault injected on it: the enums the channel and
// engine keep and RailStats carries across the boundary (the monitor and engine compare them as
// values, never as text). Each has its names in enum order, exported to Python as
// _core.names() ("rail_states", "fail_reasons", "faults"). Knows nothing of sockets.
#pragma once
#include <cstddef>
#include <iterator>

namespace r2ccl {

// kDown -> kConnecting (connector dials) -> kHandshake (secret proven both ways) -> kUp.
// Any error, stall or silence: -> kDown; the connector side re-dials after R2CCL_REPROBE_MS.
// The transport moves a rail through kConnecting and kHandshake; the channel sees kUp and kDown.
enum class RailState { kConnecting, kHandshake, kUp, kDown };
inline constexpr const char* kRailStateNames[] = {"connecting", "handshake", "up", "down"};

// Why a rail failed: decides what follows (a broken protocol counts against the peer, a
// connection the peer closed may mean the peer is gone) and is reported in rail_stats.
enum class FailReason {
  kNone,          // it never failed
  kIo,            // a send or receive failed
  kClosedByPeer,  // EOF or reset from the other end
  kProtocol,      // a frame broke the wire protocol
  kChecksum,      // a payload's CRC32C did not match
  kStalled,       // acks stopped beyond the rail's drain time while siblings progress
  kSilent,        // nothing received for R2CCL_HEARTBEAT_MISSES heartbeat periods
  kInjected,      // fault injection
  kLinkDown,      // this side's NIC is down (health monitor or set_nic_state)
  kPeerLinkDown,  // the peer reports its end's link down
  kReplaced,      // the peer dialled a new connection for this rail
  // A one-sided write met memory its receiver had taken back (the receive was cancelled and
  // its advertised keys revoked): the message is abandoned, the rail is not at fault.
  kAbandoned,
};
inline constexpr const char* kFailReasonNames[] = {"",         "io",        "closed_by_peer", "protocol",
                                                   "checksum", "stalled",   "silent",         "injected",
                                                   "link_down", "peer_link_down", "replaced", "abandoned"};

// Software fault injection on one side of a rail (Endpoint::inject); sticky until kNone.
enum class Fault { kNone, kClose, kStall, kRate };
inline constexpr const char* kFaultNames[] = {"", "close", "stall", "rate"};

static_assert(std::size(kRailStateNames) == static_cast<size_t>(RailState::kDown) + 1, "a RailState without a name");
static_assert(std::size(kFailReasonNames) == static_cast<size_t>(FailReason::kAbandoned) + 1,
              "a FailReason without a name");
static_assert(std::size(kFaultNames) == static_cast<size_t>(Fault::kRate) + 1, "a Fault without a name");

inline const char* rail_state_name(RailState s) { return kRailStateNames[static_cast<size_t>(s)]; }
inline const char* fail_reason_name(FailReason r) { return kFailReasonNames[static_cast<size_t>(r)]; }
inline const char* fault_name(Fault f) { return kFaultNames[static_cast<size_t>(f)]; }

}  // namespace r2ccl
