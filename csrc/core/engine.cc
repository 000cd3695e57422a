// The progress engine: epoll loop, acceptor handshake, rail I/O, chunk dealing, acks,
// failover and failback. Every function here runs on the engine thread unless its comment
// says otherwise. Knows nothing of collectives or JAX.
#include "core/engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <future>

#include "base/log.h"
#include "core/digest.h"

namespace r2ccl {

const char* rail_state_name(RailState s) {
  switch (s) {
    case RailState::kConnecting: return "connecting";
    case RailState::kHandshake: return "handshake";
    case RailState::kUp: return "up";
    case RailState::kDown: return "down";
  }
  return "?";
}

namespace {

constexpr int64_t kMs = 1000000;
constexpr size_t kMaxPendings = 64;
constexpr char kAcceptorLabel[] = "r2ccl-v1-acceptor";
constexpr char kConnectorLabel[] = "r2ccl-v1-connector";

void random_bytes(uint8_t* out, size_t n) {
  while (n > 0) {
    ssize_t got = getrandom(out, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(Cause::kSystem, -1, std::string("getrandom: ") + std::strerror(errno));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
}

std::array<uint8_t, kMacBytes> handshake_mac(const std::string& secret, const char* label,
                                             const uint8_t* hello, const uint8_t* nonce) {
  ByteSpan parts[3] = {{label, std::strlen(label)}, {hello, kHelloBytes}, {nonce, kNonceBytes}};
  return hmac_sha256(secret.data(), secret.size(), parts, 3);
}

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kNone: return "";
    case Fault::kClose: return "close";
    case Fault::kStall: return "stall";
    case Fault::kRate: return "rate";
  }
  return "?";
}

void encode_frame(TxFrame* f, FrameType t, std::vector<uint8_t> payload, uint64_t seq) {
  FrameHeader h;
  h.type = t;
  h.payload_len = static_cast<uint32_t>(payload.size());
  h.seq = seq;
  f->owned = std::move(payload);
  encode_header(h, f->hdr);
  f->payload = f->owned.data();
  f->payload_len = f->owned.size();
  f->done = 0;
  f->active = true;
  f->is_data = false;
  f->is_ack = t == FrameType::kAck;
}

// Reads into rx.hdr until a whole header is there. Returns kOk when complete.
IoResult read_header(Connection& c, RxFrame& rx) {
  while (rx.hdr_got < kHeaderBytes) {
    IoResult res = c.read(rx.hdr + rx.hdr_got, kHeaderBytes - rx.hdr_got);
    if (res.kind != IoResult::kOk) return res;
    rx.hdr_got += res.bytes;
  }
  return {IoResult::kOk, 0, 0};
}

}  // namespace

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
  log_set_level(cfg.debug_level);
  log_set_rank(rank);
  for (auto& n : nics) nics_.push_back(resolve_nic(n));
  auto id = sha256(secret.data(), secret.size());
  job_id_ = load_le64(id.data());
  sockopt_.buffer_bytes = cfg.socket_buffer_bytes;
  sockopt_.user_timeout_ms = cfg.tcp_user_timeout_ms;
  sockopt_.bind_device = cfg.bind_device;
  limits_.max_chunk_bytes = 64ull << 20;
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
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  shutdown();
  if (epfd_ >= 0) ::close(epfd_);
  if (wakefd_ >= 0) ::close(wakefd_);
}

void Engine::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> g(cmd_mu_);
    cmds_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  ssize_t w = ::write(wakefd_, &one, sizeof one);
  (void)w;
}

