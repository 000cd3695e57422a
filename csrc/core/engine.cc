// The progress engine: construction, the epoll loop, timers (heartbeats, stall and
// silence detection, re-dials, peer-gone), stats, fault injection, weights, and the
// Endpoint facade. Handshakes, rail I/O and channel logic live in engine_*.cc beside it.
// Every function runs on the engine thread unless its comment says otherwise.
#include "core/engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <future>

#include "base/log.h"
#include "core/digest.h"
#include "core/engine_internal.h"

namespace r2ccl {

using namespace detail;

const char* rail_state_name(RailState s) {
  switch (s) {
    case RailState::kConnecting: return "connecting";
    case RailState::kHandshake: return "handshake";
    case RailState::kUp: return "up";
    case RailState::kDown: return "down";
  }
  return "?";
}

// ---------------------------------------------------------------- construction, commands

Engine::Engine(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
               const std::string& secret)
    : cfg_(cfg), rank_(rank), world_(world), secret_(secret) {
  std::string bad = cfg.validate();
  if (!bad.empty()) throw Error(Cause::kInvalidArgument, -1, bad);
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(Cause::kInvalidArgument, -1,
                "rank " + std::to_string(rank) + " is outside world size " + std::to_string(world));
  if (nics.empty()) throw Error(Cause::kInvalidArgument, -1, "no NICs given (set R2CCL_NICS)");
  if (secret.size() < 16)
    throw Error(Cause::kInvalidArgument, -1, "the job secret must be at least 16 bytes");
  log_set_process_default(cfg.debug_level, rank);
  for (auto& n : nics) nics_.push_back(resolve_nic(n));
  nic_down_.assign(nics_.size(), false);
  nic_down_why_.assign(nics_.size(), std::string());
  auto id = sha256(secret.data(), secret.size());
  job_id_ = load_le64(id.data());
  sockopt_.buffer_bytes = cfg.socket_buffer_bytes;
  sockopt_.user_timeout_ms = cfg.tcp_user_timeout_ms;
  sockopt_.bind_device = cfg.bind_device;
  limits_.max_chunk_bytes = kChunkBytesMax;   // no valid chunk_bytes cuts a larger chunk
  limits_.max_message_bytes = cfg.max_message_bytes;
  scratch_.resize(256 << 10);
  tp_ = make_socket_transport();

  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wakefd_ < 0) throw Error(Cause::kSystem, -1, "epoll/eventfd creation failed");
  epoll_add(wakefd_, &wake_poll_, EPOLLIN);
  for (size_t i = 0; i < nics_.size(); i++) {
    int port = cfg.port > 0 ? cfg.port + static_cast<int>(i) : 0;
    listeners_.push_back(tp_->listen(nics_[i], port, sockopt_));
    auto p = std::make_unique<Pollable>();
    p->kind = Pollable::kListener;
    p->index = static_cast<int>(i);
    epoll_add(listeners_.back()->fd(), p.get(), EPOLLIN);
    listener_polls_.push_back(std::move(p));
    addresses_.push_back(listeners_.back()->local_addr().str());
  }
  thread_ = std::thread([this] {
    log_bind_thread(cfg_.debug_level, rank_);
    run();
  });
}

Engine::~Engine() {
  shutdown();
  if (epfd_ >= 0) ::close(epfd_);
  if (wakefd_ >= 0) ::close(wakefd_);
}

void Engine::post(std::function<void()> fn) {
  bool first;
  {
    std::lock_guard<std::mutex> g(cmd_mu_);
    first = cmds_.empty();
    cmds_.push_back(std::move(fn));
  }
  // Commands already queued mean their poster's wake-up is pending (the engine takes the
  // whole queue at once after reading the eventfd): one write per batch, not per command.
  if (!first) return;
  uint64_t one = 1;
  ssize_t w = ::write(wakefd_, &one, sizeof one);
  (void)w;
}

