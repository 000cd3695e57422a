// A channel: every rail to one peer plus the message state that makes striping lossless
// (sequence numbers, weighted dealing, windows, acks, retransmit, dedup, matching, failover
// and failback decisions, stall and silence detection). ChannelCore is a state machine:
// frames and time come in as calls, frames go out through each rail's queue, and the few
// things only a transport can do (write a queued frame, end a connection, dial again) are
// asked of a RailIo. No file descriptor, socket or clock in here: the engine drives it over
// TCP, tests/cpp/test_channel_sim.cc over an in-memory transport with a seeded schedule.
// One thread at a time (the engine's). Knows nothing of sockets, collectives or JAX.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/config.h"
#include "core/rail_pace.h"
#include "core/rail_state.h"
#include "core/request.h"
#include "core/wire.h"

namespace r2ccl {

// RailState, FailReason: core/rail_state.h.

// A frame to write: a header and a payload (the caller's buffer for data, `owned` for
// control frames and for cancelled data). `done` counts the bytes the transport has taken.
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
  // A written chunk (kFlagWritten): the payload goes by one-sided write to the peer's memory
  // at remote_addr through remote_key, the frame itself carries none. `req`: the data frame's
  // request (whose registered memory the write reads).
  const Request* req = nullptr;
  bool written = false;
  uint64_t remote_addr = 0;
  uint32_t remote_key = 0;
  size_t total() const { return kHeaderBytes + payload_len; }
};
// Fills `f` with a control frame (its payload moves into f->owned).
void encode_control(TxFrame* f, FrameType t, std::vector<uint8_t> payload, uint64_t seq = 0, uint8_t flags = 0);

// A frame being received. The transport fills hdr and decodes it into h; the channel
// (on_header) says where the payload goes: dest, a growing staging buffer, scratch (read and
// dropped) or ctrl (control frames).
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
  // A copy of a chunk that another rail is landing at the same moment (a retransmit racing
  // its original) lands here instead, through `grow`, and is placed only once it has passed
  // its checks: one bad copy must not overwrite where the good one landed.
  std::vector<uint8_t> side;
  bool to_side = false;
  void reset() {
    hdr_got = 0;
    in_payload = false;
    dest = nullptr;
    scratch = false;
    grow = nullptr;
    got = 0;
    to_side = false;
    side.clear();
  }
};

// One rail as the channel sees it: its state, queues, window and counters.
struct Rail {
  int index = 0, local_nic = 0, remote_nic = 0;
  RailState state = RailState::kDown;
  bool ever_up = false;
  bool paused = false;             // the transport neither reads nor writes it (injected stall)
  int64_t hold_until_ns = 0;       // the transport can take no frame before (rate cap)
  double weight = 1.0;             // the health monitor's seam (set_rail_weight)
  bool standby = false;            // a backup: dealt chunks only while no other rail is up (set_rail_standby)
  double vtime = 0;                // weighted-fair dealing of chunks

  TxFrame cur;
  std::deque<TxFrame> ctrl;
  uint64_t inflight = 0;           // bytes dealt to this rail and not yet acknowledged
  uint64_t eager_inflight = 0;     // of which eager sends' (lazily acked: they measure no rate)
  RailPace pace;                   // its window, chunk size and drain allowance
  // Time with bytes in flight: acked bytes over busy time is what the rail delivers when it
  // has work (the health monitor's bandwidth estimate), whatever the demand.
  int64_t busy_ns = 0, busy_since_ns = 0;
  RxFrame rx;
  std::vector<std::pair<uint64_t, uint64_t>> acks;   // seq ranges to acknowledge
  // What `acks` covers of eager chunks (their sender does not wait for the ack): those acks
  // go out in a batch (ChannelSettings::lazy_ack_bytes / kLazyAckChunks) or at the next
  // tick. Any other chunk (ack_now) is acknowledged as soon as the rail has been read.
  uint64_t lazy_bytes = 0;
  int lazy_chunks = 0;
  bool ack_now = false;
  // Data bytes (not eager) read since this rail's last ack frame: at read_pass_bytes the
  // acks go out without waiting for the rail to be read dry (rx_pass_end).
  uint64_t rx_unacked = 0;
  // Data bytes dealt to this rail since a chunk last asked for its ack (kFlagAckAsk).
  uint64_t dealt_since_ask = 0;
  uint64_t cum_sent = 1;           // the cumulative ack point last sent on this rail
  uint64_t downs = 0;              // times it went from up to down (any reason): a link's generation
  // Fence notices this rail's link has carried: rail -> that rail's `downs` when it was told
  // (cleared when this rail goes down: its queued notices are lost with its link).
  std::map<int, uint64_t> fences_told;