void Engine::call(std::function<void()> fn) {
  if (stop_.load()) throw Error(Cause::kClosed, -1, "the r2ccl endpoint is closed");
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  post([fn = std::move(fn), done] {
    try {
      fn();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  if (fut.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    throw Error(Cause::kTimeout, -1, "the r2ccl progress engine did not answer within 30 s");
  fut.get();
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
    for (size_t i = 0; i < pairs * static_cast<size_t>(cfg_.conns_per_nic); i++) {
      auto r = std::make_unique<Rail>();
      r->ch = ch.get();
      r->index = static_cast<int>(i);
      size_t p = i % pairs;
      r->local_nic = static_cast<int>(p % n_local);
      r->remote_nic = static_cast<int>(p % n_remote);
      r->poll.obj = r.get();
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

// ---------------------------------------------------------------- acceptor handshake

void Engine::accept_all(int nic) {
  for (;;) {
    auto c = listeners_[nic]->accept();
    if (!c) return;
    if (pendings_.size() >= kMaxPendings) {
      R2_WARN("dropped connection %s on NIC %s: %zu handshakes already pending", c->describe().c_str(),
              nics_[nic].name.c_str(), pendings_.size());
      continue;
    }
    auto p = std::make_unique<Pending>();
    p->conn = std::move(c);
    p->nic = nic;
    p->poll.obj = p.get();
    p->deadline_ns = now_ns() + cfg_.connect_timeout_ms * kMs;
    p->desc = p->conn->describe();
    epoll_add(p->conn->fd(), &p->poll, EPOLLIN);
    pendings_.push_back(std::move(p));
  }
}

void Engine::pending_reject(Pending& p, const std::string& why) {
  // A dial that closes without a byte (a liveness probe, a port check) is not an intruder.
  bool silent = (p.stage == 0 && p.rx.hdr_got == 0 && why.rfind("closed", 0) == 0) ||
                why.find("injected fault") != std::string::npos;
  R2_LOG(silent ? LogLevel::kInfo : LogLevel::kWarn, "rejected connection %s on NIC %s: %s", p.desc.c_str(),
         nics_[p.nic].name.c_str(), why.c_str());
  epoll_del(p.conn->fd());
  p.conn.reset();
  p.dead = true;
}

void Engine::pending_read(Pending& p) {
  for (;;) {
    if (p.parked) return;   // stays queued in the kernel until the peer is known
    IoResult res = read_header(*p.conn, p.rx);
    if (res.kind == IoResult::kWouldBlock) return;
    if (res.kind != IoResult::kOk) {
      pending_reject(p, res.kind == IoResult::kEof ? "closed before the handshake finished"
                                                   : std::string("read error: ") + std::strerror(res.err));
      return;
    }
    if (!p.rx.in_payload) {
      std::string bad = decode_header(p.rx.hdr, limits_, &p.rx.h);
      if (!bad.empty()) return pending_reject(p, "invalid frame: " + bad);
      FrameType want = p.stage == 0 ? FrameType::kHello : FrameType::kAuth;
      if (p.rx.h.type != want) return pending_reject(p, "unexpected frame type during handshake");
      p.rx.ctrl.resize(p.rx.h.payload_len);
      p.rx.in_payload = true;
      p.rx.got = 0;
    }
    while (p.rx.got < p.rx.ctrl.size()) {
      IoResult r2 = p.conn->read(p.rx.ctrl.data() + p.rx.got, p.rx.ctrl.size() - p.rx.got);
      if (r2.kind == IoResult::kWouldBlock) return;
      if (r2.kind != IoResult::kOk) return pending_reject(p, "closed during the handshake");
      p.rx.got += r2.bytes;
    }
    p.rx.reset();
    if (p.stage == 0) {
      std::memcpy(p.hello, p.rx.ctrl.data(), kHelloBytes);
      p.hb = decode_hello(p.hello);
      pending_hello(p);
      if (p.dead || p.parked) return;
    } else {
      auto want = handshake_mac(secret_, kConnectorLabel, p.hello, p.nonce.data());
      std::array<uint8_t, kMacBytes> got;
      std::memcpy(got.data(), p.rx.ctrl.data(), kMacBytes);
      if (!mac_equal(want, got)) return pending_reject(p, "wrong proof of the job secret");
      admit(p);
      return;
    }
  }
}

// Validates a hello and answers with a challenge (or parks it until its peer is added).
void Engine::pending_hello(Pending& p) {
  const HelloBody& h = p.hb;
  if (h.job_id != job_id_) return pending_reject(p, "hello from another job (job id mismatch)");
  if (static_cast<int>(h.to_rank) != rank_)
    return pending_reject(p, "hello meant for rank " + std::to_string(h.to_rank));
  if (static_cast<int>(h.from_rank) >= world_ || static_cast<int>(h.from_rank) <= rank_)
    return pending_reject(p, "hello from invalid rank " + std::to_string(h.from_rank));
  auto it = channels_.find(static_cast<int>(h.from_rank));
  if (it == channels_.end()) {
    p.parked = true;   // bootstrap race: the peer dialled before add_peer() ran here
    epoll_mod(p.conn->fd(), &p.poll, 0);
    return;
  }
  Channel& ch = *it->second;
  if (ch.dead) return pending_reject(p, "channel to rank " + std::to_string(ch.peer) + " is closed");
  if (h.rail >= ch.rails.size()) return pending_reject(p, "hello names rail " + std::to_string(h.rail) + " that does not exist");
  Rail& r = *ch.rails[h.rail];
  if (r.local_nic != p.nic) return pending_reject(p, "rail " + std::to_string(h.rail) + " arrived on the wrong NIC");
  if (r.fault == Fault::kClose || r.fault == Fault::kStall)
    return pending_reject(p, "rail " + std::to_string(h.rail) + " is held down by an injected fault");
  epoll_mod(p.conn->fd(), &p.poll, EPOLLIN);
  random_bytes(p.nonce.data(), kNonceBytes);
  auto mac = handshake_mac(secret_, kAcceptorLabel, p.hello, p.nonce.data());
  std::vector<uint8_t> body(p.nonce.begin(), p.nonce.end());
  body.insert(body.end(), mac.begin(), mac.end());
  TxFrame f;
  encode_frame(&f, FrameType::kChallenge, std::move(body), 0);
  iovec iov[2] = {{f.hdr, kHeaderBytes}, {f.owned.data(), f.owned.size()}};
  IoResult res = p.conn->writev(iov, 2);
  // A fresh socket has room for 128 bytes; anything else means it is already broken.
  if (res.kind != IoResult::kOk || res.bytes != f.total()) return pending_reject(p, "could not send the challenge");
  p.stage = 1;
}

void Engine::admit(Pending& p) {
  Channel& ch = *channels_.at(static_cast<int>(p.hb.from_rank));
  Rail& r = *ch.rails[p.hb.rail];
  TxFrame f;
  encode_frame(&f, FrameType::kWelcome, {}, 0);
  iovec iov[1] = {{f.hdr, kHeaderBytes}};
  IoResult res = p.conn->writev(iov, 1);
  if (res.kind != IoResult::kOk || res.bytes != kHeaderBytes) return pending_reject(p, "could not send welcome");
  if (r.state != RailState::kDown) fail_rail(ch, r, "replaced by a new connection from the peer", false);
  r.conn = std::move(p.conn);
  r.epoch = p.hb.epoch;
  r.events = EPOLLIN;
  epoll_mod(r.conn->fd(), &r.poll, EPOLLIN);
  p.dead = true;
  rail_up(ch, r);
}

// ---------------------------------------------------------------- connector side

void Engine::start_connect(Channel& ch, Rail& r) {
  int64_t now = now_ns();
  r.attempt_deadline_ns = now + cfg_.connect_timeout_ms * kMs;
  r.epoch++;
  try {
    r.conn = tp_->connect(nics_[r.local_nic], ch.remote[r.remote_nic], sockopt_);
  } catch (const Error& e) {
    r.conn.reset();
    attempt_failed(ch, r, e.what(), false);
    return;
  }
  r.state = RailState::kConnecting;
  r.events = EPOLLOUT | EPOLLIN;
  epoll_add(r.conn->fd(), &r.poll, r.events);
}

void Engine::attempt_failed(Channel& ch, Rail& r, const std::string& why, bool refused) {
  if (r.conn) {
    epoll_del(r.conn->fd());
    r.conn.reset();
  }
  r.rx.reset();
  r.state = RailState::kDown;
  r.refused = refused;
  r.last_error = why;
  r.next_attempt_ns = now_ns() + cfg_.reprobe_ms * kMs;
  R2_INFO("%s: connection attempt failed: %s", rail_name(ch, r).c_str(), why.c_str());
}

void Engine::rail_up(Channel& ch, Rail& r) {
  int64_t now = now_ns();
  if (r.ever_up) {
    r.recoveries++;
    R2_WARN("%s recovered (failback)", rail_name(ch, r).c_str());
  } else {
    R2_INFO("%s up", rail_name(ch, r).c_str());
  }
  r.state = RailState::kUp;
  r.ever_up = true;
  r.closed_by_peer = false;
  r.refused = false;
  r.last_rx_ns = r.last_tx_ns = r.last_ack_ns = r.progress_ns = r.changed_ns = now;
  r.changed_unix_s = unix_time_s();
  r.vtime = ch.vclock;
  r.cur = TxFrame();
  r.ctrl.clear();
  r.rx.reset();
  r.inflight = 0;
  ch.all_down_since = 0;
  set_interest(r);
  pump(ch);
}

void Engine::fail_rail(Channel& ch, Rail& r, const std::string& why, bool by_peer) {
  if (r.state == RailState::kDown) return;
  // A frame that breaks the protocol would be re-sent on the next rail and break it too:
  // after a few, the peer is not to be trusted and the channel ends with a clear error.
  if (why.rfind("protocol error", 0) == 0 || why.find("CRC32C") != std::string::npos) {
    if (++ch.protocol_errors >= 8) {
      kill_channel(ch, Cause::kProtocol, "rank " + std::to_string(ch.peer) + " keeps violating the wire protocol (" +
                                             std::to_string(ch.protocol_errors) + " times); last: " + why);
      return;
    }
  }
  if (r.state != RailState::kUp) {
    attempt_failed(ch, r, why, false);   // only ECONNREFUSED counts as a refusal
    return;
  }
  int64_t now = now_ns();
  R2_LOG(ch.bye_received ? LogLevel::kInfo : LogLevel::kWarn,
         "%s failed: %s; %zu unacknowledged chunk(s) move to other rails", rail_name(ch, r).c_str(),
          why.c_str(), static_cast<size_t>(std::count_if(ch.window.begin(), ch.window.end(), [&](auto& kv) {
            return kv.second.rail == r.index;
          })));
  if (r.conn) {
    epoll_del(r.conn->fd());
    r.conn->shutdown();
    r.conn.reset();
  }
  r.state = RailState::kDown;
  r.failures++;
  r.closed_by_peer = by_peer;
  r.last_error = why;
  r.changed_ns = now;
  r.changed_unix_s = unix_time_s();
  r.next_attempt_ns = now + cfg_.reprobe_ms * kMs;
  // Acks this rail still owed the peer go out on another rail.
  auto salvage_acks = [&](const TxFrame& f) {
    if (!f.is_ack) return;
    for (size_t i = 0; i + kAckRangeBytes <= f.owned.size(); i += kAckRangeBytes)
      ch.orphan_acks.push_back({load_le64(f.owned.data() + i), load_le64(f.owned.data() + i + 8)});
  };
  if (r.cur.active) salvage_acks(r.cur);
  for (auto& f : r.ctrl) salvage_acks(f);
  ch.orphan_acks.insert(ch.orphan_acks.end(), r.acks.begin(), r.acks.end());
  r.acks.clear();
  r.cur = TxFrame();
  r.ctrl.clear();
  r.rx.reset();
  r.inflight = 0;
  // Lossless: every chunk this rail had not had acknowledged is sent again elsewhere.
  std::vector<Chunk> moved;
  for (auto it = ch.window.begin(); it != ch.window.end();) {
    if (it->second.rail == r.index) {
      moved.push_back(std::move(it->second));
      it = ch.window.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = moved.rbegin(); it != moved.rend(); ++it) {
    it->resend = true;
    it->rail = -1;
    ch.retx.push_front(std::move(*it));
  }
  if (ch.rails_up() == 0 && ch.all_down_since == 0) ch.all_down_since = now;
  pump(ch);
  // Orphaned acks may have found a rail in pump(); flush them on any live rail.
  for (auto& o : ch.rails)
    if (o->state == RailState::kUp && !ch.orphan_acks.empty()) {
      flush_acks(ch, *o);
      break;
    }
}

// ---------------------------------------------------------------- rail I/O

void Engine::queue_ctrl(Rail& r, FrameType t, std::vector<uint8_t> payload, uint64_t seq) {
  TxFrame f;
  encode_frame(&f, t, std::move(payload), seq);
  if (!r.cur.active)
    r.cur = std::move(f);
  else
    r.ctrl.push_back(std::move(f));
}

bool Engine::rail_flush(Channel& ch, Rail& r) {
  while (r.cur.active) {
    if (r.fault == Fault::kStall || !r.conn) return true;
    size_t left = r.cur.total() - r.cur.done;
    if (r.fault == Fault::kRate) {
      int64_t now = now_ns();
      r.tokens = std::min(r.tokens + (now - r.tokens_ns) * 1e-9 * r.rate_bps, std::max(65536.0, r.rate_bps / 100));
      r.tokens_ns = now;
      // Write in batches of at least 16 KiB (or the rest of the frame): trickling a few
      // bytes per syscall as tokens accrue would spin the engine and starve other rails.
      double need = static_cast<double>(std::min<size_t>(left, 16384));
      if (r.tokens < need) {
        r.next_tx_ns = now + std::max<int64_t>(kMs / 2, static_cast<int64_t>(1e9 * (need - r.tokens) / r.rate_bps));
        set_interest(r);
        return true;
      }
      left = std::min(left, static_cast<size_t>(r.tokens));
    }
    iovec iov[2];
    int n = 0;
    size_t done = r.cur.done;
    if (done < kHeaderBytes) {
      iov[n++] = {r.cur.hdr + done, std::min(kHeaderBytes - done, left)};
      size_t rest = left - iov[0].iov_len;
      if (rest > 0) iov[n++] = {const_cast<uint8_t*>(r.cur.payload), rest};
    } else {
      iov[n++] = {const_cast<uint8_t*>(r.cur.payload) + (done - kHeaderBytes), left};
    }
    IoResult res = r.conn->writev(iov, n);
    if (res.kind == IoResult::kWouldBlock) {
      set_interest(r);
      return true;
    }
    if (res.kind != IoResult::kOk) {
      bool by_peer = res.err == EPIPE || res.err == ECONNRESET;
      fail_rail(ch, r, std::string("send failed: ") + std::strerror(res.err), by_peer);
      return false;
    }
    r.cur.done += res.bytes;
    if (r.fault == Fault::kRate) r.tokens -= static_cast<double>(res.bytes);
    r.last_tx_ns = now_ns();
    if (r.cur.done == r.cur.total()) {
      if (r.cur.is_data) {
        r.tx_bytes += r.cur.payload_len;
        r.tx_chunks++;
      }
      r.cur = TxFrame();
      if (!r.ctrl.empty()) {
        r.cur = std::move(r.ctrl.front());
        r.ctrl.pop_front();
      }
    }
  }
  set_interest(r);
  return true;
}

void Engine::rail_writable(Channel& ch, Rail& r) {
  if (r.state == RailState::kConnecting) {
    IoResult res = r.conn->finish_connect();
    if (res.kind == IoResult::kWouldBlock) return;
    if (res.kind != IoResult::kOk) {
      attempt_failed(ch, r, std::string("connect: ") + std::strerror(res.err), res.err == ECONNREFUSED);
      return;
    }
    HelloBody h;
    h.job_id = job_id_;
    h.from_rank = static_cast<uint32_t>(rank_);
    h.to_rank = static_cast<uint32_t>(ch.peer);
    h.rail = static_cast<uint32_t>(r.index);
    h.epoch = r.epoch;
    random_bytes(h.nonce.data(), kNonceBytes);
    encode_hello(h, r.hello);
    r.cur = TxFrame();
    r.ctrl.clear();
    queue_ctrl(r, FrameType::kHello, std::vector<uint8_t>(r.hello, r.hello + kHelloBytes));
    r.state = RailState::kHandshake;
    rail_flush(ch, r);
    return;
  }
  if (!rail_flush(ch, r)) return;
  if (r.state == RailState::kUp && !r.cur.active) pump(ch);
}

void Engine::rail_readable(Channel& ch, Rail& r) {
  if (r.fault == Fault::kStall) return;
  const int my_fd = r.conn->fd();
  // Bounded so one busy rail cannot starve its siblings' writers.
  for (int budget = 0; budget < 64; budget++) {
    if (!r.conn || r.conn->fd() != my_fd) return;
    RxFrame& rx = r.rx;
    if (!rx.in_payload) {
      IoResult res = read_header(*r.conn, rx);
      if (res.kind == IoResult::kWouldBlock) break;
      if (res.kind != IoResult::kOk) {
        bool eof = res.kind == IoResult::kEof;
        fail_rail(ch, r, eof ? "connection closed by the peer" : std::string("receive failed: ") + std::strerror(res.err),
                  eof || res.err == ECONNRESET);
        return;
      }
      r.last_rx_ns = now_ns();
      std::string bad = decode_header(rx.hdr, limits_, &rx.h);
      if (!bad.empty()) {
        fail_rail(ch, r, "protocol error: " + bad, false);
        return;
      }
      rx.in_payload = true;
      rx.got = 0;
      if (rx.h.type == FrameType::kData) {
        if (r.state != RailState::kUp) {
          fail_rail(ch, r, "protocol error: data before the handshake finished", false);
          return;
        }
        rail_data_header(ch, r);
        if (!r.conn) return;
      } else {
        rx.ctrl.resize(rx.h.payload_len);
        rx.dest = rx.ctrl.data();
      }
    }
    // payload
    while (rx.got < rx.h.payload_len) {
      size_t want = rx.h.payload_len - rx.got;
      uint8_t* dst = rx.scratch ? scratch_.data() : rx.dest + rx.got;
      if (rx.scratch) want = std::min(want, scratch_.size());
      IoResult res = r.conn->read(dst, want);
      if (res.kind == IoResult::kWouldBlock) goto out;
      if (res.kind != IoResult::kOk) {
        bool eof = res.kind == IoResult::kEof;
        fail_rail(ch, r, eof ? "connection closed by the peer" : std::string("receive failed: ") + std::strerror(res.err),
                  eof || res.err == ECONNRESET);
        return;
      }
      rx.got += res.bytes;
      r.last_rx_ns = now_ns();
    }
    if (rx.h.type == FrameType::kData)
      rail_data_done(ch, r);
    else
      rail_control(ch, r);
    if (!r.conn || r.conn->fd() != my_fd) return;
    r.rx.reset();
  }
out:
  if (r.state == RailState::kUp) flush_acks(ch, r);
}

void Engine::rail_control(Channel& ch, Rail& r) {
  const FrameHeader& h = r.rx.h;
  const std::vector<uint8_t>& body = r.rx.ctrl;
  if (r.state == RailState::kHandshake) {
    if (h.type == FrameType::kChallenge) {
      std::array<uint8_t, kMacBytes> got;
      std::memcpy(got.data(), body.data() + kNonceBytes, kMacBytes);
      auto want = handshake_mac(secret_, kAcceptorLabel, r.hello, body.data());
      if (!mac_equal(want, got)) {
        R2_WARN("%s: the listener failed to prove the job secret; dropping it", rail_name(ch, r).c_str());
        attempt_failed(ch, r, "listener failed to prove the job secret", false);
        return;
      }
      auto mac = handshake_mac(secret_, kConnectorLabel, r.hello, body.data());
      queue_ctrl(r, FrameType::kAuth, std::vector<uint8_t>(mac.begin(), mac.end()));
      rail_flush(ch, r);
      return;
    }
    if (h.type == FrameType::kWelcome) {
      r.rx.reset();
      rail_up(ch, r);
      return;
    }
    attempt_failed(ch, r, "unexpected frame during the handshake", false);
    return;
  }
  switch (h.type) {
    case FrameType::kAck: {
      r.last_ack_ns = now_ns();
      for (size_t i = 0; i < h.seq; i++) {
        uint64_t a = load_le64(body.data() + i * kAckRangeBytes);
        uint64_t b = load_le64(body.data() + i * kAckRangeBytes + 8);
        if (a >= b || b > ch.next_seq) {
          fail_rail(ch, r, "protocol error: ack range outside what was sent", false);
          return;
        }
        on_ack(ch, r, a, b);
      }
      pump(ch);
      return;
    }
    case FrameType::kHeartbeat: {
      std::vector<uint8_t> echo(kHeartbeatBytes);
      store_le64(echo.data(), static_cast<uint64_t>(now_ns()));
      std::memcpy(echo.data() + 8, body.data(), 8);
      queue_ctrl(r, FrameType::kHeartbeatAck, std::move(echo));
      rail_flush(ch, r);
      return;
    }
    case FrameType::kHeartbeatAck:
      return;   // liveness is last_rx_ns; the RTT sample is for the health monitor (next issue)
    case FrameType::kBye:
      R2_INFO("rank %d said goodbye on %s", ch.peer, rail_name(ch, r).c_str());
      ch.bye_received = true;
      return;
    default:
      fail_rail(ch, r, "protocol error: handshake frame on an established rail", false);
      return;
  }
}

// Decides where a data chunk's payload goes: the receive's buffer, staging, or nowhere.
void Engine::rail_data_header(Channel& ch, Rail& r) {
  RxFrame& rx = r.rx;
  const FrameHeader& h = rx.h;
  rx.scratch = true;
  if (ch.seq_applied(h.seq) || h.payload_len == 0) return;
  auto it = ch.inmsgs.find(h.msg_id);
  if (it == ch.inmsgs.end()) {
    InMsg m;
    m.tag = h.tag;
    m.tag_seq = h.tag_seq;
    m.len = h.msg_len;
    auto key = std::make_pair(h.tag, h.tag_seq);
    auto p = ch.posted.find(key);
    if (p != ch.posted.end()) {
      auto req = p->second;
      ch.posted.erase(p);
      if (req->len != h.msg_len) {
        req->finish_error(Cause::kMismatch,
                          "rank " + std::to_string(ch.peer) + " sent " + std::to_string(h.msg_len) +
                              " bytes with tag " + std::to_string(h.tag) + " but this receive expects " +
                              std::to_string(req->len));
        m.discard = true;
      } else {
        m.req = req;
      }
    } else {
      try {
        m.staging.resize(h.msg_len);
      } catch (const std::bad_alloc&) {
        kill_channel(ch, Cause::kSystem, "out of memory staging a " + std::to_string(h.msg_len) +
                                             "-byte message from rank " + std::to_string(ch.peer));
        return;
      }
      ch.unexpected[key] = h.msg_id;
    }
    it = ch.inmsgs.emplace(h.msg_id, std::move(m)).first;
  } else if (it->second.tag != h.tag || it->second.tag_seq != h.tag_seq || it->second.len != h.msg_len) {
    fail_rail(ch, r, "protocol error: chunk disagrees with its message", false);
    return;
  }
  InMsg& m = it->second;
  if (m.discard || m.aborted) return;
  rx.scratch = false;
  // A message that began unexpected keeps landing in staging until whole (chunks already
  // there are copied once at completion); one whose receive came first lands in place.
  rx.dest = (m.staging.empty() ? m.req->buf : m.staging.data()) + h.offset;
}

void Engine::rail_data_done(Channel& ch, Rail& r) {
  RxFrame& rx = r.rx;
  const FrameHeader& h = rx.h;
  bool was_applied = ch.seq_applied(h.seq);
  if (!was_applied && !rx.scratch && (h.flags & kFlagPayloadCrc) &&
      crc32c(rx.dest, h.payload_len) != h.payload_crc) {
    fail_rail(ch, r, "payload CRC32C mismatch", false);
    return;
  }
  if (cfg_.crc && !(h.flags & kFlagPayloadCrc) && h.payload_len > 0) {
    fail_rail(ch, r, "protocol error: R2CCL_CRC is on here but the peer sent no checksum", false);
    return;
  }
  if (!r.acks.empty() && r.acks.back().second == h.seq)
    r.acks.back().second++;
  else
    r.acks.push_back({h.seq, h.seq + 1});
  if (was_applied) return;
  ch.mark_applied(h.seq);
  r.rx_bytes += h.payload_len;
  r.rx_chunks++;
  auto it = ch.inmsgs.find(h.msg_id);
  if (it == ch.inmsgs.end()) {
    // The first chunk seen of this message is empty: a zero-length or abandoned message.
    InMsg m;
    m.tag = h.tag;
    m.tag_seq = h.tag_seq;
    m.len = h.msg_len;
    m.aborted = (h.flags & kFlagAbort) != 0;
    auto key = std::make_pair(h.tag, h.tag_seq);
    auto p = ch.posted.find(key);
    if (p != ch.posted.end()) {
      m.req = p->second;
      ch.posted.erase(p);
    } else {
      ch.unexpected[key] = h.msg_id;
    }
    it = ch.inmsgs.emplace(h.msg_id, std::move(m)).first;
  } else if (h.flags & kFlagAbort) {
    it->second.aborted = true;
  }
  InMsg& m = it->second;
  m.received += h.payload_len;
  if (m.aborted && m.req) {
    if (m.req->len != m.len) {
      m.req->finish_error(Cause::kMismatch, "rank " + std::to_string(ch.peer) + " sent " + std::to_string(m.len) +
                                                " bytes but this receive expects " + std::to_string(m.req->len));
    } else {
      m.req->finish_error(Cause::kTimeout, "rank " + std::to_string(ch.peer) +
                                               " abandoned this message (its send was cancelled or timed out)");
    }
    m.req.reset();
    m.discard = true;
    redirect_to_scratch(ch, h.msg_id);
    return;
  }
  if (!m.aborted && m.received == m.len) finish_inmsg(ch, h.msg_id);
}

void Engine::finish_inmsg(Channel& ch, uint64_t msg_id) {
  auto it = ch.inmsgs.find(msg_id);
  InMsg& m = it->second;
  m.complete = true;
  if (m.discard) {
    ch.inmsgs.erase(it);
    return;
  }
  if (!m.req) return;   // unexpected: waits for its receive
  if (!m.staging.empty() && m.req->len) std::memcpy(m.req->buf, m.staging.data(), m.len);
  if (m.req->len != m.len) {
    m.req->finish_error(Cause::kMismatch, "rank " + std::to_string(ch.peer) + " sent " + std::to_string(m.len) +
                                              " bytes but this receive expects " + std::to_string(m.req->len));
  } else {
    m.req->finish_ok();
  }
  redirect_to_scratch(ch, msg_id);
  ch.inmsgs.erase(it);
}

// A message is finished or abandoned: copies still arriving on other rails must not touch
// its buffer any more (the caller may already be reusing it).
void Engine::redirect_to_scratch(Channel& ch, uint64_t msg_id) {
  for (auto& o : ch.rails)
    if (o->rx.in_payload && o->rx.h.type == FrameType::kData && o->rx.h.msg_id == msg_id) o->rx.scratch = true;
}

void Engine::flush_acks(Channel& ch, Rail& r) {
  auto& src = !ch.orphan_acks.empty() && r.acks.empty() ? ch.orphan_acks : r.acks;
  if (!ch.orphan_acks.empty() && &src == &r.acks) {
    r.acks.insert(r.acks.end(), ch.orphan_acks.begin(), ch.orphan_acks.end());
    ch.orphan_acks.clear();
  }
  while (!src.empty()) {
    size_t n = std::min(src.size(), kMaxAckRanges);
    std::vector<uint8_t> body(n * kAckRangeBytes);
    for (size_t i = 0; i < n; i++) {
      store_le64(body.data() + i * kAckRangeBytes, src[i].first);
      store_le64(body.data() + i * kAckRangeBytes + 8, src[i].second);
    }
    src.erase(src.begin(), src.begin() + static_cast<long>(n));
    queue_ctrl(r, FrameType::kAck, std::move(body), n);
  }
  rail_flush(ch, r);
}

// ---------------------------------------------------------------- dealing and acks

bool Engine::next_chunk(Channel& ch, Chunk* c) {
  while (!ch.retx.empty()) {
    *c = std::move(ch.retx.front());
    ch.retx.pop_front();
    if (c->req->finished() && !c->void_) continue;   // cancelled meanwhile
    return true;
  }
  while (!ch.sendq.empty()) {
    auto& req = ch.sendq.front();
    if (req->cancelled) {
      ch.sendq.pop_front();
      continue;
    }
    uint64_t len = std::min<uint64_t>(cfg_.chunk_bytes, req->len - req->next_offset);
    c->seq = ch.next_seq++;
    c->req = req;
    c->offset = req->next_offset;
    c->len = static_cast<uint32_t>(len);
    c->resend = false;
    c->void_ = false;
    req->next_offset += len;
    req->chunks_cut++;
    if (req->next_offset == req->len) {
      req->fully_cut = true;
      ch.sendq.pop_front();
    }
    return true;
  }
  return false;
}

void Engine::pump(Channel& ch) {
  if (ch.dead) return;
  // Weighted fair dealing: among rails free to take a chunk, the one furthest behind its
  // share (bytes / weight) gets it. Each rail's window is its weight's share of
  // R2CCL_RAIL_WINDOW_BYTES, so when every rail is window-bound (the sender outruns the
  // network or the receiver) the split follows the weights; a rail that cannot keep up
  // with its share is skipped rather than waited for, so it never sets the pace.
  double max_weight = 0;
  for (auto& rp : ch.rails)
    if (rp->state == RailState::kUp) max_weight = std::max(max_weight, rp->weight);
  for (;;) {
    Rail* best = nullptr;
    double best_vt = 0;
    int64_t now = now_ns();
    for (auto& rp : ch.rails) {
      Rail& r = *rp;
      if (r.state != RailState::kUp || r.fault == Fault::kStall || r.cur.active || !r.ctrl.empty()) continue;
      if (r.weight <= 0) continue;
      uint64_t window = std::max<uint64_t>(
          cfg_.chunk_bytes, static_cast<uint64_t>(static_cast<double>(cfg_.rail_window_bytes) * r.weight / max_weight));
      if (r.inflight > 0 && r.inflight + cfg_.chunk_bytes > window) continue;
      if (r.next_tx_ns > now) continue;
      // A rail that was busy keeps up to one window of credit, so it catches up when free.
      double vt = std::max(r.vtime, ch.vclock - static_cast<double>(cfg_.rail_window_bytes));
      if (!best || vt < best_vt) {
        best = &r;
        best_vt = vt;
      }
    }
    if (!best) return;
    Chunk c;
    if (!next_chunk(ch, &c)) return;
    Rail& r = *best;
    if (c.void_) {
      c.len = 0;
      c.offset = 0;
    }
    ch.vclock = std::max(ch.vclock, best_vt);
    r.vtime = best_vt + static_cast<double>(std::max<uint32_t>(c.len, 1)) / r.weight;
    if (r.inflight == 0) r.progress_ns = now;
    r.inflight += c.len;
    if (c.resend) r.retransmitted++;
    c.rail = r.index;
    FrameHeader h;
    h.type = FrameType::kData;
    h.payload_len = c.len;
    h.seq = c.seq;
    h.msg_id = c.req->msg_id;
    h.tag = c.req->tag;
    h.offset = c.offset;
    h.msg_len = c.req->len;
    h.tag_seq = c.req->tag_seq;
    const uint8_t* payload = c.req->buf + c.offset;
    if (c.void_) h.flags |= kFlagAbort;
    if (cfg_.crc && c.len > 0) {
      h.flags |= kFlagPayloadCrc;
      h.payload_crc = crc32c(payload, c.len);
    }
    r.cur = TxFrame();
    encode_header(h, r.cur.hdr);
    r.cur.payload = payload;
    r.cur.payload_len = c.len;
    r.cur.active = true;
    r.cur.is_data = true;
    r.cur.seq = c.seq;
    R2_TRACE("deal seq %lu len %u to rail %d (inflight %lu)", (unsigned long)c.seq, c.len, r.index, (unsigned long)r.inflight);
    ch.window.emplace(c.seq, std::move(c));
    rail_flush(ch, r);
  }
}

void Engine::on_ack(Channel& ch, Rail& r, uint64_t first, uint64_t last) {
  int64_t now = now_ns();
  for (auto it = ch.window.lower_bound(first); it != ch.window.end() && it->first < last;) {
    Chunk& c = it->second;
    if (c.rail >= 0) {
      Rail& carrier = *ch.rails[c.rail];
      carrier.inflight -= std::min<uint64_t>(carrier.inflight, c.len);
      carrier.acked_bytes += c.len;
      carrier.progress_ns = now;
      carrier.last_ack_ns = now;
    }
    auto req = c.req;
    it = ch.window.erase(it);
    if (req->finished()) continue;
    req->chunks_acked++;
    if (req->fully_cut && req->chunks_acked == req->chunks_cut) {
      req->finish_ok();
      ch.sends.erase(std::remove(ch.sends.begin(), ch.sends.end(), req), ch.sends.end());
    }
  }
  (void)r;
}

// ---------------------------------------------------------------- requests

void Engine::submit(const std::shared_ptr<Request>& req) {
  post([this, req] {
    auto it = channels_.find(req->peer);
    if (it == channels_.end()) {
      req->finish_error(Cause::kInvalidArgument, "rank " + std::to_string(req->peer) + " is not a connected peer");
      return;
    }
    Channel& ch = *it->second;
    if (ch.dead) {
      if (req->kind == Request::kRecv &&
          ch.unexpected.count({req->tag, ch.rx_tag_seq.count(req->tag) ? ch.rx_tag_seq[req->tag] : 0u})) {
        post_recv(ch, req);   // arrived whole before the peer left
        return;
      }
      req->finish_error(ch.dead_cause, ch.dead_msg);
      return;
    }
    req->posted_ns = now_ns();
    if (req->kind == Request::kSend) {
      req->msg_id = ch.next_msg_id++;
      req->tag_seq = ch.tx_tag_seq[req->tag]++;
      ch.sendq.push_back(req);
      ch.sends.push_back(req);
      pump(ch);
    } else {
      post_recv(ch, req);
    }
  });
  if (stop_.load()) req->finish_error(Cause::kClosed, "the r2ccl endpoint is closed");
}

void Engine::post_recv(Channel& ch, const std::shared_ptr<Request>& req) {
  req->tag_seq = ch.rx_tag_seq[req->tag]++;
  auto key = std::make_pair(req->tag, req->tag_seq);
  auto u = ch.unexpected.find(key);
  if (u == ch.unexpected.end()) {
    ch.posted[key] = req;
    return;
  }
  uint64_t msg_id = u->second;
  ch.unexpected.erase(u);
  InMsg& m = ch.inmsgs.at(msg_id);
  if (m.aborted) {
    req->finish_error(Cause::kTimeout, "rank " + std::to_string(ch.peer) +
                                           " abandoned this message (its send was cancelled or timed out)");
    m.discard = true;
    return;
  }
  if (m.len != req->len) {
    req->finish_error(Cause::kMismatch, "rank " + std::to_string(ch.peer) + " sent " + std::to_string(m.len) +
                                            " bytes with tag " + std::to_string(req->tag) +
                                            " but this receive expects " + std::to_string(req->len));
    m.discard = true;
    m.staging.clear();
    m.staging.shrink_to_fit();
    if (m.complete) ch.inmsgs.erase(msg_id);
    return;
  }
  m.req = req;
  if (m.complete) finish_inmsg(ch, msg_id);
}

void Engine::cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why) {
  try {
    call([&] {
      if (req->finished()) return;
      req->cancelled = true;
      auto it = channels_.find(req->peer);
      if (it != channels_.end()) {
        Channel& ch = *it->second;
        if (req->kind == Request::kRecv) {
          for (auto p = ch.posted.begin(); p != ch.posted.end();)
            p = p->second == req ? ch.posted.erase(p) : std::next(p);
          for (auto& [id, m] : ch.inmsgs)
            if (m.req == req) {
              m.req.reset();
              m.discard = true;
              m.staging.clear();
              redirect_to_scratch(ch, id);
            }
        } else {
          // Frames being written keep their bytes (copied); unsent chunks become cancel marks
          // so the receiver learns the message is abandoned and sequence numbers stay dense.
          for (auto& r : ch.rails)
            if (r->cur.active && r->cur.is_data) {
              auto w = ch.window.find(r->cur.seq);
              if (w != ch.window.end() && w->second.req == req) {
                r->cur.owned.assign(r->cur.payload, r->cur.payload + r->cur.payload_len);
                r->cur.payload = r->cur.owned.data();
              }
            }
          auto to_void = [](Chunk& c) {
            c.void_ = true;
            c.len = 0;
            c.offset = 0;
          };
          for (auto& c : ch.retx)
            if (c.req == req) to_void(c);
          for (auto& [s, c] : ch.window)
            if (c.req == req && !(c.rail >= 0 && ch.rails[c.rail]->cur.active && ch.rails[c.rail]->cur.seq == s)) {
              // Already written: the receiver may have it; if the rail fails it is resent empty.
              c.void_ = true;
            }
          if (!req->fully_cut) {
            Chunk c;
            c.seq = ch.next_seq++;
            c.req = req;
            c.void_ = true;
            ch.retx.push_back(c);
            req->fully_cut = true;
            ch.sendq.erase(std::remove(ch.sendq.begin(), ch.sendq.end(), req), ch.sendq.end());
          }
          ch.sends.erase(std::remove(ch.sends.begin(), ch.sends.end(), req), ch.sends.end());
        }
      }
      req->finish_error(cause, why);
      if (it != channels_.end()) pump(*it->second);
    });
  } catch (const Error&) {
    // engine closed: it no longer touches any buffer
  }
}

void Engine::kill_channel(Channel& ch, Cause cause, const std::string& why) {
  if (ch.dead) return;
  ch.dead = true;
  ch.dead_cause = cause;
  ch.dead_msg = why;
  R2_LOG(cause == Cause::kClosed || ch.bye_received ? LogLevel::kInfo : LogLevel::kWarn, "channel to %s is dead: %s",
         peer_name(ch).c_str(), why.c_str());
  for (auto& r : ch.rails) {
    if (r->conn) {
      epoll_del(r->conn->fd());
      r->conn.reset();
    }
    r->state = RailState::kDown;
    r->cur = TxFrame();
    r->ctrl.clear();
    r->rx.reset();
  }
  for (auto& req : ch.sends) req->finish_error(cause, why);
  for (auto& [k, req] : ch.posted) req->finish_error(cause, why);
  for (auto& [id, m] : ch.inmsgs)
    if (m.req) m.req->finish_error(cause, why);
  ch.sends.clear();
  ch.sendq.clear();
  ch.retx.clear();
  ch.window.clear();
  ch.posted.clear();
  // Messages that arrived whole before the channel died stay deliverable to later receives.
  for (auto it = ch.inmsgs.begin(); it != ch.inmsgs.end();)
    it = it->second.complete && !it->second.aborted && !it->second.discard && !it->second.req ? std::next(it)
                                                                                             : ch.inmsgs.erase(it);
  for (auto it = ch.unexpected.begin(); it != ch.unexpected.end();)
    it = ch.inmsgs.count(it->second) ? std::next(it) : ch.unexpected.erase(it);
}

// ---------------------------------------------------------------- timers

void Engine::tick(int64_t now) {
  const int64_t stall = cfg_.stall_ms * kMs;
  const int64_t hb = cfg_.heartbeat_ms * kMs;
  for (auto& p : pendings_)
    if (!p->dead && now > p->deadline_ns && !p->parked) pending_reject(*p, "handshake not finished in time");
    else if (!p->dead && p->parked && now > p->deadline_ns + 10 * cfg_.connect_timeout_ms * kMs)
      pending_reject(*p, "hello names a rank that never joined");
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
          if (r.inflight > 0 && now - r.progress_ns > stall && sibling_alive) {
            fail_rail(ch, r,
                      "stalled: " + std::to_string(r.inflight) + " bytes unacknowledged for " +
                          std::to_string((now - r.progress_ns) / kMs) + " ms while other rails progress",
                      false);
          } else if (now - r.last_rx_ns > hb * cfg_.heartbeat_misses) {
            fail_rail(ch, r,
                      "silent for " + std::to_string((now - r.last_rx_ns) / kMs) + " ms (" +
                          std::to_string(cfg_.heartbeat_misses) + " heartbeats missed)",
                      false);
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
          if (ch.connector && r.fault != Fault::kClose && r.fault != Fault::kStall && now >= r.next_attempt_ns)
            start_connect(ch, r);
          break;
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
      s.failures = r.failures;
      s.recoveries = r.recoveries;
      s.fault = fault_name(r.fault);
      s.last_error = r.last_error;
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
      fail_rail(ch, r, "closed by injected fault", false);
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

void Endpoint::wait_ready(const std::vector<int>& peers, double timeout_s) {
  int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
  for (;;) {
    std::string missing;
    for (int p : peers)
      for (auto& s : engine_->stats(p))
        if (s.state != "up")
          missing += "\n  rank " + std::to_string(p) + " rail " + std::to_string(s.rail) + " (" + s.local_addr + " -> " +
                     s.remote_addr + "): " + s.state + (s.last_error.empty() ? "" : ", " + s.last_error);
    if (missing.empty()) return;
    if (now_ns() > deadline)
      throw Error(Cause::kTimeout, peers.size() == 1 ? peers[0] : -1,
                  "rails not up after " + std::to_string(timeout_s) + " s:" + missing);
    usleep(5000);
  }
}

std::shared_ptr<Request> Endpoint::post_send(int peer, uint64_t tag, const void* buf, uint64_t len) {
  auto req = std::make_shared<Request>(Request::kSend, peer, tag, static_cast<uint8_t*>(const_cast<void*>(buf)), len);
  engine_->submit(req);
  return req;
}

std::shared_ptr<Request> Endpoint::post_recv(int peer, uint64_t tag, void* buf, uint64_t len) {
  auto req = std::make_shared<Request>(Request::kRecv, peer, tag, static_cast<uint8_t*>(buf), len);
  engine_->submit(req);
  return req;
}

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
void Endpoint::close() { engine_->shutdown(); }

}  // namespace r2ccl