// Any thread but the engine's. fn may capture the caller's locals by reference: call() does
// not return while fn may still run. On the deadline a command not yet started is withdrawn
// (it will never run); one already running is waited for (commands are short).
void Engine::call(std::function<void()> fn) {
  if (std::this_thread::get_id() == thread_.get_id())
    throw Error(Cause::kInternal, -1, "Engine::call from the engine thread (it would wait for itself)");
  if (stop_.load()) throw Error(Cause::kClosed, -1, "the r2ccl endpoint is closed");
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    enum { kQueued, kRunning, kDone, kWithdrawn } phase = kQueued;
    std::exception_ptr error;
  };
  auto st = std::make_shared<State>();
  post([fn = std::move(fn), st] {
    {
      std::lock_guard<std::mutex> g(st->mu);
      if (st->phase == State::kWithdrawn) return;
      st->phase = State::kRunning;
    }
    std::exception_ptr err;
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> g(st->mu);
    st->error = err;
    st->phase = State::kDone;
    st->cv.notify_all();
  });
  std::unique_lock<std::mutex> lk(st->mu);
  const auto limit = std::chrono::milliseconds(call_timeout_ms_.load());
  if (!st->cv.wait_for(lk, limit, [&] { return st->phase == State::kDone; })) {
    if (st->phase == State::kQueued) {
      st->phase = State::kWithdrawn;
      throw Error(Cause::kTimeout, -1,
                  "the r2ccl progress engine did not answer within " + std::to_string(limit.count() / 1000.0) + " s");
    }
    st->cv.wait(lk, [&] { return st->phase == State::kDone; });
  }
  if (st->error) std::rethrow_exception(st->error);
}

void Engine::testing_block(double seconds) {
  post([seconds] { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); });
}

std::string Engine::testing_call_from_engine_thread() {
  auto result = std::make_shared<std::promise<std::string>>();
  auto fut = result->get_future();
  post([this, result] {
    try {
      call([] {});
      result->set_value("");
    } catch (const Error& e) {
      result->set_value(e.what());
    }
  });
  if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return "no answer within 10 s";
  return fut.get();
}

void Engine::run_commands() {
  std::vector<std::function<void()>> cmds;
  {
    std::lock_guard<std::mutex> g(cmd_mu_);
    cmds.swap(cmds_);
  }
  for (auto& c : cmds) c();
}

Channel* Engine::channel(int peer) {
  auto it = channels_.find(peer);
  if (it == channels_.end())
    throw Error(Cause::kInvalidArgument, peer,
                "rank " + std::to_string(peer) + " is not a connected peer of rank " + std::to_string(rank_));
  return it->second.get();
}

std::string Engine::peer_name(const Channel& ch) const {
  std::string s = "rank " + std::to_string(ch.peer);
  if (!ch.remote.empty()) s += " (" + ch.remote[0].str() + ")";
  return s;
}

std::string Engine::rail_name(const Channel& ch, const Rail& r) const {
  return "rail " + std::to_string(r.index) + " to rank " + std::to_string(ch.peer) + " (" +
         nics_[r.local_nic].name + " " + nics_[r.local_nic].addr_str() + " -> " +
         ch.remote[r.remote_nic].str() + ")";
}

void Engine::add_peer(int peer, const std::vector<std::string>& addrs) {
  if (peer < 0 || peer >= world_ || peer == rank_)
    throw Error(Cause::kInvalidArgument, peer, "peer rank " + std::to_string(peer) + " is invalid for rank " +
                                                   std::to_string(rank_) + " of " + std::to_string(world_));
  if (addrs.empty()) throw Error(Cause::kInvalidArgument, peer, "peer has no addresses");
  std::vector<NetAddr> remote;
  for (auto& a : addrs) remote.push_back(NetAddr::parse(a));
  call([&] {
    if (channels_.count(peer)) throw Error(Cause::kInvalidArgument, peer, "peer added twice");
    auto ch = std::make_unique<Channel>();
    ch->peer = peer;
    ch->connector = rank_ > peer;   // the higher rank dials
    ch->remote = remote;
    size_t n_local = nics_.size(), n_remote = remote.size();
    size_t pairs = std::max(n_local, n_remote);
    int64_t now = now_ns();
    RailPace::Limits pace;
    pace.max_window = cfg_.rail_window_bytes;
    pace.max_chunk = cfg_.chunk_bytes;
    pace.min_chunk = kMinChunkBytes;
    pace.min_window = 2 * kMinChunkBytes;
    pace.target_ns = cfg_.rail_queue_ms * kMs;
    for (size_t i = 0; i < pairs * static_cast<size_t>(cfg_.conns_per_nic); i++) {
      auto r = std::make_unique<Rail>();
      r->ch = ch.get();
      r->index = static_cast<int>(i);
      size_t p = i % pairs;
      r->local_nic = static_cast<int>(p % n_local);
      r->remote_nic = static_cast<int>(p % n_remote);
      r->poll.obj = r.get();
      r->pace = RailPace(pace);
      r->changed_ns = now;
      r->changed_unix_s = unix_time_s();
      ch->rails.push_back(std::move(r));
    }
    Channel& c = *ch;
    channels_[peer] = std::move(ch);
    if (c.connector)
      for (auto& r : c.rails) start_connect(c, *r);
    for (auto& p : pendings_)
      if (p->parked && !p->dead) {
        p->parked = false;
        pending_hello(*p);
      }
  });
}