  int64_t last_rx_ns = 0, last_tx_ns = 0, last_ack_ns = 0, progress_ns = 0, changed_ns = 0;
  int64_t failed_ns = 0;           // when it last failed (0: never)
  int64_t rtt_ns = 0;              // last heartbeat round trip (0: none yet)
  // Resting (ChannelSettings::rest_heartbeat_ns): the peer said, in its last heartbeat or
  // echo on this rail, that it beats slowly; this end said so on this rail (only then may it).
  bool peer_resting = false, rest_announced = false;
  bool closed_by_peer = false;     // the established connection ended by EOF or reset (not silence)
  bool said_bye = false;           // the peer's goodbye came on it: nothing follows on this rail

  uint64_t tx_bytes = 0, rx_bytes = 0, tx_chunks = 0, rx_chunks = 0, acked_bytes = 0;
  uint64_t retransmitted = 0, failures = 0, recoveries = 0, stalls = 0;
  std::string last_error;
  FailReason last_reason = FailReason::kNone;   // why it last failed
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
  bool written = false;            // dealt as a written chunk (one-sided write) to `rail`
  // Rails (with their `downs` then) that wrote this chunk and failed before it was
  // acknowledged: a write of it may still be on its way there. Before a rail carries the chunk
  // again, the peer is told to fence each of them (the late-write rule, docs/design.md §10).
  std::vector<std::pair<int, uint64_t>> fences;
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
  bool abort_mismatch = false;     // ... because its collective did not match (kFlagAbortMismatch)
  bool complete = false;
};

struct Channel {
  int peer = 0;
  std::vector<std::unique_ptr<Rail>> rails;

  // send direction
  std::deque<std::shared_ptr<Request>> sendq;      // not yet cut into chunks
  std::deque<Chunk> retx;                          // chunks of failed rails, sent first
  std::map<uint64_t, Chunk> window;                // dealt, not yet acknowledged
  std::vector<std::shared_ptr<Request>> sends;     // unfinished sends
  // Eager sends (finished when copied) until every chunk is acknowledged, and the bytes
  // their copies hold. `undelivered`: some were abandoned (every rail down past
  // R2CCL_TIMEOUT); the next request on the channel fails with this, then it is cleared.
  std::vector<std::shared_ptr<Request>> eager_sends;
  uint64_t eager_held = 0;
  std::string undelivered;
  uint64_t next_seq = 1, next_msg_id = 1;
  std::unordered_map<uint64_t, uint32_t> tx_tag_seq;
  double vclock = 0;
  // The peer's adverts (kAdvert), by the message they are for, oldest first in advert_order;
  // at most kMaxAdverts are kept (an advert dropped only costs its message the copy path).
  std::map<std::pair<uint64_t, uint32_t>, AdvertBody> adverts;
  std::deque<std::pair<uint64_t, uint32_t>> advert_order;
  bool peer_advertises = false;                    // an advert came: registered sends wait for theirs

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
  bool closing = false;            // this side closes it in order (begin_close): its rails' ends are not faults
  int64_t active_ns = 0;           // the last tick that found it with work (tick)
  bool resting = false;            // nothing to do for rest_heartbeat_ns: heartbeats slow down
  int64_t all_down_since = 0;
  int protocol_errors = 0;

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

// What a channel asks of the transport that carries its rails. Called from inside the
// channel's own calls; none of these may call back into the channel.
class RailIo {
 public:
  virtual ~RailIo() = default;
  // Rail `rail` has a frame queued (Rail::cur is active): write it now or when writable, and
  // report each frame written whole with ChannelCore::frame_written.
  virtual void kick(int rail) = 0;
  // The channel failed the rail (or ended the channel): end its connection now; the rail's
  // queues are already cleared. `was_up`: it carried traffic (else it was still connecting).
  virtual void drop(int rail, bool was_up) = 0;
  // The peer reports the far end of a down rail up again: dial now if this side dials.
  virtual void redial(int rail) = 0;
  // The payload of the rail's frame being written (Rail::cur) was copied into cur.owned (its
  // send was cancelled, so its buffer goes back to the caller): write the rest from there.
  virtual void payload_moved(int rail) = 0;
  // The payload of the frame being received on the rail (Rail::rx) is to be dropped from now
  // on (rx.scratch: its receive was cancelled or failed, its buffer may go back to the
  // caller): land no more of it where it went.
  virtual void recv_dropped(int rail) = 0;

