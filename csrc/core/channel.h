// Rails and channels: the state the progress engine keeps for every peer. A rail is one
// connection over one NIC pair; a channel is every rail to one peer plus the message state
// that makes striping lossless (sequence numbers, retransmit window, acks, dedup).
// Engine-thread only. Knows nothing of collectives or JAX; sockets only through net/.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/endpoint.h"
#include "core/rail_pace.h"
#include "core/request.h"
#include "core/wire.h"
#include "net/transport.h"

namespace r2ccl {

// kDown -> kConnecting (connector dials) -> kHandshake (secret proven both ways) -> kUp.
// Any error, stall or silence: -> kDown; the connector side re-dials after R2CCL_REPROBE_MS.
enum class RailState { kConnecting, kHandshake, kUp, kDown };
const char* rail_state_name(RailState s);

// Why a rail failed: decides what follows (a broken protocol counts against the peer, a
// connection the peer closed may mean the peer is gone) and is reported in rail_stats.
enum class FailReason {
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
};
inline constexpr const char* kFailReasonNames[] = {"io",       "closed_by_peer", "protocol",       "checksum", "stalled",
                                                   "silent",   "injected",       "link_down",      "peer_link_down",
                                                   "replaced"};
inline const char* fail_reason_name(FailReason r) { return kFailReasonNames[static_cast<int>(r)]; }

// What the engine's epoll reports: which object an fd belongs to.
struct Pollable {
  enum Kind { kWake, kListener, kPending, kRail } kind;
  void* obj = nullptr;
  int index = 0;     // listener: NIC index
  int fd = -1;       // the fd registered, to ignore events for a replaced connection
};

struct TxFrame {
  bool active = false;
  bool is_data = false;
  bool is_ack = false;
  uint64_t seq = 0;
  uint8_t hdr[kHeaderBytes];
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
  size_t done = 0;                 // bytes of header + payload written
  std::vector<uint8_t> owned;      // payload storage of control frames (and of cancelled data)
  size_t total() const { return kHeaderBytes + payload_len; }
};

struct RxFrame {
  uint8_t hdr[kHeaderBytes];
  size_t hdr_got = 0;
  FrameHeader h;
  bool in_payload = false;
  uint8_t* dest = nullptr;
  bool scratch = false;            // payload is read and dropped (duplicate or abandoned message)
  std::vector<uint8_t>* grow = nullptr;   // staging that grows as the payload arrives (unexpected message)
  size_t got = 0;
  std::vector<uint8_t> ctrl;       // payload of control frames
  void reset() { hdr_got = 0; in_payload = false; dest = nullptr; scratch = false; grow = nullptr; got = 0; }
};

struct Channel;

struct Rail {
  Channel* ch = nullptr;
  int index = 0, local_nic = 0, remote_nic = 0;
  RailState state = RailState::kDown;
  std::unique_ptr<Connection> conn;
  Pollable poll{Pollable::kRail};
  uint32_t events = 0;             // epoll interest currently registered
  uint32_t epoch = 0;
  bool ever_up = false;
  double weight = 1.0;             // the health monitor's seam (set_rail_weight)
  double vtime = 0;                // weighted-fair dealing of chunks

  // connector handshake
  uint8_t hello[kHelloBytes];
  int64_t attempt_deadline_ns = 0;
  int64_t next_attempt_ns = 0;

  TxFrame cur;
  std::deque<TxFrame> ctrl;
  uint64_t inflight = 0;           // bytes dealt to this rail and not yet acknowledged
  RailPace pace;                   // its window, chunk size and drain allowance
  // Time with bytes in flight: acked bytes over busy time is what the rail delivers when it
  // has work (the health monitor's bandwidth estimate), whatever the demand.
  int64_t busy_ns = 0, busy_since_ns = 0;
  RxFrame rx;
  std::vector<std::pair<uint64_t, uint64_t>> acks;   // seq ranges to acknowledge
  uint64_t cum_sent = 1;           // the cumulative ack point last sent on this rail

