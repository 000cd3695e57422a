// An endpoint: this process's listeners on every NIC, a channel to every peer, and the
// progress engine thread that drives them. The public face of csrc/core/ for the bindings
// and, later, the collectives. Knows nothing of collectives or JAX.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "core/identity.h"
#include "core/rail_state.h"
#include "core/request.h"

namespace r2ccl {

// One rail as the outside sees it (a copy; safe to hold).
struct RailStats {
  int rail = 0;
  int local_nic = 0, remote_nic = 0;
  std::string local_nic_name, local_addr, remote_addr;
  RailState state = RailState::kDown;
  std::string transport;        // "socket" or "ibverbs": what carries this rail
  double weight = 1.0;
  bool standby = false;         // a backup rail (set_rail_standby)
  uint64_t tx_bytes = 0, rx_bytes = 0;       // payload bytes written / applied
  uint64_t tx_chunks = 0, rx_chunks = 0;
  uint64_t acked_bytes = 0;                  // bytes the peer confirmed on this rail
  // Payload bytes the transport copied on the CPU for this rail (FrameLink::copied: through
  // verbs bounce buffers; 0 on sockets, whose copies are the kernel's, and on zero-copy paths).
  uint64_t tx_copied_bytes = 0, rx_copied_bytes = 0;
  uint64_t retransmitted_chunks = 0;         // chunks this rail carried for a failed sibling
  uint64_t inflight_bytes = 0;
  uint64_t unsent_bytes = 0;                 // of the data frame being written: payload not yet handed to the socket
  uint64_t failures = 0, recoveries = 0;
  uint64_t stalls = 0;                       // failures declared because acks stopped (black-hole detection)
  uint64_t window_bytes = 0;                 // its current in-flight window (RailPace)
  double pace_bw = 0;                        // its delivered bandwidth as the window sees it (bytes/s; 0: none yet)
  double rtt_us = 0;                         // last heartbeat round trip (0: none yet)
  double busy_s = 0;                         // time with bytes in flight (acked_bytes / busy_s: delivered rate)
  bool link_down = false;                    // its local NIC is held down (set_nic_state)
  Fault fault = Fault::kNone;   // injected on this side (Endpoint::inject)
  std::string last_error;
  FailReason last_reason = FailReason::kNone;   // why it last failed
  double last_change_unix_s = 0;
  double last_failure_unix_s = 0;  // when it last failed (0: never); a later recovery moves last_change only
};

// What a rail held when a fault was injected on it, measured on the engine thread at that
// moment: for kClose these are the chunks that move to the other rails.
struct InjectResult {
  uint64_t unacked_chunks = 0;
  uint64_t unacked_bytes = 0;
};

struct NicInfo {
  std::string name, ifname, addr;
};

class Engine;

// Threads. Every call below is safe from any thread except the engine's own (the thread
// that runs on_finish callbacks): those that ask the engine something wait for its answer
// (Engine::call), and from the engine thread they fail at once with kInternal instead of
// waiting for themselves (cancel and wait must not be called there at all: cancel would do
// nothing, wait would wait for itself). The exceptions are marked: post_send and post_recv
// only queue work; rank, world, addresses, config and nics read values fixed at construction.
// Held by std::shared_ptr (Python's handle, the executor, the monitor and the runtime share
// it): whoever holds it keeps it alive; close() stops it while others still hold it.
class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  // `secret` is the job's shared secret (any bytes, at least 16); `nics` name interfaces or
  // IPv4 addresses. Opens one listener per NIC and starts the progress engine.
  Endpoint(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
           const std::string& secret);
  // Another owner's endpoint (the NCCL net plugin's): `identity` says who peers are, which side
  // dials and what a rail proves (core/identity.h); `rank` and `world` only name this process.
  Endpoint(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
           std::unique_ptr<PeerIdentity> identity);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int rank() const;                             // any thread
  int world() const;                            // any thread
  std::vector<std::string> addresses() const;   // "ip:port" ("ibverbs:ip:port"), one per NIC, in NIC order; any thread
  std::vector<std::string> transports() const;  // "socket" or "ibverbs", one per NIC, in NIC order; any thread

  // Declares a peer and its listen addresses (its addresses()). With `open`, its rails start
  // connecting now; else on first use: the first request to or from the peer, open(), or the
  // peer's first rail (connections on demand: a process connects only to the peers its
  // collectives use).
  void add_peer(int peer, const std::vector<std::string>& addresses, bool open = true);
  void open(const std::vector<int>& peers);
  // Closes the peer in order and returns at once: its requests that hold caller memory end
  // now (kClosed, `why`); sends that already completed (eager: their bytes copied) are still
  // delivered, bounded by R2CCL_TIMEOUT, then the peer hears goodbye and is forgotten
  // (PeerIdentity::peer_removed). It may not be used again. A no-op for an unknown peer.
  void close_peer(int peer, const std::string& why);
  // Tests: the engine thread throws while handling `peer` (Engine::testing_throw_on).
  void testing_throw_on(int peer);
  // The peers whose rails are wanted (opened), in rank order.
  std::vector<int> opened_peers();
  // Waits until every rail to every given peer is up. Throws Error(kTimeout) naming the
  // rails still missing; rails that came up are kept. With degraded_after_s >= 0, returns
  // after that long once every peer has at least one rail up (a NIC down at start: the job
  // starts degraded, the missing rails are logged and keep re-dialling).
  void wait_ready(const std::vector<int>& peers, double timeout_s, double degraded_after_s = -1);