  // One-sided writes, optional (a transport without them keeps these defaults: every chunk
  // travels in its frame). advertise: `recv`'s memory can take the peer's writes; fill in
  // where (addr, len) and one key per local NIC (0 where a NIC cannot), and return true.
  virtual bool advertise(const Request& recv, AdvertBody* out) {
    (void)recv;
    (void)out;
    return false;
  }
  // Rail `rail` can now write `len` bytes of `send`'s payload straight into the peer's memory
  // (its link writes that much at once, and the payload's memory is registered for it).
  virtual bool writes(int rail, const Request& send, uint64_t len) {
    (void)rail;
    (void)send;
    (void)len;
    return false;
  }
  // `recv` was advertised and is cancelled: its keys must stop working before this returns
  // (its buffer goes back to the caller), so a write still on its way fails at the sender
  // (FailReason::kAbandoned) instead of landing.
  virtual void revoke(const Request& recv) { (void)recv; }
};

// The most adverts a channel keeps (an advert whose message went by copy is never used).
inline constexpr size_t kMaxAdverts = 1024;
// The most payload the engine reads from one rail before it turns to the others (the read
// pass; engine_rail_io.cc), and the data a rail reads before its acks go out even though it
// is not read dry. Equal passes make every rail that has data get the same service when the
// cores, not the links, set the pace, so no rail's delivered rate (and window) grows on
// scheduling luck; the ack at the end of a pass keeps a fast sender's window from running
// empty while the receiver works through a long burst. Measured (issue 14, BENCHMARKS.md).
inline constexpr uint64_t kReadPassBytes = 1 << 20;

// Settings a channel runs by (from Config; tests make them small).
struct ChannelSettings {
  bool crc = false;
  int64_t stall_ns = 250 * 1000000LL;
  int64_t heartbeat_ns = 100 * 1000000LL;
  int heartbeat_misses = 3;
  int64_t rest_heartbeat_ns = 0;             // a connection at rest beats this slowly (0: never rests)
  int64_t timeout_ns = 30 * 1000000000LL;
  RailPaceLimits pace;
  uint64_t eager_bytes = 0;                 // sends up to this size are eager (0: none)
  uint64_t eager_held_bytes = kEagerHeldBytes;   // most bytes of eager copies awaiting acks
  uint64_t lazy_ack_bytes = 16 << 10;       // eager bytes whose acks wait at most
  uint64_t read_pass_bytes = kReadPassBytes;  // data bytes read before acks go out undrained
  // A send from registered memory to a peer that advertises its receives waits
  // R2CCL_ADVERT_WAIT_MS (and at most until the engine's next tick after it) for its own
  // receive's advert before it goes in frames: a receive posted a moment after the send still
  // gets the whole message by one-sided writes. NCCL's IB transport waits for its receiver's
  // FIFO entry without a bound; a bound keeps a receiver that posts late, or posts
  // unregistered memory, from holding the sender.
  int64_t advert_wait_ns = int64_t{Config().advert_wait_ms} * 1000000LL;   // R2CCL_ADVERT_WAIT_MS
  static ChannelSettings from(const Config& cfg);
};

class ChannelCore {
 public:
  // `rail_names`: one per rail, for logs and errors ("rail 1 to rank 3 (eth1 ... -> ...)").
  ChannelCore(int peer, std::string peer_name, std::vector<std::string> rail_names,
              const std::vector<std::pair<int, int>>& nic_pairs, const ChannelSettings& set, RailIo* io,
              int64_t now);

