// The progress engine: construction, the epoll loop, timers (re-dials, peer-gone; the
// channel's own timers run in ChannelCore::tick), stats, fault injection, weights, requests
// and the Endpoint facade. Handshakes and rail I/O live in engine_*.cc beside it; the
// channel logic in channel.cc.
// Every function runs on the engine thread unless its comment says otherwise.
#include "core/engine.h"

#include <poll.h>
#include <sched.h>
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
#include "core/registration.h"
#include "net/registry.h"

namespace r2ccl {

using namespace detail;

// The engine whose work this thread is running now (the engine thread's, or a caller's on
// the caller's path), else null.
namespace {
thread_local const Engine* t_running = nullptr;

}  // namespace

// The engine's work on a caller's thread (or the engine thread): marks the thread as running
// it and collects the on_finish callbacks of requests finished meanwhile; on a caller's
// thread they go to the engine thread when the scope ends (the caller still holds run_mu_,
// so the engine has not finished its last commands yet).
class Engine::CallerScope {
 public:
  CallerScope(Engine* e, bool defer) : e_(e), prev_(t_running), prev_defer_(t_deferred_callbacks) {
    t_running = e;
    if (defer) t_deferred_callbacks = &deferred_;
  }
  ~CallerScope() {
    t_running = prev_;
    t_deferred_callbacks = prev_defer_;
    if (!deferred_.empty())
      e_->post([fns = std::move(deferred_)]() mutable {
        for (auto& f : fns) f();
      });
  }
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;

 private:
  Engine* e_;
  const Engine* prev_;
  std::vector<std::function<void()>>* prev_defer_;
  std::vector<std::function<void()>> deferred_;
};

// ---------------------------------------------------------------- construction, commands

namespace {
std::unique_ptr<PeerIdentity> job_identity(const std::string& secret, int rank, int world) {
  if (secret.size() < 16)
    throw Error(Cause::kInvalidArgument, -1, "the job secret must be at least 16 bytes");
  return std::make_unique<JobIdentity>(secret, JobIdentity::job_id_of(secret), rank, world);
}
}  // namespace

Engine::Engine(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
               const std::string& secret)
    : Engine(cfg, rank, world, nics, job_identity(secret, rank, world)) {}

Engine::Engine(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
               std::unique_ptr<PeerIdentity> identity)
    : cfg_(cfg), rank_(rank), world_(world), identity_(std::move(identity)) {
  std::string bad = cfg.validate();
  if (!bad.empty()) throw Error(Cause::kInvalidArgument, -1, bad);
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(Cause::kInvalidArgument, -1,
                "rank " + std::to_string(rank) + " is outside world size " + std::to_string(world));
  if (nics.empty()) throw Error(Cause::kInvalidArgument, -1, "no NICs given (set R2CCL_NICS)");
  log_set_process_default(cfg.debug_level, rank);
  for (auto& n : nics) nics_.push_back(resolve_nic(n));
  nic_down_.assign(nics_.size(), false);
  nic_down_why_.assign(nics_.size(), std::string());
  linkopt_.header_bytes = kHeaderBytes;
  linkopt_.buffer_bytes = cfg.socket_buffer_bytes;
  linkopt_.user_timeout_ms = cfg.tcp_user_timeout_ms;
  linkopt_.bind_device = cfg.bind_device;
  limits_.max_chunk_bytes = kChunkBytesMax;   // no valid chunk_bytes cuts a larger chunk
  limits_.max_message_bytes = cfg.max_message_bytes;
  scratch_.resize(256 << 10);
  transports_ = std::make_unique<NicTransports>(nics_, cfg_);

  // Two sets: epfd_ holds every socket (links, handshakes, listeners) and is what callers on
  // the caller's path poll; the engine thread sleeps on sleep_fd_, which holds the wake-up
  // eventfd and epfd_ itself. While callers poll, epfd_ leaves sleep_fd_, so frames they
  // handle do not also wake the engine thread.
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  sleep_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || sleep_fd_ < 0 || wakefd_ < 0) throw Error(Cause::kSystem, -1, "epoll/eventfd creation failed");
  {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = &wake_poll_;
    epoll_ctl(sleep_fd_, EPOLL_CTL_ADD, wakefd_, &e);
    e.data.ptr = nullptr;   // the socket set
    epoll_ctl(sleep_fd_, EPOLL_CTL_ADD, epfd_, &e);
  }
  for (size_t i = 0; i < nics_.size(); i++) {
    int port = cfg.port > 0 ? cfg.port + static_cast<int>(i) : 0;
    listeners_.push_back(transports_->of(i).listen(nics_[i], port, linkopt_));
    auto p = std::make_unique<Pollable>();
    p->kind = Pollable::kListener;
    p->index = static_cast<int>(i);
    epoll_add(listeners_.back()->wait_fd(), p.get(), EPOLLIN);
    listener_polls_.push_back(std::move(p));
    addresses_.push_back(transports_->publish(i, listeners_.back()->local_addr()));
  }
  thread_ = std::thread([this] {
    name_this_thread("r2ccl-engine");
    log_bind_thread(cfg_.debug_level, rank_);
    run();
  });
}

