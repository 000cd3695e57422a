// Link lifecycle: accepting and authenticating connections (acceptor side), dialling and
// re-dialling (connector side), handing an authenticated connection to its channel as an
// up rail. Failover itself is the channel's (ChannelCore::fail_rail). Engine thread only.
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

void Engine::pending_reject(Pending& p, const std::string& why, bool quiet) {
  const bool silent = quiet;
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
      // A dial that closes without a byte (a liveness probe, a port check) is not an intruder.
      const bool quiet = res.kind == IoResult::kEof && p.stage == 0 && p.rx.hdr_got == 0;
      pending_reject(p, res.kind == IoResult::kEof ? "closed before the handshake finished"
                                                   : std::string("read error: ") + std::strerror(res.err),
                     quiet);
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
  auto it = peers_.find(static_cast<int>(h.from_rank));
  if (it == peers_.end()) {
    p.parked = true;   // bootstrap race: the peer dialled before add_peer() ran here
    epoll_mod(p.conn->fd(), &p.poll, 0);
    return;
  }
  Peer& pr = *it->second;
  if (pr.ch().dead) return pending_reject(p, "channel to rank " + std::to_string(pr.rank) + " is closed");
  if (h.rail >= pr.links.size()) return pending_reject(p, "hello names rail " + std::to_string(h.rail) + " that does not exist");
  const Link& l = *pr.links[h.rail];
  if (pr.rail(static_cast<int>(h.rail)).local_nic != p.nic)
    return pending_reject(p, "rail " + std::to_string(h.rail) + " arrived on the wrong NIC");
  if (l.fault == Fault::kClose || l.fault == Fault::kStall)
    return pending_reject(p, "rail " + std::to_string(h.rail) + " is held down by an injected fault", true);
  epoll_mod(p.conn->fd(), &p.poll, EPOLLIN);
  random_bytes(p.nonce.data(), kNonceBytes);
  auto mac = handshake_mac(secret_, kAcceptorLabel, p.hello, p.nonce.data());
  std::vector<uint8_t> body(p.nonce.begin(), p.nonce.end());
  body.insert(body.end(), mac.begin(), mac.end());
  TxFrame f;
  encode_control(&f, FrameType::kChallenge, std::move(body));
  iovec iov[2] = {{f.hdr, kHeaderBytes}, {f.owned.data(), f.owned.size()}};
  IoResult res = p.conn->writev(iov, 2);
  // A fresh socket has room for 128 bytes; anything else means it is already broken.
  if (res.kind != IoResult::kOk || res.bytes != f.total()) return pending_reject(p, "could not send the challenge");
  p.stage = 1;
}

void Engine::admit(Pending& p) {
  Peer& pr = *peers_.at(static_cast<int>(p.hb.from_rank));
  const int idx = static_cast<int>(p.hb.rail);
  Link& l = *pr.links[static_cast<size_t>(idx)];
  const Rail& r = pr.rail(idx);
  if (nic_down_[static_cast<size_t>(r.local_nic)])
    return pending_reject(p, "rail " + std::to_string(idx) + " runs over NIC " + nics_[r.local_nic].name +
                                 ", which is held down: " + nic_down_why_[static_cast<size_t>(r.local_nic)]);
  TxFrame f;
  encode_control(&f, FrameType::kWelcome, {});
  iovec iov[1] = {{f.hdr, kHeaderBytes}};
  IoResult res = p.conn->writev(iov, 1);
  if (res.kind != IoResult::kOk || res.bytes != kHeaderBytes) return pending_reject(p, "could not send welcome");
  if (r.state != RailState::kDown)
    pr.core->fail_rail(idx, FailReason::kReplaced, "replaced by a new connection from the peer", now_ns());
  if (l.conn) drop_link(pr, l, false);
  l.conn = std::move(p.conn);
  l.epoch = p.hb.epoch;
  l.events = EPOLLIN;
  epoll_mod(l.conn->fd(), &l.poll, EPOLLIN);
  p.dead = true;
  link_up(pr, l);
}

// ---------------------------------------------------------------- connector side

void Engine::start_connect(Peer& pr, Link& l) {
  int64_t now = now_ns();
  const Rail& r = pr.rail(l.index);
  // A re-dial of a rail that was up before gets a short deadline: an attempt started while
  // the link was still down must not hold the rail out long after the link heals.
  int64_t deadline_ms = r.ever_up ? std::min<int64_t>(cfg_.connect_timeout_ms, std::max(250, 2 * cfg_.reprobe_ms))
                                  : cfg_.connect_timeout_ms;
  l.attempt_deadline_ns = now + deadline_ms * kMs;
  l.epoch++;
  try {
    l.conn = tp_->connect(nics_[r.local_nic], pr.remote[r.remote_nic], sockopt_);
  } catch (const Error& e) {
    l.conn.reset();
    attempt_failed(pr, l, e.what(), false);
    return;
  }
  // A connect that failed at once (the NIC's route is gone: ENETUNREACH, EINVAL) is reported
  // now with its cause; waiting for readiness would only time out.
  IoResult early = l.conn->finish_connect();
  if (early.kind == IoResult::kError) {
    const int err = early.err;
    l.conn.reset();
    attempt_failed(pr, l, std::string("connect: ") + std::strerror(err), err == ECONNREFUSED);
    return;
  }
  pr.core->link_state(l.index, RailState::kConnecting);
  l.events = EPOLLOUT | EPOLLIN;
  epoll_add(l.conn->fd(), &l.poll, l.events);
}

void Engine::attempt_failed(Peer& pr, Link& l, const std::string& why, bool refused) {
  if (l.conn) {
    epoll_del(l.conn->fd());
    l.conn.reset();
  }
  l.events = 0;
  pr.core->link_state(l.index, RailState::kDown, why);
  l.refused = refused;
  l.next_attempt_ns = now_ns() + cfg_.reprobe_ms * kMs;
  R2_INFO("%s: connection attempt failed: %s", pr.core->rail_name(l.index).c_str(), why.c_str());
}

void Engine::link_up(Peer& pr, Link& l) {
  l.refused = false;
  pr.core->rail_up(l.index, now_ns());
  set_interest(l);
}

}  // namespace r2ccl
