// The progress engine: one thread per endpoint that owns every link, rail and channel.
// Callers talk to it through posted commands; it sleeps in epoll when idle. It carries the
// channels (channel.h) over the registry's transports (net/registry.h): it dials, accepts and
// authenticates links, frames bytes in and out of them, keeps timers, closes peers in order
// and hands frames and time to each peer's ChannelCore. Knows nothing of collectives or JAX.
#pragma once
#include <sys/epoll.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "core/channel.h"
#include "core/handshake.h"
#include "core/identity.h"
#include "core/endpoint.h"
#include "net/registry.h"
#include "net/transport.h"

namespace r2ccl {

// What the engine's epoll reports: which object an fd belongs to.
struct Pollable {
  enum Kind { kWake, kListener, kPending, kRail } kind;
  void* obj = nullptr;
  int index = 0;     // listener: NIC index
  int fd = -1;       // the fd registered, to ignore events for a replaced connection
};

// An accepted connection that has not yet proven it belongs to the job.
struct Pending {
  std::unique_ptr<FrameLink> link;
  Pollable poll{Pollable::kPending};
  int nic = 0;
  AcceptorHandshake hs;                      // hello, challenge, auth (core/handshake.h)
  bool parked = false;            // hello names a peer not yet added; wait for add_peer
  bool dead = false;
  RxFrame rx;
  bool piece_posted = false;
  int64_t deadline_ns = 0;
  std::string desc;
};

struct Peer;

// One rail's connection and its software faults: the part of a rail that is the transport's
// (the channel keeps the rest, channel.h).
struct Link {
  Peer* peer = nullptr;
  int index = 0;
  std::unique_ptr<FrameLink> link; // the transport's link (net/transport.h); null while down
  uint64_t generation = 0;         // bumped whenever `link` is replaced or dropped
  bool posted = false;             // Rail::cur is posted to the link (its cookie: `cookie`)
  uint64_t cookie = 0;
  bool piece_posted = false;       // receive space for Rail::rx's payload is posted
  Pollable poll{Pollable::kRail};
  uint32_t events = 0;             // epoll interest currently registered
  uint32_t epoch = 0;
  bool flushing = false;           // inside rail_flush (a kick from within is a no-op)
  ConnectorHandshake hs;           // this attempt's side of the handshake (core/handshake.h)
  int64_t attempt_deadline_ns = 0;
  int64_t next_attempt_ns = 0;
  bool refused = false;            // the last connect attempt was actively refused
  // The peer's end of this link accepts one-sided writes: it trusted us (Engine::link_up)
  // before the frame that proved it (the connector: the welcome; the acceptor: the
  // connector's first frame after it). Until then chunks on this link go in frames.
  bool peer_trusts = false;
  Fault fault = Fault::kNone;
  FrameLink::CopiedBytes copied_before;   // payload bytes the rail's earlier links copied (RailStats)
  double rate_bps = 0, tokens = 0;
  int64_t tokens_ns = 0, next_tx_ns = 0;
};

class Engine;

// A peer: its channel (the socket-free state machine) and the links that carry its rails.
// It is the channel's RailIo.
struct Peer final : RailIo {
  Engine* eng = nullptr;
  int rank = 0;
  bool connector = false;          // this side dials (and re-dials) every rail
  // The rails are wanted: dialled (connector side) since add_peer(open), the first request to
  // or from the peer, open(), or the peer's first admitted rail. Until then nothing is dialled.
  bool opened = false;
  std::vector<NetAddr> remote;
  std::vector<std::unique_ptr<Link>> links;
  std::unique_ptr<ChannelCore> core;
  int64_t last_probe_ns = 0;       // acceptor side: last liveness probe of the peer's listener
  bool probe_listener = true;      // its listen addresses are known (not a peer added on its hello)
  // An orderly close (Engine::close_peer), on the engine thread after the caller has gone:
  //   kOpen -> kDelivering: every request that holds caller memory ended (kClosed); eager
  //            sends (completed, their bytes copied) go on until acknowledged, rails are
  //            dialled if none is up (the peer learns of the connection and of its close);
  //   kDelivering -> kSaidBye: nothing left unacknowledged and a rail up: a goodbye on every
  //            up rail, no re-dial; the links stay open for reading until the peer closes them;
  //   kSaidBye -> gone: every rail down (the peer closed), or kCloseLingerNs after the bye;
  //   either -> gone at close_deadline_ns (R2CCL_TIMEOUT after the close): what was not
  //            acknowledged is logged at WARN with its count and bytes.
  enum class Closing { kOpen, kDelivering, kSaidBye } closing = Closing::kOpen;
  int64_t close_deadline_ns = 0, bye_ns = 0, acks_asked_ns = 0;
  std::string close_why;
  bool gone = false;               // closed: erased at the end of the engine's turn (Engine::reap)