  // on_finish (optional) runs once on the engine thread when the request finishes: keep it
  // short, and do not call into this endpoint from it except post_send / post_recv. Any
  // thread, the engine's included (the request is queued, never waited for).
  // tag_once: no other message to (from) this peer uses `tag` (Request::tag_once).
  std::shared_ptr<Request> post_send(int peer, uint64_t tag, const void* buf, uint64_t len,
                                     std::function<void()> on_finish = {}, bool tag_once = false);
  std::shared_ptr<Request> post_recv(int peer, uint64_t tag, void* buf, uint64_t len,
                                     std::function<void()> on_finish = {}, bool tag_once = false);
  // Posts a request the caller built (Request::up_to_len and the other flags set first).
  void post(const std::shared_ptr<Request>& req);
  // Stops the engine touching a request's buffer and fails it (no-op once finished).
  void cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why);
  const Config& config() const;
  // Waits for a request. On deadline the request is cancelled (the engine stops touching its
  // buffer before this returns) and Error(kTimeout) is thrown. timeout_s < 0: R2CCL_TIMEOUT.
  void wait(const std::shared_ptr<Request>& req, double timeout_s);
  // Never waits: true once the request has finished (then its error, if any, is in it). A
  // small request's socket work may run on this thread for one pass (Engine::test).
  bool test(const std::shared_ptr<Request>& req);

  std::vector<RailStats> rail_stats(int peer);
  // Every peer's rails in one call into the engine thread (what the health monitor samples).
  std::map<int, std::vector<RailStats>> all_rail_stats();
  // Software fault injection on this side of one rail; sticky until Fault::kNone.
  // kClose: the connection is shut and not re-admitted; kStall: nothing is read or written;
  // kRate: writes are capped at rate_bytes_per_s. Returns what the rail held unacknowledged
  // at that moment (a close that returns zero chunks landed between transfers).
  InjectResult inject(int peer, int rail, Fault fault, double rate_bytes_per_s);
  // The health monitor's seam: relative share of new chunks for a rail (0 = none). A rail's
  // in-flight window and its chunk size scale with weight / (largest weight of the channel).
  void set_rail_weight(int peer, int rail, double weight);
  // A backup rail: it carries chunks only while none of the peer's other rails is up (the NCCL
  // plugin's per-NIC devices: the device's own NIC is the primary, the host's other NICs are
  // backups). Its heartbeats run as any rail's, so it is known healthy when it is needed.
  void set_rail_standby(int peer, int rail, bool standby);
  // The health monitor's other seam: link state of local NIC `nic` (index into the NICs
  // given at construction). Down: every rail over it fails now (its unacknowledged chunks
  // move to other rails), each peer is told on a live rail so it fails its end too, and
  // none is re-dialled until the NIC is declared up again, which re-dials at once.
  void set_nic_state(int nic, bool up, const std::string& why);
  // Each local NIC: as given, its kernel interface (empty if unknown), its IPv4 address.
  std::vector<NicInfo> nics() const;
  // Registers [base, base + len) with every transport of this endpoint (RDMA: with every
  // device), for zero-copy transfers: a send from it goes by one-sided writes where the
  // receiver advertised a registered receive, and a receive into it is advertised to its
  // sender. Requests find their registration by address when posted and keep it until they
  // are destroyed; deregister_memory drops the endpoint's hold. Any thread; returns the id.
  // Throws Error(kSystem) naming the transport when the memory cannot be registered.
  uint64_t register_memory(const void* base, size_t len);
  // The same for memory a dma-buf backs (`fd`, the region at `offset` in it; the caller may
  // close fd when this returns): ibv_reg_dmabuf_mr on every device. Every transport in use
  // must take dma-bufs (Transport::dmabuf_support), else Error(kInvalidArgument) says why.
  // The memory must still be readable by the CPU at `base` (host memory exported through
  // udmabuf, say): a chunk no one-sided write can carry goes in frames, a CPU copy. Device
  // memory needs every chunk written one-sided, which the channel does not enforce yet
  // (docs/design.md §10, GPUDirect).
  uint64_t register_dmabuf(const void* base, size_t len, int fd, uint64_t offset);
  // Empty when every transport of this endpoint takes dma-buf registrations; else why not.
  std::string dmabuf_support() const;
  void deregister_memory(uint64_t id);
  // Peers added so far.
  std::vector<int> peers();
  // How logs and errors name a peer ("rank 3", "NCCL send connection 7"); any thread.
  std::string peer_name(int peer) const;
  // Bytes held for messages that arrived before their receive was posted.
  uint64_t staged_bytes();
  // Messages from `peer` that no receive has claimed yet: (tag, their first `n` bytes), for
  // those whose first n bytes are here. Any thread but the engine's.
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> staged_heads(int peer, size_t n);

  // Says goodbye to every peer and stops the engine. Pending requests fail with kClosed.
  void close();

  // Tests only: occupy the engine thread for `seconds`; set how long calls into the engine
  // wait for it; make a call into the engine from the engine thread (its error text).
  void testing_block_engine(double seconds);
  void testing_set_call_timeout(double seconds);
  std::string testing_call_from_engine_thread();
  // Whether a caller's test() holds the test lease now (engine.h; tests/cpp/test_endpoint_poll.cc).
  bool testing_test_lease_held() const;

 private:
  std::unique_ptr<Engine> engine_;
};

}  // namespace r2ccl