Engine::~Engine() {
  shutdown();
  if (epfd_ >= 0) ::close(epfd_);
  if (sleep_fd_ >= 0) ::close(sleep_fd_);
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
  if (std::this_thread::get_id() == thread_.get_id() || t_running == this)
    throw Error(Cause::kInternal, -1, "Engine::call from the engine thread (it would wait for itself)");
  if (stop_.load()) throw Error(Cause::kClosed, -1, "the r2ccl endpoint is closed");
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    enum { kQueued, kRunning, kDone, kWithdrawn } phase = kQueued;
    // The failure, by value: thrown as a fresh copy on the calling thread (an exception
    // object shared between threads is freed by whichever lets go last).
    bool failed = false;
    Error error{Cause::kInternal, -1, ""};
  };
  auto st = std::make_shared<State>();
  post([fn = std::move(fn), st] {
    {
      std::lock_guard<std::mutex> g(st->mu);
      if (st->phase == State::kWithdrawn) return;
      st->phase = State::kRunning;
    }
    bool failed = true;
    Error err(Cause::kInternal, -1, "");
    try {
      fn();
      failed = false;
    } catch (const Error& e) {
      err = e;
    } catch (const std::exception& e) {
      err = Error(Cause::kInternal, -1, std::string("unexpected exception in the progress engine: ") + e.what());
    } catch (...) {
      err = Error(Cause::kInternal, -1, "unexpected exception in the progress engine");
    }
    std::lock_guard<std::mutex> g(st->mu);
    st->failed = failed;
    if (failed) st->error = err;
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
  if (st->failed) throw Error(st->error);
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
  // (call()'s commands catch their own; a posted one that throws is a bug, contained here.)
  for (auto& c : cmds) {
    try {
      c();
    } catch (const std::exception& e) {
      contain(nullptr, "a posted command", &e);
    } catch (...) {
      contain(nullptr, "a posted command", nullptr);
    }
  }
}

// No exception leaves the engine's work (NCCL's process must outlive any bug of ours): a
// handler that throws fails the peer whose link or handshake it served, and the engine goes on.
void Engine::guarded_event(Pollable* p, uint32_t ev) {
  try {
    on_event(p, ev);
  } catch (const std::exception& e) {
    guarded_failure(p, &e);
  } catch (...) {
    guarded_failure(p, nullptr);
  }
}

void Engine::guarded_failure(Pollable* p, const std::exception* e) {
  if (p->kind == Pollable::kRail) return contain(static_cast<Link*>(p->obj)->peer, "a rail's event", e);
  if (p->kind == Pollable::kPending) {
    auto* pd = static_cast<Pending*>(p->obj);
    if (!pd->dead)
      pending_reject(*pd, std::string("internal error during the handshake: ") + (e ? e->what() : "an unknown exception"));
    return;
  }
  contain(nullptr, p->kind == Pollable::kListener ? "a listener's event" : "a wake-up", e);
}

Peer* Engine::peer(int rank) {
  auto it = peers_.find(rank);
  if (it == peers_.end())
    throw Error(Cause::kInvalidArgument, rank,
                "rank " + std::to_string(rank) + " is not a connected peer of rank " + std::to_string(rank_));
  return it->second.get();
}

std::vector<std::string> Engine::transports() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < transports_->size(); i++) out.push_back(transports_->backend(i).name);
  return out;
}

void Engine::add_peer(int peer, const std::vector<std::string>& addrs, bool open) {
  const std::string invalid = identity_->check_peer(peer);
  if (!invalid.empty()) throw Error(Cause::kInvalidArgument, peer, invalid);
  if (addrs.empty()) throw Error(Cause::kInvalidArgument, peer, "peer has no addresses");
  std::vector<PeerAddress> remote;
  for (auto& a : addrs) remote.push_back(parse_address(a));
  call([&] {
    if (peers_.count(peer)) throw Error(Cause::kInvalidArgument, peer, "peer added twice");
    Peer& c = make_peer(peer, remote);
    if (open) open_peer(c);
    for (auto& p : pendings_)
      if (p->parked && !p->dead) {
        p->parked = false;
        pending_hello(*p);
      }
  });
}

Peer& Engine::make_peer(int peer, const std::vector<PeerAddress>& addrs) {
  auto pr = std::make_unique<Peer>();
  pr->eng = this;
  pr->rank = peer;
  pr->connector = identity_->dials(peer);
  std::vector<NetAddr> remote;
  for (const PeerAddress& a : addrs) remote.push_back(a.addr);
  pr->remote = remote;
  size_t n_local = nics_.size(), n_remote = remote.size();
  size_t pairs = std::max(n_local, n_remote);
  std::vector<std::pair<int, int>> nic_pairs;
  std::vector<std::string> names;
  // A peer admitted from its first rail (the NCCL plugin's receive side) gave no addresses: it dials.
  auto unknown = [](const NetAddr& a) { return a.sa.sin_addr.s_addr == 0 && a.sa.sin_port == 0; };
  const std::string pname = identity_->peer_name(peer) + " (" + (unknown(remote[0]) ? "it dials in" : remote[0].str()) + ")";
  for (size_t i = 0; i < pairs * static_cast<size_t>(cfg_.conns_per_nic); i++) {
    size_t p = i % pairs;
    int local = static_cast<int>(p % n_local), rem = static_cast<int>(p % n_remote);
    nic_pairs.push_back({local, rem});
    const TransportBackend& mine = transports_->backend(static_cast<size_t>(local));
    const TransportBackend& theirs = *addrs[static_cast<size_t>(rem)].backend;
    if (&mine != &theirs)
      throw Error(Cause::kInvalidArgument, peer,
                  "rail " + std::to_string(i) + " to " + identity_->peer_name(peer) + ": our NIC " + nics_[local].name +
                      " uses " + mine.name + ", the peer's NIC " + remote[rem].str() + " uses " + theirs.name +
                      "; every rank must pick the same transport for a NIC pair (set R2CCL_TRANSPORT to one "
                      "transport on every rank, or give every rank the same kind of NIC on these NICs)");
    names.push_back("rail " + std::to_string(i) + " to " + identity_->peer_name(peer) + " (" + nics_[local].name +
                    " " + nics_[local].addr_str() +
                    (unknown(remote[rem]) ? " <- its NIC " + std::to_string(rem) : " -> " + remote[rem].str()) + ")");
    auto l = std::make_unique<Link>();
    l->peer = pr.get();
    l->index = static_cast<int>(i);
    l->poll.obj = l.get();
    pr->links.push_back(std::move(l));
  }
  pr->core = std::make_unique<ChannelCore>(peer, pname, std::move(names), nic_pairs, ChannelSettings::from(cfg_),
                                           pr.get(), now_ns());
  Peer& c = *pr;
  peers_[peer] = std::move(pr);
  return c;
}

void Engine::close_peer(int peer, const std::string& why) {
  call([&] {
    auto it = peers_.find(peer);
    if (it != peers_.end()) begin_close(*it->second, why, now_ns());
  });
}

void Engine::testing_throw_on(int peer) {
  call([&] { throw_on_peers_.insert(peer); });
}

void Engine::begin_close(Peer& pr, const std::string& why, int64_t now) {
  if (pr.closing != Peer::Closing::kOpen || pr.gone) return;
  pr.close_why = why;
  pr.close_deadline_ns = now + static_cast<int64_t>(cfg_.timeout_s * 1e9);
  pr.closing = Peer::Closing::kDelivering;
  pr.core->begin_close(Cause::kClosed, why, now);   // the caller's buffers are released here
  open_peer(pr);   // a connection closed before its rails came up still tells the peer
  step_close(pr, now);
}