  Channel ch;   // its state: read by stats and tests; written only through the calls below
  const ChannelSettings& settings() const { return set_; }

  // requests (the request's peer is this channel's)
  void submit(const std::shared_ptr<Request>& req, int64_t now);
  void cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why, int64_t now);
  void set_weight(int rail, double w, int64_t now);
  void set_standby(int rail, bool standby, int64_t now);

  // rails: the transport finished a handshake / lost a connection (or the channel decides to).
  void rail_up(int rail, int64_t now);
  // A heartbeat on an up rail now: the connector's first frame on a new connection, which
  // tells the acceptor that this end trusts it with one-sided writes (Engine::link_up).
  void greet(int rail, int64_t now);
  void fail_rail(int rail, FailReason reason, const std::string& why, int64_t now);
  // The transport stopped / resumed reading and writing a rail (an injected stall).
  void set_paused(int rail, bool paused, int64_t now);

  // frames in, on an up rail: the header is in r.rx.h. on_header says where the payload goes
  // (false: the rail failed); on_frame: the payload is in place. rx_pass_end: the transport
  // stopped reading the rail for now, `drained`: it has read all there is (acks go out), or
  // not (acks go out once read_pass_bytes of data wait for them).
  bool on_header(int rail, int64_t now);
  void on_frame(int rail, int64_t now);
  void rx_pass_end(int rail, int64_t now, bool drained);
  // Bytes of the current frame arrived / left (the rail is not silent, not idle).
  void rx_progress(int rail, int64_t now) { ch.rails[static_cast<size_t>(rail)]->last_rx_ns = now; }
  void tx_progress(int rail, int64_t now) { ch.rails[static_cast<size_t>(rail)]->last_tx_ns = now; }
  // frames out: the transport wrote Rail::cur whole; the next queued frame becomes cur.
  void frame_written(int rail, int64_t now);
  // The transport's own frames on a rail that is not up (its handshake), and its moves
  // through kConnecting and kHandshake, or back to kDown when an attempt fails (`why`).
  void transport_frame(int rail, TxFrame f);
  void link_state(int rail, RailState s, const std::string& why = "");
  // The transport can take no frame on `rail` before `until_ns` (its software rate cap; 0:
  // it can now). Pacing only: the channel deals nothing to a held rail.
  void hold_rail(int rail, int64_t until_ns) { ch.rails[static_cast<size_t>(rail)]->hold_until_ns = until_ns; }
  // The rail's window: its share of its NIC's measured rate among the rails busy on that NIC
  // (RailPace::share_window); the transport measures the NIC, the channel keeps the window.
  void share_window(int rail, double nic_rate, int busy_rails) {
    ch.rails[static_cast<size_t>(rail)]->pace.share_window(nic_rate, busy_rails);
  }
  // Deals chunks to rails that are free to take one.
  void pump(int64_t now);
  // Timers: stalls (with each local NIC's drain time, indexed by local_nic), silence,
  // heartbeats, the cumulative ack, and requests whose rails have all been down too long.
  void tick(int64_t now, const std::vector<int64_t>& nic_drain_ns);
  // Tells the peer, on an up rail of another NIC, that rail `rail`'s local link went down or up.
  void send_rail_state(int rail, bool up, int64_t now);
  // Queues a goodbye on every up rail (the endpoint is closing), after every ack owed. The
  // peer ends the channel when it reads one: nothing sent after it is promised.
  void goodbye();
  // This side closes the channel in order: every unfinished request that holds its caller's
  // memory (receives, sends not yet complete) ends with `cause`; eager sends, complete and
  // copied, stay until acknowledged; from now on a rail that ends is logged as no fault.
  void begin_close(Cause cause, const std::string& why, int64_t now);
  // Eager sends not yet acknowledged: asks the peer for its acks now (a heartbeat on every
  // up rail; the peer flushes its acks on one). Returns how many such sends remain.
  size_t request_acks(int64_t now);
  // Ends the channel: every request fails with `cause`; messages that arrived whole stay
  // deliverable to later receives.
  void kill(Cause cause, const std::string& why);