// ---------------------------------------------------------------- the loop

void Engine::epoll_add(int fd, Pollable* p, uint32_t ev) {
  epoll_event e{};
  e.events = ev;
  e.data.ptr = p;
  p->fd = fd;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &e);
}

void Engine::epoll_mod(int fd, Pollable* p, uint32_t ev) {
  epoll_event e{};
  e.events = ev;
  e.data.ptr = p;
  p->fd = fd;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &e);
}

void Engine::epoll_del(int fd) { epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr); }

void Engine::set_interest(Rail& r) {
  if (!r.conn) return;
  uint32_t ev = 0;
  if (r.fault != Fault::kStall) {
    ev = EPOLLIN;
    bool rate_wait = r.next_tx_ns > now_ns();
    if (r.state == RailState::kConnecting || (r.cur.active && !rate_wait)) ev |= EPOLLOUT;
  }
  if (ev != r.events) {
    epoll_mod(r.conn->fd(), &r.poll, ev);
    r.events = ev;
  }
}

int Engine::next_timeout_ms(int64_t now) const {
  int64_t next = next_tick_ns_;
  for (auto& [peer, ch] : channels_)
    for (auto& r : ch->rails)
      if (r->cur.active && r->next_tx_ns > now) next = std::min(next, r->next_tx_ns);
  int64_t ms = (next - now + kMs - 1) / kMs;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

void Engine::run() {
  const int64_t tick_ns =
      std::max<int64_t>(1, std::min({cfg_.heartbeat_ms, cfg_.stall_ms, cfg_.reprobe_ms}) / 4) * kMs;
  epoll_event events[64];
  next_tick_ns_ = now_ns() + tick_ns;
  while (!stop_.load()) {
    int n = epoll_wait(epfd_, events, 64, next_timeout_ms(now_ns()));
    for (int i = 0; i < n; i++) on_event(static_cast<Pollable*>(events[i].data.ptr), events[i].events);
    run_commands();
    int64_t now = now_ns();
    // Rails waiting only for rate-limit tokens.
    for (auto& [peer, ch] : channels_)
      for (auto& r : ch->rails)
        if (r->cur.active && r->next_tx_ns && r->next_tx_ns <= now) {
          r->next_tx_ns = 0;
          rail_writable(*ch, *r);
        }
    if (now >= next_tick_ns_) {
      tick(now);
      next_tick_ns_ = now + tick_ns;
    }
    pendings_.remove_if([](const std::unique_ptr<Pending>& p) { return p->dead; });
  }
  run_commands();
  // Goodbye: tell every peer on every live rail, give the frames a moment to leave.
  for (auto& [peer, ch] : channels_)
    for (auto& r : ch->rails)
      if (r->state == RailState::kUp) queue_ctrl(*r, FrameType::kBye, {});
  int64_t until = now_ns() + 200 * kMs;
  for (;;) {
    bool busy = false;
    for (auto& [peer, ch] : channels_)
      for (auto& r : ch->rails)
        if (r->state == RailState::kUp && (r->cur.active || !r->ctrl.empty())) {
          if (rail_flush(*ch, *r)) busy = busy || r->cur.active;
        }
    if (!busy || now_ns() > until) break;
    usleep(1000);
  }
  for (auto& [peer, ch] : channels_) {
    kill_channel(*ch, Cause::kClosed, "the r2ccl endpoint of rank " + std::to_string(rank_) + " was closed");
  }
  pendings_.clear();
  stopped_ = true;
}

void Engine::shutdown() {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  uint64_t one = 1;
  ssize_t w = ::write(wakefd_, &one, sizeof one);
  (void)w;
  if (thread_.joinable()) thread_.join();
}

void Engine::on_event(Pollable* p, uint32_t ev) {
  switch (p->kind) {
    case Pollable::kWake: {
      uint64_t v;
      ssize_t r = ::read(wakefd_, &v, sizeof v);
      (void)r;
      return;
    }
    case Pollable::kListener:
      accept_all(p->index);
      return;
    case Pollable::kPending: {
      auto* pd = static_cast<Pending*>(p->obj);
      if (!pd->dead) pending_read(*pd);
      return;
    }
    case Pollable::kRail: {
      auto* r = static_cast<Rail*>(p->obj);
      if (!r->conn || r->conn->fd() != p->fd) return;   // replaced or closed in this batch
      Channel& ch = *r->ch;
      if (r->state == RailState::kConnecting) {
        if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) rail_writable(ch, *r);
        return;
      }
      if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) rail_readable(ch, *r);
      if (r->conn && r->conn->fd() == p->fd && (ev & EPOLLOUT)) rail_writable(ch, *r);
      return;
    }
  }
}