  Channel& ch() { return core->ch; }
  Rail& rail(int i) { return *core->ch.rails[static_cast<size_t>(i)]; }
  const Rail& rail(int i) const { return *core->ch.rails[static_cast<size_t>(i)]; }
  void kick(int rail) override;
  void drop(int rail, bool was_up) override;
  void redial(int rail) override;
  void payload_moved(int rail) override;
  void recv_dropped(int rail) override;
  // One-sided writes, where the request's memory is registered (Endpoint::register_memory) and
  // the rail's link writes (engine.cc).
  bool advertise(const Request& recv, AdvertBody* out) override;
  bool writes(int rail, const Request& send, uint64_t len) override;
  void revoke(const Request& recv) override;
};

class Engine {
 public:
  // The job's engine: peers are ranks, rails prove the job secret (JobIdentity).
  Engine(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
         const std::string& secret);
  // Any other owner's: `identity` says who peers are and what rails prove; `rank` only names
  // this process in logs.
  Engine(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
         std::unique_ptr<PeerIdentity> identity);
  ~Engine();

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Each local NIC's transport by its registry name (net/registry.h), in NIC order.
  std::vector<std::string> transports() const;
  std::vector<std::string> addresses() const { return addresses_; }
  const Config& config() const { return cfg_; }

  // Runs fn on the engine thread (any thread may post). call() also waits for it and
  // forwards its exception; it refuses the engine thread itself, and on its deadline
  // (30 s) withdraws a command that has not started, so fn never outlives the caller's
  // frame.
  void post(std::function<void()> fn);
  void call(std::function<void()> fn);
  // Tests: occupy the engine thread; shorten call()'s deadline; call() from the engine
  // thread (returns its error text).
  void testing_block(double seconds);
  void testing_set_call_timeout_ms(int64_t ms) { call_timeout_ms_.store(ms); }
  std::string testing_call_from_engine_thread();
  bool testing_test_lease_held() const { return lease_held_.load(); }

  // Registered memory (core/registration.h); any thread. register_memory returns its id.
  uint64_t register_memory(const void* base, size_t len, const DmaBuf* dmabuf = nullptr);
  std::string dmabuf_support() const;
  void deregister_memory(uint64_t id);
  // The registration holding [p, p + n) whole, or null.
  std::shared_ptr<Registration> registration_for(const void* p, size_t n);