void Engine::step_close(Peer& pr, int64_t now) {
  Channel& ch = pr.ch();
  if (pr.gone) return;
  if (ch.dead) return finish_close(pr);
  if (pr.closing == Peer::Closing::kDelivering) {
    if (ch.rails_up() > 0 && ch.eager_sends.empty()) {
      pr.closing = Peer::Closing::kSaidBye;
      pr.bye_ns = now;
      pr.core->goodbye();
      return;
    }
    if (ch.rails_up() > 0 && now - pr.acks_asked_ns >= 50 * kMs) {   // the acks the peer holds back
      pr.acks_asked_ns = now;
      pr.core->request_acks(now);
    }
    if (now < pr.close_deadline_ns) return;
    uint64_t bytes = 0;
    for (auto& r : ch.eager_sends) bytes += r->len;
    if (!ch.eager_sends.empty())
      R2_WARN("closing %s: %zu completed send(s) (%llu bytes) not acknowledged within R2CCL_TIMEOUT (%.1f s): %s",
              pr.core->peer_name().c_str(), ch.eager_sends.size(), static_cast<unsigned long long>(bytes),
              cfg_.timeout_s, ch.rails_up() ? "the peer does not acknowledge" : "no rail to it is up");
    else
      R2_INFO("closing %s: no rail came up within R2CCL_TIMEOUT to tell the peer", pr.core->peer_name().c_str());
    return finish_close(pr);
  }
  if (ch.rails_up() == 0 || now - pr.bye_ns >= std::min<int64_t>(kCloseLingerNs, pr.close_deadline_ns - pr.bye_ns))
    finish_close(pr);
}

void Engine::finish_close(Peer& pr) {
  if (pr.gone) return;
  pr.core->kill(Cause::kClosed, pr.close_why.empty() ? "closed" : pr.close_why);
  for (auto& l : pr.links) drop_link(pr, *l, true);
  pr.gone = true;
  reap_due_ = true;
}

void Engine::reap() {
  if (!reap_due_) return;
  reap_due_ = false;
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (!it->second->gone) {
      ++it;
      continue;
    }
    const int id = it->first;
    it = peers_.erase(it);
    identity_->peer_removed(id);
  }
}

void Engine::contain(Peer* pr, const char* where, const std::exception* e) {
  const std::string what = std::string("internal error on the progress engine (") + where + "): " +
                           (e ? e->what() : "an unknown exception");
  if (!pr) {
    R2_ERROR("%s; nothing was failed", what.c_str());
    return;
  }
  R2_ERROR("%s: %s fails, the others go on", what.c_str(), pr->core->peer_name().c_str());
  try {
    pr->core->kill(Cause::kInternal, what);
    for (auto& l : pr->links) drop_link(*pr, *l, true);
  } catch (...) {
  }
  if (pr->closing != Peer::Closing::kOpen) {
    pr->gone = true;
    reap_due_ = true;
  }
}

void Engine::open_peer(Peer& pr) {
  if (pr.opened) return;
  pr.opened = true;
  if (pr.connector)
    for (auto& l : pr.links) start_connect(pr, *l);
}

void Engine::open(const std::vector<int>& peers) {
  call([&] {
    for (int p : peers) open_peer(*peer(p));
  });
}

std::vector<int> Engine::opened_peers() {
  std::vector<int> out;
  call([&] {
    for (auto& [rank, pr] : peers_)
      if (pr->opened) out.push_back(rank);
  });
  return out;
}

// ---------------------------------------------------------------- the channel's RailIo

void Peer::kick(int rail) { eng->rail_flush(*this, *links[static_cast<size_t>(rail)]); }
void Peer::drop(int rail, bool was_up) { eng->drop_link(*this, *links[static_cast<size_t>(rail)], was_up); }
void Peer::redial(int rail) { eng->redial_link(*this, *links[static_cast<size_t>(rail)]); }
void Peer::payload_moved(int rail) {
  Link& l = *links[static_cast<size_t>(rail)];
  // Sockets always can (tcp_link.cc); a transport that cannot would have to keep the
  // cancelled send's buffer until the post completes.
  if (l.link && l.posted && !l.link->move_payload(l.cookie, this->rail(rail).cur.payload))
    R2_ERROR("%s: the transport cannot move a posted payload", core->rail_name(rail).c_str());
}

bool Peer::advertise(const Request& recv, AdvertBody* out) {
  if (!recv.reg) return false;
  const std::vector<uint32_t>& keys = recv.reg->keys();
  if (std::all_of(keys.begin(), keys.end(), [](uint32_t k) { return k == 0; })) return false;
  out->addr = reinterpret_cast<uint64_t>(recv.buf);
  out->len = recv.len;
  out->keys = keys;
  return true;
}

bool Peer::writes(int rail, const Request& send, uint64_t len) {
  const Link& l = *links[static_cast<size_t>(rail)];
  return send.reg && l.link && l.peer_trusts && len <= l.link->max_write_bytes() &&
         send.reg->on(eng->rail_transport(this->rail(rail))) != nullptr;
}

void Peer::revoke(const Request& recv) {
  if (!recv.reg) return;
  try {
    recv.reg->renew();   // new keys: a write still on its way with the old ones fails at its sender
  } catch (const Error& e) {
    // Not registered again (its old keys are gone all the same): later requests go in frames.
    R2_WARN("%s: registering memory again after a revoke failed: %s", core->peer_name().c_str(), e.what());
  }
}

void Peer::recv_dropped(int rail) {
  Link& l = *links[static_cast<size_t>(rail)];
  if (l.link && l.piece_posted && !l.link->drop_recv())
    R2_ERROR("%s: the transport cannot drop a posted receive", core->rail_name(rail).c_str());
}

void Engine::set_link(Link& l, std::unique_ptr<FrameLink> link) {
  if (l.link) {
    const FrameLink::CopiedBytes c = l.link->copied();
    l.copied_before.tx += c.tx;
    l.copied_before.rx += c.rx;
  }
  l.link = std::move(link);
  l.peer_trusts = false;
  l.generation++;
  l.posted = false;
  l.piece_posted = false;
}

void Engine::drop_link(Peer& pr, Link& l, bool was_up) {
  (void)pr;
  if (l.link) {
    epoll_del(l.link->wait_fd());
    if (was_up) l.link->shutdown();
    set_link(l, nullptr);
  }
  l.events = 0;
  if (!was_up) l.refused = false;   // only ECONNREFUSED counts as a refusal (attempt_failed)
  l.next_attempt_ns = now_ns() + cfg_.reprobe_ms * kMs;
}

bool Engine::may_dial(const Peer& pr, const Link& l) const {
  const Rail& r = *pr.core->ch.rails[static_cast<size_t>(l.index)];
  return pr.connector && pr.opened && !pr.gone && pr.closing != Peer::Closing::kSaidBye && l.fault != Fault::kClose && l.fault != Fault::kStall &&
         !nic_down_[static_cast<size_t>(r.local_nic)];
}