  int64_t last_rx_ns = 0, last_tx_ns = 0, last_ack_ns = 0, progress_ns = 0, changed_ns = 0;
  int64_t rtt_ns = 0;              // last heartbeat round trip (0: none yet)
  bool closed_by_peer = false;     // the established connection ended by EOF or reset (not silence)
  bool refused = false;            // the last connect attempt was actively refused

  Fault fault = Fault::kNone;
  double rate_bps = 0, tokens = 0;
  int64_t tokens_ns = 0, next_tx_ns = 0;

  uint64_t tx_bytes = 0, rx_bytes = 0, tx_chunks = 0, rx_chunks = 0, acked_bytes = 0;
  uint64_t retransmitted = 0, failures = 0, recoveries = 0, stalls = 0;
  std::string last_error;
  const char* last_reason = "";    // fail_reason_name of its last failure
  double changed_unix_s = 0;
};

struct Chunk {
  uint64_t seq = 0;
  std::shared_ptr<Request> req;
  uint64_t offset = 0;
  uint32_t len = 0;
  int rail = -1;
  int64_t dealt_ns = 0;            // when it was last handed to a rail
  bool resend = false;
  bool void_ = false;              // the send was cancelled: tells the receiver to abandon it
};

// A message being received, keyed by the sender's msg_id.
struct InMsg {
  uint64_t tag = 0;
  uint32_t tag_seq = 0;
  uint64_t len = 0;
  uint64_t received = 0;
  std::shared_ptr<Request> req;    // the matching receive, once posted
  // A message that began before its receive was posted lands chunk by chunk here (offset ->
  // payload) until whole, then is copied once into the receive. Each chunk's storage grows
  // with the bytes that actually arrive (RxFrame::grow), never by what a header announces.
  bool staged = false;
  std::map<uint64_t, std::vector<uint8_t>> chunks;
  uint64_t staged_bytes() const {
    uint64_t n = 0;
    for (auto& [off, v] : chunks) n += v.size();
    return n;
  }
  bool discard = false;            // matched receive failed or was cancelled: drop bytes
  bool aborted = false;            // the sender cancelled it
  bool complete = false;
};

struct Channel {
  int peer = 0;
  bool connector = false;          // this side dials (and re-dials) every rail
  std::vector<NetAddr> remote;
  std::vector<std::unique_ptr<Rail>> rails;

  // send direction
  std::deque<std::shared_ptr<Request>> sendq;      // not yet cut into chunks
  std::deque<Chunk> retx;                          // chunks of failed rails, sent first
  std::map<uint64_t, Chunk> window;                // dealt, not yet acknowledged
  std::vector<std::shared_ptr<Request>> sends;     // unfinished sends
  uint64_t next_seq = 1, next_msg_id = 1;
  std::unordered_map<uint64_t, uint32_t> tx_tag_seq;
  double vclock = 0;

  // receive direction
  uint64_t rx_cum = 1;                             // every seq below has been applied
  std::set<uint64_t> rx_ooo;                       // applied seqs above rx_cum
  std::unordered_map<uint64_t, InMsg> inmsgs;
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<Request>> posted;
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> unexpected;
  std::unordered_map<uint64_t, uint32_t> rx_tag_seq;
  std::vector<std::pair<uint64_t, uint64_t>> orphan_acks;   // acks whose rail failed

  bool dead = false;
  Cause dead_cause = Cause::kSystem;
  std::string dead_msg;
  bool bye_received = false;
  int64_t all_down_since = 0;
  int64_t last_probe_ns = 0;
  int protocol_errors = 0;       // acceptor side: last liveness probe of the peer's listener

  bool seq_applied(uint64_t s) const { return s < rx_cum || rx_ooo.count(s) != 0; }
  void mark_applied(uint64_t s) {
    rx_ooo.insert(s);
    while (!rx_ooo.empty() && *rx_ooo.begin() == rx_cum) { rx_ooo.erase(rx_ooo.begin()); ++rx_cum; }
  }
  int rails_up() const {
    int n = 0;
    for (auto& r : rails) n += r->state == RailState::kUp;
    return n;
  }
};

}  // namespace r2ccl