  // Declares a peer; with `open`, its rails start connecting now, else on first use (open()).
  void add_peer(int peer, const std::vector<std::string>& addrs, bool open = true);
  // Any thread but the engine's; returns at once (one short command): ends the peer's requests
  // that hold caller memory (kClosed, `why`), then closes it in order on the engine thread
  // (Peer::Closing): completed eager sends are delivered first, bounded by R2CCL_TIMEOUT; the
  // identity hears PeerIdentity::peer_removed when it is gone. No-op if unknown or closing.
  void close_peer(int peer, const std::string& why);
  // Tests: the engine thread throws while handling `peer` at its next tick (as a bug would):
  // that peer's channel fails with kInternal, everything else goes on.
  void testing_throw_on(int peer);
  // Any thread: the peers' rails start connecting (a no-op for a peer already open).
  void open(const std::vector<int>& peers);
  // Peers whose rails are wanted (opened), in rank order. Any thread.
  std::vector<int> opened_peers();
  // Any thread. A small request (<= kCallerPathMaxBytes, R2CCL_POLL_US > 0) posted while
  // the engine is idle and has no command queued runs on the caller's thread at once (the
  // caller's path: its frames leave from this thread); any other goes to the engine thread.
  void submit(const std::shared_ptr<Request>& req);
  // Any thread but one already running the engine's work. Waits for a small request by
  // running the engine's socket work on this thread (the caller's path) for up to
  // R2CCL_POLL_US, so its completion needs no hand-over. True if it finished.
  bool caller_wait(const std::shared_ptr<Request>& req);
  // Any thread but one already running the engine's work; never waits. True if the request
  // has finished. One that has not gets one pass of the engine's socket work on this thread
  // (the caller's path) when the engine thread is not running it, and the test lease keeps
  // the engine thread off the sockets while this caller keeps polling: what an NCCL plugin's
  // test() needs, called in a loop by NCCL's progress thread.
  bool test(const std::shared_ptr<Request>& req);
  void cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why);
  std::vector<RailStats> stats(int peer);
  std::map<int, std::vector<RailStats>> all_stats();   // every peer's, in one call
  InjectResult inject(int peer, int rail, Fault fault, double rate);
  void set_weight(int peer, int rail, double w);
  void set_standby(int peer, int rail, bool standby);
  void on_rail(int peer, int rail, const std::function<void(ChannelCore&)>& fn);
  void set_nic_state(int nic, bool up, const std::string& why);
  std::vector<NicInfo> nic_list() const;
  std::vector<int> peer_list();
  std::string peer_name(int peer) const { return identity_->peer_name(peer); }
  uint64_t staged_bytes();
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> staged_heads(int peer, size_t n);
  // Any thread but the engine's: waits (bounded) for eager sends to be acknowledged, then
  // says goodbye to every peer and stops the engine thread.
  void shutdown();

 private:
  void drain_eager();
  friend struct Peer;
  // The caller's path. Whichever thread holds run_mu_ runs the engine's work: the engine
  // thread between its polls (it never holds it while asleep in epoll_wait), or a caller
  // that took it with try_lock (never blocking, so no lock order with the caller's own
  // locks can deadlock). A caller on the path handles socket events only: no commands,
  // timers or deletions, and the on_finish callbacks of requests it finishes are handed to
  // the engine thread (Request, t_deferred_callbacks).
  class CallerScope;
  bool caller_poll();
  bool try_run_lock();
  void caller_polling(bool start);
  void pollers_changed(bool start);
  void renew_test_lease();
  void end_test_lease(bool only_if_lapsed);
  bool may_take_caller_path(const Request& req) const;
  void do_submit(const std::shared_ptr<Request>& req);
  void run();
  void run_commands();
  void on_event(Pollable* p, uint32_t ev);
  void guarded_event(Pollable* p, uint32_t ev);   // on_event, a throw contained (contain)
  void guarded_failure(Pollable* p, const std::exception* e);
  void tick(int64_t now);
  void tick_peer(Peer& pr, int64_t now);
  void share_windows(int64_t now);
  int next_timeout_ms(int64_t now) const;
  void collect_stats(const Peer& pr, int64_t now, double unix_now, std::vector<RailStats>& out) const;

  // listeners and acceptor-side handshake
  void accept_all(int nic);
  void pending_read(Pending& p);
  void pending_hello(Pending& p);
  // quiet: logged at INFO (a probe or port check that closes without a word; our own fault injection)
  void pending_reject(Pending& p, const std::string& why, bool quiet = false);
  // The oldest handshake still waiting for its hello is dropped to make room (strangers'
  // idle connections must not keep the job's own re-dials out); false when none waits.
  bool evict_idle_pending();
  // Logs a rejected or dropped connection within kStrangerLogLines per window; counts the rest.
  void stranger_log(LogLevel level, const std::string& line);
  void stranger_log_window(int64_t now);
  void admit(Pending& p);
  Peer* admitted_peer(Pending& p);   // admit's peer for a hello that named none (null: rejected)