  const std::string& peer_name() const { return peer_name_; }
  const std::string& rail_name(int rail) const { return rail_names_[static_cast<size_t>(rail)]; }
  // Bytes held for messages that arrived before their receive was posted.
  uint64_t staged_bytes() const;
  // Unclaimed messages: (tag, first n bytes) of those whose first n bytes arrived.
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> staged_heads(size_t n) const;

 private:
  void queue_ctrl(Rail& r, FrameType t, std::vector<uint8_t> payload, uint64_t seq = 0, uint8_t flags = 0);
  void queue_heartbeat(Rail& r, int64_t now, const uint8_t* echoed);
  bool next_chunk(Chunk* c, uint64_t max_len, int64_t now);
  // A registered send not yet begun, to a peer that advertises, whose advert is not here yet
  // and may still come (ChannelSettings::advert_wait_ns).
  bool awaits_advert(const Request& req, int64_t now) const;
  void on_ack(uint64_t first, uint64_t last, int64_t now);
  void post_recv(const std::shared_ptr<Request>& req);
  void advertise(const std::shared_ptr<Request>& req);
  // Fails a request; an advertised receive's keys are revoked first (RailIo::revoke).
  void end_request(const std::shared_ptr<Request>& req, Cause cause, const std::string& why);
  void forget_advert(const Request& send);
  // Queues on `r` a fence notice for every rail `c` was written on that `r` has not told
  // the peer of yet; true when it queued any (then `c` waits for the next turn).
  bool tell_fences(Rail& r, const Chunk& c);
  bool applied(uint64_t seq) const;
  InMsg* open_inmsg(const FrameHeader& h);
  void data_frame(Rail& r);
  void control_frame(Rail& r, int64_t now);
  void finish_inmsg(uint64_t msg_id);
  void redirect_to_scratch(uint64_t msg_id);
  // Chunk `seq` was applied from `rail`: copies of it other rails are still reading land nowhere.
  void drop_other_copies(uint64_t seq, int rail);
  void flush_acks(Rail& r);
  void expire(int64_t now);
  // A send's chunks not yet acknowledged become abort marks (the receiver learns the message
  // is abandoned; sequence numbers stay dense). A cancel, or an eager send undeliverable.
  // Returns the rails whose frame being written is a one-sided write of it (to be failed).
  std::vector<int> abandon_send(const std::shared_ptr<Request>& req);
  void eager_acked(const std::shared_ptr<Request>& req);
  // The data frame being written on `r` takes a copy of its payload (cur.owned): the buffer
  // it pointed into is about to go back to its caller (or be freed).
  void own_payload(Rail& r);

  std::string peer_name_;
  std::vector<std::string> rail_names_;
  ChannelSettings set_;
  RailIo* io_;
};

}  // namespace r2ccl
