// The progress engine: one thread per endpoint that owns every socket, rail and channel.
// Callers talk to it through posted commands; it sleeps in epoll when idle. See channel.h
// for the state it keeps. Knows nothing of collectives or JAX.
#pragma once
#include <sys/epoll.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "core/channel.h"
#include "core/endpoint.h"
#include "net/transport.h"

namespace r2ccl {

// An accepted connection that has not yet proven it belongs to the job.
struct Pending {
  std::unique_ptr<Connection> conn;
  Pollable poll{Pollable::kPending};
  int nic = 0;
  int stage = 0;                  // 0: await hello, 1: await auth
  bool parked = false;            // hello names a peer not yet added; wait for add_peer
  bool dead = false;
  RxFrame rx;
  uint8_t hello[kHelloBytes];
  HelloBody hb{};
  std::array<uint8_t, kNonceBytes> nonce{};
  int64_t deadline_ns = 0;
  std::string desc;
};

class Engine {
 public:
  Engine(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
         const std::string& secret);
  ~Engine();

  int rank() const { return rank_; }
  int world() const { return world_; }
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

  void add_peer(int peer, const std::vector<std::string>& addrs);
  void submit(const std::shared_ptr<Request>& req);
  void cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why);
  std::vector<RailStats> stats(int peer);
  void inject(int peer, int rail, Fault fault, double rate);
  void set_weight(int peer, int rail, double w);
  void set_nic_state(int nic, bool up, const std::string& why);
  std::vector<NicInfo> nic_list() const;
  std::vector<int> peer_list();
  uint64_t staged_bytes();
  void shutdown();

 private:
  void run();
  void run_commands();
  void on_event(Pollable* p, uint32_t ev);
  void tick(int64_t now);
  void share_windows(int64_t now);
  int next_timeout_ms(int64_t now) const;

  // listeners and acceptor-side handshake
  void accept_all(int nic);
  void pending_read(Pending& p);
  void pending_hello(Pending& p);
  // quiet: logged at INFO (a probe or port check that closes without a word; our own fault injection)
  void pending_reject(Pending& p, const std::string& why, bool quiet = false);
  void admit(Pending& p);

  // rails
  void start_connect(Channel& ch, Rail& r);
  void attempt_failed(Channel& ch, Rail& r, const std::string& why, bool refused);
  void rail_up(Channel& ch, Rail& r);
  void fail_rail(Channel& ch, Rail& r, FailReason reason, const std::string& why);
  void rail_readable(Channel& ch, Rail& r);
  void rail_writable(Channel& ch, Rail& r);
  bool rail_flush(Channel& ch, Rail& r);     // false: the rail failed
  void rail_control(Channel& ch, Rail& r);
  InMsg* open_inmsg(Channel& ch, const FrameHeader& h);
  void rail_data_header(Channel& ch, Rail& r);
  void rail_data_done(Channel& ch, Rail& r);
  void flush_acks(Channel& ch, Rail& r);
  void queue_ctrl(Rail& r, FrameType t, std::vector<uint8_t> payload, uint64_t seq = 0);
  void set_interest(Rail& r);
  void epoll_add(int fd, Pollable* p, uint32_t ev);
  void epoll_mod(int fd, Pollable* p, uint32_t ev);
  void epoll_del(int fd);

  // channels
  Channel* channel(int peer);
  void pump(Channel& ch);
  bool next_chunk(Channel& ch, Chunk* c, uint64_t max_len);
  void on_ack(Channel& ch, Rail& r, uint64_t first, uint64_t last);
  void post_recv(Channel& ch, const std::shared_ptr<Request>& req);
  void finish_inmsg(Channel& ch, uint64_t msg_id);
  void redirect_to_scratch(Channel& ch, uint64_t msg_id);
  void kill_channel(Channel& ch, Cause cause, const std::string& why);
  void check_channel(Channel& ch, int64_t now);
  bool probe_refused(Channel& ch);
  std::string peer_name(const Channel& ch) const;
  std::string rail_name(const Channel& ch, const Rail& r) const;

  Config cfg_;
  int rank_, world_;
  std::vector<Nic> nics_;
  std::string secret_;
  uint64_t job_id_ = 0;
  SocketOptions sockopt_;
  WireLimits limits_{};
  std::unique_ptr<Transport> tp_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::vector<std::unique_ptr<Pollable>> listener_polls_;
  std::vector<std::string> addresses_;

  int epfd_ = -1, wakefd_ = -1;
  Pollable wake_poll_{Pollable::kWake};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> call_timeout_ms_{30000};
  bool stopped_ = false;
  std::mutex cmd_mu_;
  std::vector<std::function<void()>> cmds_;

  std::map<int, std::unique_ptr<Channel>> channels_;
  std::list<std::unique_ptr<Pending>> pendings_;
  std::vector<uint8_t> scratch_;
  std::vector<bool> nic_down_;     // held down by set_nic_state
  std::vector<std::string> nic_down_why_;
  int64_t next_tick_ns_ = 0;
  std::vector<int64_t> nic_drain_ns_;   // per local NIC: its rails' bytes in flight / its rate (share_windows)
};

}  // namespace r2ccl