  // links: dialling, the connector's handshake, bytes in and out
  void start_connect(Peer& pr, Link& l);
  void attempt_failed(Peer& pr, Link& l, const std::string& why, bool refused);
  void link_up(Peer& pr, Link& l, bool peer_trusts);   // peer_trusts: see Link::peer_trusts
  void handshake_frame(Peer& pr, Link& l);
  void rail_readable(Peer& pr, Link& l);
  void rail_writable(Peer& pr, Link& l);
  bool rail_flush(Peer& pr, Link& l);     // false: the rail failed
  void drop_link(Peer& pr, Link& l, bool was_up);
  void set_link(Link& l, std::unique_ptr<FrameLink> link);
  void redial_link(Peer& pr, Link& l);
  void open_peer(Peer& pr);   // engine context
  // Engine context: a new peer's channel and links (add_peer; a hello the identity adds).
  // `remote`: the peer's listeners (an address of 0.0.0.0:0 where it dials in), each with its transport.
  Peer& make_peer(int peer, const std::vector<PeerAddress>& remote);
  bool may_dial(const Peer& pr, const Link& l) const;
  void set_interest(Link& l);
  void epoll_add(int fd, Pollable* p, uint32_t ev);
  void epoll_mod(int fd, Pollable* p, uint32_t ev);
  void epoll_del(int fd);

  // peers
  Peer* peer(int rank);
  void begin_close(Peer& pr, const std::string& why, int64_t now);
  void step_close(Peer& pr, int64_t now);
  void finish_close(Peer& pr);
  void reap();                    // erases peers marked gone (after the turn's events)
  // What the engine thread does when a handler throws: the peer concerned fails, not the process.
  void contain(Peer* pr, const char* where, const std::exception* e);
  void check_peer_gone(Peer& pr, int64_t now);
  bool probe_refused(Peer& pr);

  Config cfg_;
  int rank_, world_;
  std::vector<Nic> nics_;
  std::unique_ptr<PeerIdentity> identity_;   // who peers are; what their rails prove
  LinkOptions linkopt_;
  WireLimits limits_{};
  bool rate_faults_seen_ = false;   // engine thread: a rate fault was injected (Link::next_tx_ns in use)
  std::unique_ptr<NicTransports> transports_;   // each local NIC's transport (R2CCL_TRANSPORT)
  std::mutex reg_mu_;                             // guards regs_, by_base_ and next_reg_
  std::map<uint64_t, std::shared_ptr<Registration>> regs_;   // by id
  std::multimap<uintptr_t, uint64_t> by_base_;                // id by start address (registration_for)
  uint64_t next_reg_ = 0;
  // The transport of rail `r` (its local NIC's; add_peer made sure the peer's NIC agrees).
  Transport& rail_transport(const Rail& r) const { return transports_->of(static_cast<size_t>(r.local_nic)); }
  std::vector<std::unique_ptr<FrameListener>> listeners_;
  std::vector<std::unique_ptr<Pollable>> listener_polls_;
  std::vector<std::string> addresses_;

  int epfd_ = -1, sleep_fd_ = -1, wakefd_ = -1;
  std::mutex pollers_mu_;
  int pollers_ = 0;                // callers polling epfd_ now (caller_wait, and the test lease)
  // The test lease: a caller polling test() in a loop (an NCCL plugin's progress thread) keeps
  // the engine thread off the sockets until kTestLeaseNs after its last test(), so the frames
  // it polls for need no hand-over (the engine thread looks again when the lease lapses).
  std::atomic<bool> lease_held_{false};   // changed under pollers_mu_; holds one of pollers_
  std::atomic<int64_t> lease_until_ns_{0};
  Pollable wake_poll_{Pollable::kWake};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> call_timeout_ms_{30000};
  std::mutex run_mu_;              // held by whichever thread runs the engine's work (above)
  bool stopped_ = false;
  std::mutex cmd_mu_;
  std::vector<std::function<void()>> cmds_;

  std::map<int, std::unique_ptr<Peer>> peers_;
  bool reap_due_ = false;          // a peer is marked gone
  std::set<int> throw_on_peers_;   // testing_throw_on
  std::list<std::unique_ptr<Pending>> pendings_;
  int64_t stranger_window_ns_ = 0;   // stranger_log: the current window, lines shown, lines held back
  int stranger_shown_ = 0;
  uint64_t stranger_hidden_ = 0;
  std::vector<uint8_t> scratch_;
  std::vector<bool> nic_down_;     // held down by set_nic_state
  std::vector<std::string> nic_down_why_;
  int64_t next_tick_ns_ = 0;
  std::vector<int64_t> nic_drain_ns_;   // per local NIC: its rails' bytes in flight / its rate (share_windows)
};

}  // namespace r2ccl