// ---------------------------------------------------------------- timers

// Every local NIC's delivered rate x R2CCL_RAIL_QUEUE_MS, shared equally among the rails
// that were busy on it lately (RailPace).
void Engine::share_windows(int64_t now) {
  const int64_t since = now - std::max<int64_t>(50, 2 * cfg_.rail_queue_ms) * kMs;
  std::vector<double> rate(nics_.size(), 0.0), inflight(nics_.size(), 0.0);
  std::vector<int> busy(nics_.size(), 0);
  for (auto& [peer, ch] : channels_)
    for (auto& r : ch->rails)
      if (r->state == RailState::kUp && r->pace.busy_since(since)) {
        const size_t k = static_cast<size_t>(r->local_nic);
        rate[k] += r->pace.share_rate();
        inflight[k] += static_cast<double>(r->inflight);
        busy[k]++;
      }
  nic_drain_ns_.assign(nics_.size(), 0);
  for (size_t k = 0; k < nics_.size(); k++)
    if (rate[k] > 0) nic_drain_ns_[k] = static_cast<int64_t>(inflight[k] * 1e9 / rate[k]);
  for (auto& [peer, ch] : channels_) {
    for (auto& r : ch->rails) {
      const size_t k = static_cast<size_t>(r->local_nic);
      if (r->pace.busy_since(since)) r->pace.share_window(rate[k], busy[k]);
    }
    pump(*ch);
  }
}