void Engine::redial_link(Peer& pr, Link& l) {
  l.next_attempt_ns = 0;
  if (may_dial(pr, l)) start_connect(pr, l);
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

void Engine::set_interest(Link& l) {
  if (!l.link) return;
  const Rail& r = l.peer->rail(l.index);
  uint32_t ev = 0;
  if (l.fault != Fault::kStall) {
    ev = EPOLLIN;
    bool rate_wait = l.next_tx_ns > now_ns();
    if (l.link->needs_writable_watch() && (r.state == RailState::kConnecting || (r.cur.active && !rate_wait)))
      ev |= EPOLLOUT;
  }
  if (ev != l.events) {
    epoll_mod(l.link->wait_fd(), &l.poll, ev);
    l.events = ev;
  }
}

int Engine::next_timeout_ms(int64_t now) const {
  int64_t next = next_tick_ns_;
  if (rate_faults_seen_)   // only an injected rate fault paces a rail (O(rails): an NCCL plugin has thousands)
    for (auto& [rank, pr] : peers_)
      for (auto& l : pr->links)
        if (pr->rail(l->index).cur.active && l->next_tx_ns > now) next = std::min(next, l->next_tx_ns);
  int64_t ms = (next - now + kMs - 1) / kMs;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

void Engine::run() {
  const int64_t tick_ns =
      std::max<int64_t>(1, std::min({cfg_.heartbeat_ms, cfg_.stall_ms, cfg_.reprobe_ms}) / 4) * kMs;
  epoll_event events[64], woke[2];
  std::unique_lock<std::mutex> running(run_mu_);
  CallerScope scope(this, false);
  next_tick_ns_ = now_ns() + tick_ns;
  while (!stop_.load()) {
    // Asleep without run_mu_, so a caller may take the caller's path meanwhile. Events it
    // handled first are seen here again and find nothing to do.
    int timeout_ms = next_timeout_ms(now_ns());
    if (lease_held_.load(std::memory_order_acquire)) {
      const int64_t left = lease_until_ns_.load(std::memory_order_relaxed) - now_ns();
      timeout_ms = std::min<int>(timeout_ms, static_cast<int>(std::clamp<int64_t>((left + kMs - 1) / kMs, 1, 1000)));
    }
    running.unlock();
    const int w = epoll_wait(sleep_fd_, woke, 2, timeout_ms);
    running.lock();
    end_test_lease(true);   // the poller stopped: the sockets are this thread's again
    for (int i = 0; i < w; i++)
      if (woke[i].data.ptr) guarded_event(static_cast<Pollable*>(woke[i].data.ptr), woke[i].events);
    const int n = epoll_wait(epfd_, events, 64, 0);
    for (int i = 0; i < n; i++) guarded_event(static_cast<Pollable*>(events[i].data.ptr), events[i].events);
    run_commands();
    int64_t now = now_ns();
    // Rails waiting only for rate-limit tokens.
    if (rate_faults_seen_)
      for (auto& [rank, pr] : peers_)
        for (auto& l : pr->links)
          if (pr->rail(l->index).cur.active && l->next_tx_ns && l->next_tx_ns <= now) {
            l->next_tx_ns = 0;
            pr->core->hold_rail(l->index, 0);
            rail_writable(*pr, *l);
          }
    if (now >= next_tick_ns_) {
      tick(now);
      next_tick_ns_ = now + tick_ns;
    }
    pendings_.remove_if([](const std::unique_ptr<Pending>& p) { return p->dead; });
    reap();
  }
  run_commands();
  // Goodbye: tell every peer on every live rail, give the frames a moment to leave.
  for (auto& [rank, pr] : peers_) pr->core->goodbye();
  int64_t until = now_ns() + 200 * kMs;
  for (;;) {
    bool busy = false;
    for (auto& [rank, pr] : peers_)
      for (auto& l : pr->links) {
        Rail& r = pr->rail(l->index);
        if (r.state == RailState::kUp && (r.cur.active || !r.ctrl.empty())) {
          if (rail_flush(*pr, *l)) busy = busy || r.cur.active;
        }
      }
    if (!busy || now_ns() > until) break;
    usleep(1000);
  }
  for (auto& [rank, pr] : peers_)
    pr->core->kill(Cause::kClosed, "the r2ccl endpoint of rank " + std::to_string(rank_) + " was closed");
  pendings_.clear();
  stopped_ = true;
}

void Engine::drain_eager() {
  // Eager sends finished when copied, so the caller may close right after one: their bytes
  // reach the peer first. Bounded: a peer that neither acks nor loses its rails is left.
  const int64_t until = now_ns() + std::min<int64_t>(static_cast<int64_t>(cfg_.timeout_s * 1e9), kEagerDrainNs);
  size_t left = 0;
  for (int round = 0;; round++) {
    left = 0;
    try {
      call([this, &left, round] {
        for (auto& [rank, pr] : peers_) {
          Channel& c = pr->ch();
          if (c.dead || c.rails_up() == 0 || c.eager_sends.empty()) continue;
          // Ask for the acks the peer holds back (at the first look, then every 50 ms).
          left += round % 50 == 0 ? pr->core->request_acks(now_ns()) : c.eager_sends.size();
        }
      });
    } catch (const Error&) {
      return;   // closed meanwhile, or called from the engine's own work
    }
    if (left == 0) return;
    if (now_ns() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  R2_WARN("closing with %zu eager send(s) not acknowledged by their peer after %lld ms", left,
          static_cast<long long>(std::min<int64_t>(static_cast<int64_t>(cfg_.timeout_s * 1e9), kEagerDrainNs) / kMs));
}

void Engine::shutdown() {
  if (!stop_.load() && t_running != this && std::this_thread::get_id() != thread_.get_id()) drain_eager();
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
      auto* l = static_cast<Link*>(p->obj);
      if (!l->link || l->link->wait_fd() != p->fd) return;   // replaced or closed in this batch
      Peer& pr = *l->peer;
      // Readable means any completion may be ready (a verbs link reports sends and a finished
      // connect that way too); writable, that a blocked socket send may move.
      if (pr.rail(l->index).state == RailState::kConnecting) {
        if (ev & (EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP)) rail_writable(pr, *l);
        return;
      }
      if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) rail_readable(pr, *l);
      if (!l->link || l->link->wait_fd() != p->fd) return;
      const Rail& r = pr.rail(l->index);
      if ((ev & EPOLLOUT) || (r.cur.active && !l->link->send_blocked() && l->next_tx_ns == 0)) rail_writable(pr, *l);
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
  for (auto& [rank, pr] : peers_)
    for (auto& r : pr->ch().rails)
      if (r->state == RailState::kUp && r->pace.busy_since(since)) {
        const size_t k = static_cast<size_t>(r->local_nic);
        rate[k] += r->pace.share_rate();
        inflight[k] += static_cast<double>(r->inflight);
        busy[k]++;
      }
  nic_drain_ns_.assign(nics_.size(), 0);
  for (size_t k = 0; k < nics_.size(); k++)
    if (rate[k] > 0) nic_drain_ns_[k] = static_cast<int64_t>(inflight[k] * 1e9 / rate[k]);
  for (auto& [rank, pr] : peers_) {
    for (auto& r : pr->ch().rails) {
      const size_t k = static_cast<size_t>(r->local_nic);
      if (r->pace.busy_since(since)) pr->core->share_window(r->index, rate[k], busy[k]);
    }
    pr->core->pump(now);
  }
}

void Engine::tick(int64_t now) {
  stranger_log_window(now);
  for (auto& p : pendings_)
    if (!p->dead && now > p->deadline_ns && !p->parked) pending_reject(*p, "handshake not finished in time");
    else if (!p->dead && p->parked && now > p->deadline_ns + 10 * cfg_.connect_timeout_ms * kMs)
      pending_reject(*p, "hello names a rank that never joined");
  share_windows(now);
  for (auto& [rank, prp] : peers_) {
    Peer& pr = *prp;
    try {
      tick_peer(pr, now);
    } catch (const std::exception& e) {
      contain(&pr, "a peer's timers", &e);
    } catch (...) {
      contain(&pr, "a peer's timers", nullptr);
    }
  }
}

void Engine::tick_peer(Peer& pr, int64_t now) {
  if (!throw_on_peers_.empty() && throw_on_peers_.erase(pr.rank))
    throw std::runtime_error("thrown by testing_throw_on");
  if (pr.closing != Peer::Closing::kOpen) step_close(pr, now);
  if (pr.ch().dead) return;
  for (auto& lp : pr.links) {
    Link& l = *lp;
    switch (pr.rail(l.index).state) {
      case RailState::kConnecting:
      case RailState::kHandshake:
        if (now > l.attempt_deadline_ns) attempt_failed(pr, l, "connect/handshake timed out", false);
        break;
      case RailState::kDown:
        if (now >= l.next_attempt_ns && may_dial(pr, l)) start_connect(pr, l);
        break;
      case RailState::kUp:
        break;
    }
  }
  // A link may hold off its readable event until a frame's piece is whole (a socket's
  // receive low-water mark); what a slow rail has delivered of it still counts as life.
  for (auto& lp : pr.links)
    if (lp->link && pr.rail(lp->index).state == RailState::kUp && pr.rail(lp->index).rx.in_payload)
      rail_readable(pr, *lp);
  pr.core->tick(now, nic_drain_ns_);
  check_peer_gone(pr, now);
}

// Every rail is down: ends the channel promptly when the peer is evidently gone.
void Engine::check_peer_gone(Peer& pr, int64_t now) {
  Channel& ch = pr.ch();
  if (ch.dead || ch.rails_up() > 0 || ch.all_down_since == 0) return;
  bool ever_up = false, all_closed = true, all_refused = true;
  for (auto& l : pr.links) {
    const Rail& r = pr.rail(l->index);
    ever_up = ever_up || r.ever_up;
    all_closed = all_closed && r.closed_by_peer;
    all_refused = all_refused && l->refused;
  }
  if (!ever_up) return;   // still starting up: wait_ready() reports that
  int64_t down_ms = (now - ch.all_down_since) / kMs;
  // A dead process's kernel resets its connections and refuses new ones; a NIC failure does
  // neither. The dialling side sees refusals on every re-dial; the listening side, once
  // every connection was closed on it, asks the peer's listener directly.
  int64_t grace_ms = std::max<int64_t>(1000, 3 * cfg_.reprobe_ms);
  bool gone = pr.connector ? all_refused : false;
  if (!pr.connector && pr.probe_listener && all_closed && down_ms >= grace_ms && now - pr.last_probe_ns > grace_ms * kMs) {
    pr.last_probe_ns = now;
    gone = probe_refused(pr);
  }
  if (gone && down_ms >= grace_ms / 2)
    pr.core->kill(Cause::kPeerGone,
                  pr.core->peer_name() + " is gone: its connections were closed and its listener refuses new ones (" +
                      std::to_string(down_ms) + " ms without a rail; process exited or was killed?)");
}

// Dials the peer's first listener that is not held down by an injected fault and waits up to
// 100 ms: true only when the connection is actively refused (nothing listens there any more).
bool Engine::probe_refused(Peer& pr) {
  for (auto& l : pr.links) {
    if (l->fault == Fault::kClose || l->fault == Fault::kStall) continue;
    const Rail& r = pr.rail(l->index);
    std::unique_ptr<FrameLink> c;
    try {
      c = rail_transport(r).connect(nics_[r.local_nic], pr.remote[r.remote_nic], linkopt_);
    } catch (const Error&) {
      continue;
    }
    ConnectState st = c->finish_connect();
    if (st == ConnectState::kPending) {
      pollfd pfd{c->wait_fd(), static_cast<short>(c->needs_writable_watch() ? POLLOUT : POLLIN), 0};
      ::poll(&pfd, 1, 100);
      st = c->finish_connect();
    }
    R2_INFO("liveness probe of %s: %s", pr.core->peer_name().c_str(),
            st == ConnectState::kUp ? "listening" : st == ConnectState::kFailed ? c->failure().detail.c_str() : "no answer");
    return st == ConnectState::kFailed && c->failure().error == LinkError::kRefused;
  }
  return false;
}

// ---------------------------------------------------------------- stats, faults, weights

// On the engine thread: the rails of `pr` appended to `out`.
void Engine::collect_stats(const Peer& pr, int64_t now, double unix_now, std::vector<RailStats>& out) const {
  for (auto& lp : pr.links) {
    const Link& l = *lp;
    const Rail& r = pr.rail(l.index);
    RailStats s;
    s.rail = r.index;
    s.local_nic = r.local_nic;
    s.remote_nic = r.remote_nic;
    s.local_nic_name = nics_[r.local_nic].name;
    s.local_addr = nics_[r.local_nic].addr_str();
    s.remote_addr = pr.remote[r.remote_nic].str();
    s.transport = rail_transport(r).name();
    s.state = r.state;
    s.weight = r.weight;
    s.standby = r.standby;
    s.tx_bytes = r.tx_bytes;
    s.rx_bytes = r.rx_bytes;
    s.tx_chunks = r.tx_chunks;
    s.rx_chunks = r.rx_chunks;
    s.acked_bytes = r.acked_bytes;
    const FrameLink::CopiedBytes now_copied = l.link ? l.link->copied() : FrameLink::CopiedBytes{};
    s.tx_copied_bytes = l.copied_before.tx + now_copied.tx;
    s.rx_copied_bytes = l.copied_before.rx + now_copied.rx;
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
    s.busy_s = static_cast<double>(r.busy_ns + (r.busy_since_ns ? now - r.busy_since_ns : 0)) / 1e9;
    s.link_down = nic_down_[static_cast<size_t>(r.local_nic)];
    s.fault = l.fault;
    s.last_error = r.last_error;
    s.last_reason = r.last_reason;
    s.last_change_unix_s = unix_now - static_cast<double>(now - r.changed_ns) / 1e9;
    s.last_failure_unix_s = r.failed_ns ? unix_now - static_cast<double>(now - r.failed_ns) / 1e9 : 0.0;
    out.push_back(std::move(s));
  }
}

std::vector<RailStats> Engine::stats(int rank) {
  std::vector<RailStats> out;
  call([&] { collect_stats(*peer(rank), now_ns(), unix_time_s(), out); });
  return out;
}

// One call into the engine thread for every peer (the health monitor's sample: one call per
// peer cost a thread hand-over each, 20 times a second, for every NCCL connection).
std::map<int, std::vector<RailStats>> Engine::all_stats() {
  std::map<int, std::vector<RailStats>> out;
  call([&] {
    const int64_t now = now_ns();
    const double unix_now = unix_time_s();
    for (auto& [rank, pr] : peers_) collect_stats(*pr, now, unix_now, out[rank]);
  });
  return out;
}

InjectResult Engine::inject(int rank, int rail, Fault fault, double rate) {
  InjectResult held;
  call([&] {
    Peer& pr = *peer(rank);
    if (rail < 0 || rail >= static_cast<int>(pr.links.size()))
      throw Error(Cause::kInvalidArgument, rank, "rail " + std::to_string(rail) + " does not exist (rank " +
                                                     std::to_string(rank) + " has " +
                                                     std::to_string(pr.links.size()) + " rails)");
    if (fault == Fault::kRate && !(rate > 0))
      throw Error(Cause::kInvalidArgument, rank, "a rate fault needs a rate > 0 bytes/s");
    Link& l = *pr.links[static_cast<size_t>(rail)];
    Rail& r = pr.rail(rail);
    const int64_t now = now_ns();
    R2_WARN("%s: injected fault '%s'", pr.core->rail_name(rail).c_str(),
            fault == Fault::kNone ? "heal" : fault_name(fault));
    l.fault = fault;
    if (fault == Fault::kRate) rate_faults_seen_ = true;
    l.rate_bps = rate;
    l.tokens = 0;
    l.tokens_ns = now;
    l.next_tx_ns = 0;
    if (r.state == RailState::kUp)
      for (const auto& [seq, c] : pr.ch().window)
        if (c.rail == rail) {
          held.unacked_chunks++;
          held.unacked_bytes += c.len;
        }
    pr.core->hold_rail(rail, 0);
    pr.core->set_paused(rail, fault == Fault::kStall, now);
    if (fault == Fault::kClose && r.state != RailState::kDown)
      pr.core->fail_rail(rail, FailReason::kInjected, "closed by injected fault", now);
    if (l.link) set_interest(l);
    if (fault == Fault::kNone) {
      l.next_attempt_ns = 0;
      if (r.state == RailState::kUp) rail_writable(pr, l);
    }
  });
  return held;
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
    const int64_t now = now_ns();
    for (auto& [rank, prp] : peers_) {
      Peer& pr = *prp;
      if (pr.ch().dead) continue;
      for (auto& lp : pr.links) {
        Link& l = *lp;
        Rail& r = pr.rail(l.index);
        if (r.local_nic != nic) continue;
        // Tell the peer on a live rail of another NIC: its end of this rail sees nothing
        // when the link is down on this side of a switch.
        pr.core->send_rail_state(l.index, up, now);
        if (!up) {
          if (r.state != RailState::kDown) pr.core->fail_rail(l.index, FailReason::kLinkDown, "link down: " + why, now);
        } else if (r.state == RailState::kDown) {
          redial_link(pr, l);   // re-dial now (the dialling side) or on the peer's notice
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
    for (auto& [rank, pr] : peers_) out.push_back(rank);
  });
  return out;
}

uint64_t Engine::staged_bytes() {
  uint64_t n = 0;
  call([&] {
    for (auto& [rank, pr] : peers_) n += pr->core->staged_bytes();
  });
  return n;
}

std::vector<std::pair<uint64_t, std::vector<uint8_t>>> Engine::staged_heads(int rank, size_t n) {
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> out;
  call([&] {
    auto it = peers_.find(rank);
    if (it != peers_.end()) out = it->second->core->staged_heads(n);
  });
  return out;
}

// On the engine thread: `fn` on the channel of `rank`, whose rail `rail` must exist.
void Engine::on_rail(int rank, int rail, const std::function<void(ChannelCore&)>& fn) {
  call([&] {
    Peer& pr = *peer(rank);
    if (rail < 0 || rail >= static_cast<int>(pr.links.size()))
      throw Error(Cause::kInvalidArgument, rank, "rail " + std::to_string(rail) + " does not exist");
    fn(*pr.core);
  });
}

void Engine::set_weight(int rank, int rail, double w) {
  if (!(w >= 0) || !std::isfinite(w)) throw Error(Cause::kInvalidArgument, rank, "rail weight must be finite and >= 0");
  on_rail(rank, rail, [&](ChannelCore& ch) { ch.set_weight(rail, w, now_ns()); });
}

void Engine::set_standby(int rank, int rail, bool standby) {
  on_rail(rank, rail, [&](ChannelCore& ch) { ch.set_standby(rail, standby, now_ns()); });
}

// ---------------------------------------------------------------- requests

void Engine::do_submit(const std::shared_ptr<Request>& req) {
  auto it = peers_.find(req->peer);
  if (it == peers_.end()) {
    req->finish_error(Cause::kInvalidArgument, "rank " + std::to_string(req->peer) + " is not a connected peer");
    return;
  }
  open_peer(*it->second);   // connections on demand: the first request opens the peer's rails
  if (req->len > 0 && !req->reg) req->reg = registration_for(req->buf, req->len);
  req->registered = req->reg != nullptr;
  it->second->core->submit(req, now_ns());
}

bool Engine::may_take_caller_path(const Request& req) const {
  return req.len <= kCallerPathMaxBytes && cfg_.poll_us > 0 && t_running != this;
}

void Engine::submit(const std::shared_ptr<Request>& req) {
  // The caller's path: only with nothing queued, so it never overtakes a command this
  // thread (or any) posted before.
  if (may_take_caller_path(*req) && try_run_lock()) {
    std::lock_guard<std::mutex> running(run_mu_, std::adopt_lock);
    bool queued;
    {
      std::lock_guard<std::mutex> g(cmd_mu_);
      queued = !cmds_.empty();
    }
    if (!queued && !stopped_ && !stop_.load()) {
      CallerScope scope(this, true);
      do_submit(req);
      return;
    }
  }
  post([this, req] { do_submit(req); });
  if (stop_.load()) req->finish_error(Cause::kClosed, "the r2ccl endpoint is closed");
}

// run_mu_ for the caller's path: the engine thread's turns are short, so wait for it a
// little (R2CCL_POLL_US, at most 50 us), but never block: the caller may hold a lock that
// the engine thread's on_finish callbacks take.
bool Engine::try_run_lock() {
  if (run_mu_.try_lock()) return true;
  const int64_t until = now_ns() + std::min<int64_t>(cfg_.poll_us, 50) * 1000;
  do {
    std::this_thread::yield();
    if (run_mu_.try_lock()) return true;
  } while (now_ns() < until);
  return false;
}

// One look at the sockets on the caller's thread, if the engine is idle. Wake-ups are left
// for the engine thread (it runs the commands they announce).
bool Engine::caller_poll() {
  if (!run_mu_.try_lock()) return false;
  std::lock_guard<std::mutex> running(run_mu_, std::adopt_lock);
  if (stopped_ || stop_.load()) return false;
  CallerScope scope(this, true);
  epoll_event events[16];
  const int n = epoll_wait(epfd_, events, 16, 0);
  for (int i = 0; i < n; i++) guarded_event(static_cast<Pollable*>(events[i].data.ptr), events[i].events);
  return true;
}

// The engine thread stops sleeping on the sockets while any caller polls them (and looks at
// them again when the last one stops: what arrived meanwhile wakes it then).
void Engine::caller_polling(bool start) {
  std::lock_guard<std::mutex> g(pollers_mu_);
  pollers_changed(start);
}

// pollers_mu_ held: one poller more (start) or fewer; the first takes the socket set out of
// the engine thread's sleep set, the last puts it back.
void Engine::pollers_changed(bool start) {
  if (start ? pollers_++ != 0 : --pollers_ != 0) return;
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.ptr = nullptr;
  epoll_ctl(sleep_fd_, start ? EPOLL_CTL_DEL : EPOLL_CTL_ADD, epfd_, &e);
}

bool Engine::caller_wait(const std::shared_ptr<Request>& req) {
  if (req->finished()) return true;
  if (!may_take_caller_path(*req)) {
    end_test_lease(false);   // this caller is about to block: the engine thread must watch the sockets
    return false;
  }
  const int64_t until = now_ns() + static_cast<int64_t>(cfg_.poll_us) * 1000;
  caller_polling(true);
  bool done = false;
  while (!(done = req->finished()) && now_ns() < until) {
    caller_poll();
    if ((done = req->finished())) break;
    std::this_thread::yield();   // let the engine thread take run_mu_ if it waits for it
  }
  caller_polling(false);
  if (!done) end_test_lease(false);
  return done;
}

// The test lease (engine.h): taken by a test() that polls, kept by every later one, ended
// by the engine thread once kTestLeaseNs pass without one, or by a caller about to block.
void Engine::renew_test_lease() {
  lease_until_ns_.store(now_ns() + kTestLeaseNs, std::memory_order_relaxed);
  if (lease_held_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> g(pollers_mu_);
  if (lease_held_.load(std::memory_order_relaxed)) return;
  lease_held_.store(true, std::memory_order_release);
  // The engine thread may be asleep until its next tick: wake it once, so it sleeps again no
  // longer than the lease and looks at the sockets soon after this caller stops polling.
  uint64_t one = 1;
  ssize_t w = ::write(wakefd_, &one, sizeof one);
  (void)w;
  pollers_changed(true);
}

void Engine::end_test_lease(bool only_if_lapsed) {
  if (!lease_held_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> g(pollers_mu_);
  if (!lease_held_.load(std::memory_order_relaxed) ||
      (only_if_lapsed && now_ns() < lease_until_ns_.load(std::memory_order_relaxed)))
    return;
  lease_held_.store(false, std::memory_order_release);
  pollers_changed(false);
}

bool Engine::test(const std::shared_ptr<Request>& req) {
  if (req->finished()) return true;
  // A caller that polls does the socket work of every request while it polls, large ones'
  // included: the engine thread would only race it for the same events.
  if (cfg_.poll_us > 0 && t_running != this) {
    renew_test_lease();
    caller_poll();   // one pass; try_lock: never waits for the engine thread
  }
  return req->finished();
}

void Engine::cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why) {
  try {
    call([&] {
      auto it = peers_.find(req->peer);
      if (it != peers_.end()) {
        it->second->core->cancel(req, cause, why, now_ns());
      } else if (!req->finished()) {
        req->cancelled = true;
        req->finish_error(cause, why);
      }
    });
  } catch (const Error&) {
    // engine closed: it no longer touches any buffer
  }
}


// ---------------------------------------------------------------- Endpoint facade

Endpoint::Endpoint(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
                   const std::string& secret)
    : engine_(std::make_unique<Engine>(cfg, rank, world, nics, secret)) {}
Endpoint::Endpoint(const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
                   std::unique_ptr<PeerIdentity> identity)
    : engine_(std::make_unique<Engine>(cfg, rank, world, nics, std::move(identity))) {}
Endpoint::~Endpoint() = default;
void Endpoint::close_peer(int peer, const std::string& why) { engine_->close_peer(peer, why); }
void Endpoint::testing_throw_on(int peer) { engine_->testing_throw_on(peer); }
int Endpoint::rank() const { return engine_->rank(); }
int Endpoint::world() const { return engine_->world(); }
std::vector<std::string> Endpoint::addresses() const { return engine_->addresses(); }
std::vector<std::string> Endpoint::transports() const { return engine_->transports(); }
void Endpoint::add_peer(int peer, const std::vector<std::string>& a, bool open) { engine_->add_peer(peer, a, open); }
bool Endpoint::test(const std::shared_ptr<Request>& req) { return engine_->test(req); }
void Endpoint::post(const std::shared_ptr<Request>& req) { engine_->submit(req); }
void Endpoint::open(const std::vector<int>& peers) { engine_->open(peers); }
std::vector<int> Endpoint::opened_peers() { return engine_->opened_peers(); }

void Endpoint::wait_ready(const std::vector<int>& peers, double timeout_s, double degraded_after_s) {
  const int64_t start = now_ns();
  int64_t deadline = start + static_cast<int64_t>(timeout_s * 1e9);
  for (;;) {
    std::string missing;
    bool every_peer_has_one = true;
    for (int p : peers) {
      bool one = false;
      for (auto& s : engine_->stats(p)) {
        if (s.state == RailState::kUp) {
          one = true;
          continue;
        }
        missing += "\n  rank " + std::to_string(p) + " rail " + std::to_string(s.rail) + " (" + s.local_addr + " -> " +
                   s.remote_addr + "): " + rail_state_name(s.state) + (s.last_error.empty() ? "" : ", " + s.last_error);
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
                                             std::function<void()> on_finish, bool tag_once) {
  auto req = std::make_shared<Request>(Request::kSend, peer, tag, static_cast<uint8_t*>(const_cast<void*>(buf)), len);
  req->on_finish = std::move(on_finish);
  req->tag_once = tag_once;
  engine_->submit(req);
  return req;
}

std::shared_ptr<Request> Endpoint::post_recv(int peer, uint64_t tag, void* buf, uint64_t len,
                                             std::function<void()> on_finish, bool tag_once) {
  auto req = std::make_shared<Request>(Request::kRecv, peer, tag, static_cast<uint8_t*>(buf), len);
  req->on_finish = std::move(on_finish);
  req->tag_once = tag_once;
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
  if (!engine_->caller_wait(req) && !req->wait_until(deadline)) {
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
std::map<int, std::vector<RailStats>> Endpoint::all_rail_stats() { return engine_->all_stats(); }
InjectResult Endpoint::inject(int peer, int rail, Fault f, double rate) { return engine_->inject(peer, rail, f, rate); }
void Endpoint::set_rail_weight(int peer, int rail, double w) { engine_->set_weight(peer, rail, w); }
void Endpoint::set_rail_standby(int peer, int rail, bool standby) { engine_->set_standby(peer, rail, standby); }
void Endpoint::set_nic_state(int nic, bool up, const std::string& why) { engine_->set_nic_state(nic, up, why); }
std::vector<NicInfo> Endpoint::nics() const { return engine_->nic_list(); }
std::vector<int> Endpoint::peers() { return engine_->peer_list(); }
std::string Endpoint::peer_name(int peer) const { return engine_->peer_name(peer); }
uint64_t Endpoint::staged_bytes() { return engine_->staged_bytes(); }
std::vector<std::pair<uint64_t, std::vector<uint8_t>>> Endpoint::staged_heads(int peer, size_t n) {
  return engine_->staged_heads(peer, n);
}
void Endpoint::close() { engine_->shutdown(); }
void Endpoint::testing_block_engine(double seconds) { engine_->testing_block(seconds); }
void Endpoint::testing_set_call_timeout(double seconds) {
  engine_->testing_set_call_timeout_ms(static_cast<int64_t>(seconds * 1000));
}
std::string Endpoint::testing_call_from_engine_thread() { return engine_->testing_call_from_engine_thread(); }
bool Endpoint::testing_test_lease_held() const { return engine_->testing_test_lease_held(); }

// ---------------------------------------------------------------- registered memory

uint64_t Engine::register_memory(const void* base, size_t len, const DmaBuf* dmabuf) {
  if (!base || len == 0) throw Error(Cause::kInvalidArgument, -1, "register_memory of no memory");
  if (dmabuf && dmabuf->fd < 0)
    throw Error(Cause::kInvalidArgument, -1, "register_dmabuf with fd " + std::to_string(dmabuf->fd));
  auto reg = std::make_shared<Registration>(base, len, *transports_, nics_, dmabuf);
  std::lock_guard<std::mutex> g(reg_mu_);
  regs_[++next_reg_] = std::move(reg);
  by_base_.emplace(reinterpret_cast<uintptr_t>(base), next_reg_);
  return next_reg_;
}

void Engine::deregister_memory(uint64_t id) {
  std::shared_ptr<Registration> gone;   // released outside the lock (deregistering takes time)
  {
    std::lock_guard<std::mutex> g(reg_mu_);
    auto it = regs_.find(id);
    if (it == regs_.end())
      throw Error(Cause::kInvalidArgument, -1, "deregister_memory of id " + std::to_string(id) + ", which is not registered");
    gone = std::move(it->second);
    regs_.erase(it);
    auto range = by_base_.equal_range(reinterpret_cast<uintptr_t>(gone->base()));
    for (auto b = range.first; b != range.second; ++b)
      if (b->second == id) {
        by_base_.erase(b);
        break;
      }
  }
}

std::shared_ptr<Registration> Engine::registration_for(const void* p, size_t n) {
  std::lock_guard<std::mutex> g(reg_mu_);
  // The registrations that start at or below p, nearest first: with disjoint ones (NCCL's) the
  // first decides; overlapping ones are looked through a few deep, then the request goes in frames.
  auto it = by_base_.upper_bound(reinterpret_cast<uintptr_t>(p));
  for (int k = 0; k < 16 && it != by_base_.begin(); k++) {
    --it;
    const auto& reg = regs_.at(it->second);
    if (reg->covers(p, n)) return reg;
  }
  return nullptr;
}

uint64_t Endpoint::register_memory(const void* base, size_t len) { return engine_->register_memory(base, len); }
std::string Engine::dmabuf_support() const {
  std::string why;
  std::vector<const Transport*> seen;
  for (size_t i = 0; i < transports_->size(); i++) {
    const Transport& t = transports_->of(i);
    if (std::find(seen.begin(), seen.end(), &t) != seen.end()) continue;
    seen.push_back(&t);
    const std::string no = t.dmabuf_support();
    if (!no.empty()) why += (why.empty() ? "" : "; ") + std::string(t.name()) + ": " + no;
  }
  return why;
}

std::string Endpoint::dmabuf_support() const { return engine_->dmabuf_support(); }

uint64_t Endpoint::register_dmabuf(const void* base, size_t len, int fd, uint64_t offset) {
  const DmaBuf buf{fd, offset};
  return engine_->register_memory(base, len, &buf);
}
void Endpoint::deregister_memory(uint64_t id) { engine_->deregister_memory(id); }

}  // namespace r2ccl