void Engine::tick(int64_t now) {
  const int64_t stall = cfg_.stall_ms * kMs;
  const int64_t hb = cfg_.heartbeat_ms * kMs;
  for (auto& p : pendings_)
    if (!p->dead && now > p->deadline_ns && !p->parked) pending_reject(*p, "handshake not finished in time");
    else if (!p->dead && p->parked && now > p->deadline_ns + 10 * cfg_.connect_timeout_ms * kMs)
      pending_reject(*p, "hello names a rank that never joined");
  share_windows(now);
  for (auto& [peer, chp] : channels_) {
    Channel& ch = *chp;
    if (ch.dead) continue;
    for (auto& rp : ch.rails) {
      Rail& r = *rp;
      switch (r.state) {
        case RailState::kUp: {
          bool sibling_alive = false;
          for (auto& o : ch.rails)
            if (o.get() != &r && o->state == RailState::kUp && now - o->last_rx_ns < stall) sibling_alive = true;
          // Slow is not dead: the peer gets what the rail's own measured rate needs to drain
          // what it holds, on top of R2CCL_STALL_MS.
          const int64_t drain =
              r.inflight > 0 ? r.pace.drain_ns(r.inflight, nic_drain_ns_[static_cast<size_t>(r.local_nic)]) : 0;
          if (r.inflight > 0 && now - r.progress_ns > stall + drain && sibling_alive) {
            r.stalls++;
            fail_rail(ch, r, FailReason::kStalled,
                      "stalled: " + std::to_string(r.inflight) + " bytes unacknowledged for " +
                          std::to_string((now - r.progress_ns) / kMs) + " ms (its measured drain time: " +
                          std::to_string(drain / kMs) + " ms) while other rails progress");
          } else if (now - r.last_rx_ns > hb * cfg_.heartbeat_misses) {
            fail_rail(ch, r, FailReason::kSilent,
                      "silent for " + std::to_string((now - r.last_rx_ns) / kMs) + " ms (" +
                          std::to_string(cfg_.heartbeat_misses) + " heartbeats missed)");
          } else if (now - r.last_tx_ns >= hb && !r.cur.active && r.ctrl.empty() && r.fault != Fault::kStall) {
            std::vector<uint8_t> body(kHeartbeatBytes, 0);
            store_le64(body.data(), static_cast<uint64_t>(now));
            queue_ctrl(r, FrameType::kHeartbeat, std::move(body));
            rail_flush(ch, r);
          }
          break;
        }
        case RailState::kConnecting:
        case RailState::kHandshake:
          if (now > r.attempt_deadline_ns) attempt_failed(ch, r, "connect/handshake timed out", false);
          break;
        case RailState::kDown:
          if (ch.connector && r.fault != Fault::kClose && r.fault != Fault::kStall && now >= r.next_attempt_ns &&
              !nic_down_[static_cast<size_t>(r.local_nic)])
            start_connect(ch, r);
          break;
      }
    }
    // The cumulative point may have reached the peer only on a rail that just died: send it
    // on every live rail that has not carried it yet.
    for (auto& rp : ch.rails) {
      Rail& r = *rp;
      if (r.cum_sent < ch.rx_cum) {
        if (r.state != RailState::kUp || r.fault == Fault::kStall || !r.ctrl.empty()) continue;
        r.cum_sent = ch.rx_cum;
        std::vector<uint8_t> body(kAckRangeBytes);
        store_le64(body.data(), 1);
        store_le64(body.data() + 8, ch.rx_cum);
        queue_ctrl(r, FrameType::kAck, std::move(body), 1);
        rail_flush(ch, r);
      }
    }
    check_channel(ch, now);
  }
}

// Turns "every rail is down" into an error, promptly when the peer is evidently gone.
void Engine::check_channel(Channel& ch, int64_t now) {
  if (ch.dead || ch.rails_up() > 0) {
    ch.all_down_since = 0;
    return;
  }
  if (ch.all_down_since == 0) ch.all_down_since = now;
  bool ever_up = false, all_closed = true, all_refused = true;
  for (auto& r : ch.rails) {
    ever_up = ever_up || r->ever_up;
    all_closed = all_closed && r->closed_by_peer;
    all_refused = all_refused && r->refused;
  }
  if (!ever_up) return;   // still starting up: wait_ready() reports that
  int64_t down_ms = (now - ch.all_down_since) / kMs;
  if (ch.bye_received) {
    kill_channel(ch, Cause::kPeerGone, "rank " + std::to_string(ch.peer) + " closed its r2ccl endpoint");
    return;
  }
  // A dead process's kernel resets its connections and refuses new ones; a NIC failure does
  // neither. The dialling side sees refusals on every re-dial; the listening side, once
  // every connection was closed on it, asks the peer's listener directly.
  int64_t grace_ms = std::max<int64_t>(1000, 3 * cfg_.reprobe_ms);
  bool gone = ch.connector ? all_refused : false;
  if (!ch.connector && all_closed && down_ms >= grace_ms && now - ch.last_probe_ns > grace_ms * kMs) {
    ch.last_probe_ns = now;
    gone = probe_refused(ch);
  }
  if (gone && down_ms >= grace_ms / 2) {
    kill_channel(ch, Cause::kPeerGone,
                 peer_name(ch) + " is gone: its connections were closed and its listener refuses new ones (" +
                     std::to_string(down_ms) + " ms without a rail; process exited or was killed?)");
    return;
  }
  const int64_t limit = static_cast<int64_t>(cfg_.timeout_s * 1e9);
  auto expire = [&](const std::shared_ptr<Request>& req) {
    int64_t since = std::max(req->posted_ns, ch.all_down_since);
    if (!req->finished() && now - since > limit) {
      std::string last;
      for (auto& r : ch.rails)
        last += "\n  " + rail_name(ch, *r) + ": " + (r->last_error.empty() ? "down" : r->last_error);
      req->finish_error(Cause::kAllRailsDown, "every rail to " + peer_name(ch) + " has been down for " +
                                                  std::to_string(down_ms) + " ms (R2CCL_TIMEOUT=" +
                                                  std::to_string(cfg_.timeout_s) + " s):" + last);
    }
  };
  for (auto& req : ch.sends) expire(req);
  for (auto& [k, req] : ch.posted) expire(req);
  for (auto& [id, m] : ch.inmsgs)
    if (m.req) expire(m.req);
}

// Dials the peer's first listener that is not held down by an injected fault and waits up to
// 100 ms: true only when the connection is actively refused (nothing listens there any more).
bool Engine::probe_refused(Channel& ch) {
  for (auto& r : ch.rails) {
    if (r->fault == Fault::kClose || r->fault == Fault::kStall) continue;
    std::unique_ptr<Connection> c;
    try {
      c = tp_->connect(nics_[r->local_nic], ch.remote[r->remote_nic], sockopt_);
    } catch (const Error&) {
      continue;
    }
    pollfd pfd{c->fd(), POLLOUT, 0};
    ::poll(&pfd, 1, 100);
    IoResult res = c->finish_connect();
    R2_INFO("liveness probe of %s: %s", peer_name(ch).c_str(),
            res.kind == IoResult::kOk ? "listening" : res.kind == IoResult::kError ? std::strerror(res.err) : "no answer");
    return res.kind == IoResult::kError && res.err == ECONNREFUSED;
  }
  return false;
}

// ---------------------------------------------------------------- stats, faults, weights

std::vector<RailStats> Engine::stats(int peer) {
  std::vector<RailStats> out;
  call([&] {
    Channel& ch = *channel(peer);
    for (auto& rp : ch.rails) {
      Rail& r = *rp;
      RailStats s;
      s.rail = r.index;
      s.local_nic = r.local_nic;
      s.remote_nic = r.remote_nic;
      s.local_nic_name = nics_[r.local_nic].name;
      s.local_addr = nics_[r.local_nic].addr_str();
      s.remote_addr = ch.remote[r.remote_nic].str();
      s.state = rail_state_name(r.state);
      s.weight = r.weight;
      s.tx_bytes = r.tx_bytes;
      s.rx_bytes = r.rx_bytes;
      s.tx_chunks = r.tx_chunks;
      s.rx_chunks = r.rx_chunks;
      s.acked_bytes = r.acked_bytes;
      s.retransmitted_chunks = r.retransmitted;
      s.inflight_bytes = r.inflight;
      if (r.cur.active && r.cur.is_data)
        s.unsent_bytes = r.cur.payload_len - (r.cur.done > kHeaderBytes ? r.cur.done - kHeaderBytes : 0);
      s.failures = r.failures;
      s.recoveries = r.recoveries;
      s.stalls = r.stalls;
      s.window_bytes = r.pace.window();
      s.pace_bw = r.pace.bandwidth();
      s.rtt_us = static_cast<double>(r.rtt_ns) / 1e3;
      s.busy_s = static_cast<double>(r.busy_ns + (r.busy_since_ns ? now_ns() - r.busy_since_ns : 0)) / 1e9;
      s.link_down = nic_down_[static_cast<size_t>(r.local_nic)];
      s.fault = fault_name(r.fault);
      s.last_error = r.last_error;
      s.last_reason = r.last_reason;
      s.last_change_unix_s = r.changed_unix_s;
      out.push_back(std::move(s));
    }
  });
  return out;
}

void Engine::inject(int peer, int rail, Fault fault, double rate) {
  call([&] {
    Channel& ch = *channel(peer);
    if (rail < 0 || rail >= static_cast<int>(ch.rails.size()))
      throw Error(Cause::kInvalidArgument, peer, "rail " + std::to_string(rail) + " does not exist (rank " +
                                                     std::to_string(peer) + " has " +
                                                     std::to_string(ch.rails.size()) + " rails)");
    if (fault == Fault::kRate && !(rate > 0))
      throw Error(Cause::kInvalidArgument, peer, "a rate fault needs a rate > 0 bytes/s");
    Rail& r = *ch.rails[rail];
    R2_WARN("%s: injected fault '%s'", rail_name(ch, r).c_str(), fault == Fault::kNone ? "heal" : fault_name(fault));
    r.fault = fault;
    r.rate_bps = rate;
    r.tokens = 0;
    r.tokens_ns = now_ns();
    r.next_tx_ns = 0;
    if (fault == Fault::kClose && r.state != RailState::kDown)
      fail_rail(ch, r, FailReason::kInjected, "closed by injected fault");
    if (r.conn) set_interest(r);
    if (fault == Fault::kNone) {
      r.next_attempt_ns = 0;
      if (r.state == RailState::kUp) {
        // Restart the stall clocks so the paused time is not counted against the rail.
        r.last_rx_ns = r.progress_ns = now_ns();
        rail_writable(ch, r);
      }
    }
  });
}

void Engine::set_nic_state(int nic, bool up, const std::string& why) {
  if (nic < 0 || nic >= static_cast<int>(nics_.size()))
    throw Error(Cause::kInvalidArgument, -1, "NIC index " + std::to_string(nic) + " does not exist");
  call([&] {
    const size_t n = static_cast<size_t>(nic);
    if (nic_down_[n] == !up) return;
    nic_down_[n] = !up;
    nic_down_why_[n] = why;
    R2_WARN("NIC %s (%s) %s: %s", nics_[n].name.c_str(), nics_[n].addr_str().c_str(), up ? "up" : "down", why.c_str());
    for (auto& [peer, chp] : channels_) {
      Channel& ch = *chp;
      if (ch.dead) continue;
      for (auto& rp : ch.rails) {
        Rail& r = *rp;
        if (r.local_nic != nic) continue;
        // Tell the peer on a live rail of another NIC: its end of this rail sees nothing
        // when the link is down on this side of a switch.
        std::vector<uint8_t> body(kRailStateBytes);
        store_le32(body.data(), static_cast<uint32_t>(r.index));
        store_le32(body.data() + 4, up ? 1u : 0u);
        for (auto& o : ch.rails)
          if (o->state == RailState::kUp && o->local_nic != nic && o->fault != Fault::kStall) {
            queue_ctrl(*o, FrameType::kRailState, std::move(body));
            rail_flush(ch, *o);
            break;
          }
        if (!up) {
          if (r.state != RailState::kDown) fail_rail(ch, r, FailReason::kLinkDown, "link down: " + why);
        } else if (r.state == RailState::kDown) {
          r.next_attempt_ns = 0;   // re-dial now (the dialling side) or on the peer's notice
          if (ch.connector && r.fault != Fault::kClose && r.fault != Fault::kStall) start_connect(ch, r);
        }
      }
    }
  });
}

std::vector<NicInfo> Engine::nic_list() const {
  std::vector<NicInfo> out;
  for (auto& n : nics_) out.push_back({n.name, n.ifname, n.addr_str()});
  return out;
}

std::vector<int> Engine::peer_list() {
  std::vector<int> out;
  call([&] {
    for (auto& [peer, ch] : channels_) out.push_back(peer);
  });
  return out;
}

uint64_t Engine::staged_bytes() {
  uint64_t n = 0;
  call([&] {
    for (auto& [peer, ch] : channels_)
      for (auto& [id, m] : ch->inmsgs) n += m.staged_bytes();
  });
  return n;
}

void Engine::set_weight(int peer, int rail, double w) {
  if (!(w >= 0) || !std::isfinite(w)) throw Error(Cause::kInvalidArgument, peer, "rail weight must be finite and >= 0");
  call([&] {
    Channel& ch = *channel(peer);
    if (rail < 0 || rail >= static_cast<int>(ch.rails.size()))
      throw Error(Cause::kInvalidArgument, peer, "rail " + std::to_string(rail) + " does not exist");
    ch.rails[rail]->weight = w;
    pump(ch);
  });
}

// ---------------------------------------------------------------- Endpoint facade

Endpoint::Endpoint(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
                   const std::string& secret)
    : engine_(std::make_unique<Engine>(cfg, rank, world, nics, secret)) {}
Endpoint::~Endpoint() = default;
int Endpoint::rank() const { return engine_->rank(); }
int Endpoint::world() const { return engine_->world(); }
std::vector<std::string> Endpoint::addresses() const { return engine_->addresses(); }
void Endpoint::add_peer(int peer, const std::vector<std::string>& a) { engine_->add_peer(peer, a); }

void Endpoint::wait_ready(const std::vector<int>& peers, double timeout_s, double degraded_after_s) {
  const int64_t start = now_ns();
  int64_t deadline = start + static_cast<int64_t>(timeout_s * 1e9);
  for (;;) {
    std::string missing;
    bool every_peer_has_one = true;
    for (int p : peers) {
      bool one = false;
      for (auto& s : engine_->stats(p)) {
        if (s.state == "up") {
          one = true;
          continue;
        }
        missing += "\n  rank " + std::to_string(p) + " rail " + std::to_string(s.rail) + " (" + s.local_addr + " -> " +
                   s.remote_addr + "): " + s.state + (s.last_error.empty() ? "" : ", " + s.last_error);
      }
      every_peer_has_one = every_peer_has_one && one;
    }
    if (missing.empty()) return;
    if (degraded_after_s >= 0 && every_peer_has_one && now_ns() - start > static_cast<int64_t>(degraded_after_s * 1e9)) {
      R2_WARN("starting degraded: these rails are not up after %.1f s and keep re-dialling:%s", degraded_after_s,
              missing.c_str());
      return;
    }
    if (now_ns() > deadline)
      throw Error(Cause::kTimeout, peers.size() == 1 ? peers[0] : -1,
                  "rails not up after " + std::to_string(timeout_s) + " s:" + missing);
    usleep(5000);
  }
}

std::shared_ptr<Request> Endpoint::post_send(int peer, uint64_t tag, const void* buf, uint64_t len,
                                             std::function<void()> on_finish) {
  auto req = std::make_shared<Request>(Request::kSend, peer, tag, static_cast<uint8_t*>(const_cast<void*>(buf)), len);
  req->on_finish = std::move(on_finish);
  engine_->submit(req);
  return req;
}

std::shared_ptr<Request> Endpoint::post_recv(int peer, uint64_t tag, void* buf, uint64_t len,
                                             std::function<void()> on_finish) {
  auto req = std::make_shared<Request>(Request::kRecv, peer, tag, static_cast<uint8_t*>(buf), len);
  req->on_finish = std::move(on_finish);
  engine_->submit(req);
  return req;
}

void Endpoint::cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why) {
  engine_->cancel(req, cause, why);
}

const Config& Endpoint::config() const { return engine_->config(); }

void Endpoint::wait(const std::shared_ptr<Request>& req, double timeout_s) {
  if (timeout_s < 0) timeout_s = engine_->config().timeout_s;
  int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
  if (!req->wait_until(deadline)) {
    std::string what = std::string(req->kind == Request::kSend ? "send to" : "receive from") + " rank " +
                       std::to_string(req->peer) + " (tag " + std::to_string(req->tag) + ", " +
                       std::to_string(req->len) + " bytes) did not complete within " + std::to_string(timeout_s) + " s";
    engine_->cancel(req, Cause::kTimeout, what);
    // The engine either finished the request or has stopped (closed endpoint): in both cases it
    // no longer touches the buffer. A request it never saw is an error all the same.
    if (!req->wait_until(now_ns() + 5000000000LL)) throw Error(Cause::kTimeout, req->peer, what);
  }
  req->rethrow();
}

std::vector<RailStats> Endpoint::rail_stats(int peer) { return engine_->stats(peer); }
void Endpoint::inject(int peer, int rail, Fault f, double rate) { engine_->inject(peer, rail, f, rate); }
void Endpoint::set_rail_weight(int peer, int rail, double w) { engine_->set_weight(peer, rail, w); }
void Endpoint::set_nic_state(int nic, bool up, const std::string& why) { engine_->set_nic_state(nic, up, why); }
std::vector<NicInfo> Endpoint::nics() const { return engine_->nic_list(); }
std::vector<int> Endpoint::peers() { return engine_->peer_list(); }
uint64_t Endpoint::staged_bytes() { return engine_->staged_bytes(); }
void Endpoint::close() { engine_->shutdown(); }
void Endpoint::testing_block_engine(double seconds) { engine_->testing_block(seconds); }
void Endpoint::testing_set_call_timeout(double seconds) {
  engine_->testing_set_call_timeout_ms(static_cast<int64_t>(seconds * 1000));
}
std::string Endpoint::testing_call_from_engine_thread() { return engine_->testing_call_from_engine_thread(); }

}  // namespace r2ccl
