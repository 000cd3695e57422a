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
  for (int n = 0; n < kAcceptBatch; n++) {
    auto c = listeners_[nic]->accept();
    if (!c) return;
    size_t live = 0;
    for (auto& p : pendings_) live += !p->dead;
    if (live >= kMaxPendings && !evict_idle_pending()) {
      stranger_log(LogLevel::kWarn, "dropped connection " + c->describe() + " on NIC " + nics_[nic].name + ": " +
                                        std::to_string(live) + " handshakes already pending");
      continue;
    }
    auto p = std::make_unique<Pending>();
    p->link = std::move(c);
    p->nic = nic;
    p->hs = AcceptorHandshake(identity_.get());
    p->poll.obj = p.get();
    p->deadline_ns = now_ns() + cfg_.connect_timeout_ms * kMs;
    p->desc = p->link->describe();
    epoll_add(p->link->wait_fd(), &p->poll, EPOLLIN);
    pendings_.push_back(std::move(p));
  }
}

void Engine::pending_reject(Pending& p, const std::string& why, bool quiet) {
  stranger_log(quiet ? LogLevel::kInfo : LogLevel::kWarn,
               "rejected connection " + p.desc + " on NIC " + nics_[p.nic].name + ": " + why);
  epoll_del(p.link->wait_fd());
  p.link.reset();
  p.dead = true;
}

bool Engine::evict_idle_pending() {
  for (auto& p : pendings_)   // oldest first
    if (!p->dead && !p->parked && p->hs.awaits_hello()) {
      pending_reject(*p, "no hello yet while " + std::to_string(kMaxPendings) +
                             " handshakes are pending: dropped for a newer connection");
      return true;
    }
  return false;
}

void Engine::stranger_log(LogLevel level, const std::string& line) {
  if (!log_enabled(level)) return;
  stranger_log_window(now_ns());
  if (stranger_shown_ < kStrangerLogLines) {
    stranger_shown_++;
    log_write(level, "%s", line.c_str());
  } else {
    stranger_hidden_++;
  }
}

void Engine::stranger_log_window(int64_t now) {
  if (now - stranger_window_ns_ < kStrangerLogWindowNs) return;
  if (stranger_hidden_)
    R2_WARN("%llu more connections were rejected or dropped in the last %lld s (the first %d were logged)",
            static_cast<unsigned long long>(stranger_hidden_),
            static_cast<long long>((now - stranger_window_ns_) / 1000000000), kStrangerLogLines);
  stranger_window_ns_ = now;
  stranger_shown_ = 0;
  stranger_hidden_ = 0;
}

void Engine::pending_read(Pending& p) {
  for (;;) {
    if (p.parked) return;   // stays queued in the kernel until the peer is known
    if (!p.rx.in_payload) {
      LinkCompletion c = p.link->poll_recv();
      if (c.moved) p.rx.hdr_got += c.moved;
      if (c.kind == LinkCompletion::kNone) return;
      if (c.kind != LinkCompletion::kHeader) {
        // A dial that closes without a byte (a liveness probe, a port check) is not an intruder,
        // nor is a dialler that gave up after a valid hello (its connection was closed).
        const LinkFailure& f = p.link->failure();
        const bool eof = f.error == LinkError::kClosedByPeer && f.sys_error == 0;
        const bool quiet = (eof && p.hs.awaits_hello() && p.rx.hdr_got == 0) ||
                           (f.error == LinkError::kClosedByPeer && !p.hs.awaits_hello());
        pending_reject(p, eof ? "closed before the handshake finished" : "read error: " + f.detail, quiet);
        return;
      }
      std::memcpy(p.rx.hdr, c.header, kHeaderBytes);
      std::string bad = decode_header(p.rx.hdr, limits_, &p.rx.h);
      if (!bad.empty()) return pending_reject(p, "invalid frame: " + bad);
      bad = p.hs.on_header(p.rx.h);
      if (!bad.empty()) return pending_reject(p, bad);
      // (decode_header has checked a handshake frame's length: a hello is kHelloBytes.)
      p.rx.ctrl.resize(p.rx.h.payload_len);
      p.link->accept_header(p.rx.ctrl.size());
      p.link->post_recv(p.rx.ctrl.data(), p.rx.ctrl.size(), nullptr);
      p.rx.in_payload = true;
    }
    LinkCompletion c = p.link->poll_recv();
    if (c.kind == LinkCompletion::kNone) return;
    if (c.kind != LinkCompletion::kPayload) return pending_reject(p, "closed during the handshake");
    p.rx.reset();
    p.rx.hdr_got = 0;
    if (p.hs.awaits_hello()) {
      std::string bad = p.hs.on_hello(p.rx.ctrl.data());
      if (!bad.empty()) return pending_reject(p, bad);
      pending_hello(p);
      if (p.dead || p.parked) return;
    } else {
      if (!p.hs.on_auth(p.rx.ctrl.data())) return pending_reject(p, "wrong proof of the job secret");
      admit(p);
      return;
    }
  }
}

// A valid hello (AcceptorHandshake::on_hello) against the peers this engine has: answered
// with a challenge, or parked until its peer is added. A hello the identity names no peer for
// yet (peer() < 0, the NCCL plugin's accepting side) is answered too: its peer is made only
// once the dialler proved the key (admit), so a stranger's bytes allocate nothing.
void Engine::pending_hello(Pending& p) {
  const HelloBody& h = p.hs.hello();
  if (p.hs.peer() < 0) {
    const int n = p.hs.add_with_nics();
    if (n < 1) return pending_reject(p, "hello names no peer");
    const size_t rails = std::max(nics_.size(), static_cast<size_t>(n)) * static_cast<size_t>(cfg_.conns_per_nic);
    if (h.rail >= rails) return pending_reject(p, "hello names rail " + std::to_string(h.rail) + " that does not exist");
  } else {
    auto it = peers_.find(p.hs.peer());
    if (it == peers_.end()) {
      p.parked = true;   // bootstrap race: the peer dialled before add_peer() ran here
      epoll_mod(p.link->wait_fd(), &p.poll, 0);
      return;
    }
    Peer& pr = *it->second;
    if (pr.ch().dead || pr.gone || pr.closing == Peer::Closing::kSaidBye)   // a re-dial that crossed our close
      return pending_reject(p, "channel to " + pr.core->peer_name() + " is closed", true);
    if (h.rail >= pr.links.size()) return pending_reject(p, "hello names rail " + std::to_string(h.rail) + " that does not exist");
    const Link& l = *pr.links[h.rail];
    if (pr.rail(static_cast<int>(h.rail)).local_nic != p.nic)
      return pending_reject(p, "rail " + std::to_string(h.rail) + " arrived on the wrong NIC");
    if (l.fault == Fault::kClose || l.fault == Fault::kStall)
      return pending_reject(p, "rail " + std::to_string(h.rail) + " is held down by an injected fault", true);
  }
  epoll_mod(p.link->wait_fd(), &p.poll, EPOLLIN);
  uint8_t nonce[kNonceBytes];
  random_bytes(nonce, kNonceBytes);
  TxFrame f;
  encode_control(&f, FrameType::kChallenge, p.hs.challenge(nonce));
  // A fresh link has room for 128 bytes; anything else means it is already broken.
  if (!send_at_once(*p.link, f)) return pending_reject(p, "could not send the challenge");
}

// The peer of an admitted hello the identity named none for: the same one for every rail of
// the dialler's connection (PeerIdentity::admit_new), made on its first rail as the listening
// side of a dialler with add_with_nics() NICs, of which it knows no listener.
Peer* Engine::admitted_peer(Pending& p) {
  const HelloBody& h = p.hs.hello();
  const int id = identity_->admit_new(HelloIds{h.job_id, h.from_rank, h.to_rank});
  auto it = peers_.find(id);
  if (it != peers_.end()) {
    if (!it->second->gone) return it->second.get();
    pending_reject(p, "its connection was closed during the handshake", true);
    return nullptr;
  }
  if (id < 0) {
    pending_reject(p, "the identity admitted no peer for this hello");
    return nullptr;
  }
  const size_t n = static_cast<size_t>(p.hs.add_with_nics());
  // Its NIC k pairs with ours k % nics (make_peer): it dialled that pair with our NIC's transport.
  std::vector<PeerAddress> remote(n);
  for (size_t k = 0; k < n; k++) remote[k].backend = &transports_->backend(k % nics_.size());
  try {
    Peer& c = make_peer(id, remote);
    c.probe_listener = false;
    c.opened = true;
    return &c;
  } catch (const Error& e) {
    pending_reject(p, e.what());
    return nullptr;
  }
}

void Engine::admit(Pending& p) {
  Peer* found = nullptr;
  if (p.hs.peer() >= 0) {
    // The peer named at the hello may have been closed while the proof was on its way.
    auto it = peers_.find(p.hs.peer());
    if (it == peers_.end() || it->second->gone)
      return pending_reject(p, "its connection was closed during the handshake", true);
    found = it->second.get();
  } else {
    found = admitted_peer(p);
  }
  if (!found) return;
  Peer& pr = *found;
  if (pr.closing == Peer::Closing::kSaidBye)
    return pending_reject(p, pr.core->peer_name() + " is closing (goodbye said)", true);
  const int idx = static_cast<int>(p.hs.hello().rail);
  if (p.hs.peer() < 0) {   // (checked at the hello for a peer known then)
    if (idx >= static_cast<int>(pr.links.size()) || pr.rail(idx).local_nic != p.nic)
      return pending_reject(p, "rail " + std::to_string(idx) + " arrived on the wrong NIC");
    if (pr.ch().dead) return pending_reject(p, "channel to " + pr.core->peer_name() + " is closed", true);
  }
  Link& l = *pr.links[static_cast<size_t>(idx)];
  const Rail& r = pr.rail(idx);
  if (nic_down_[static_cast<size_t>(r.local_nic)])
    return pending_reject(p, "rail " + std::to_string(idx) + " runs over NIC " + nics_[r.local_nic].name +
                                 ", which is held down: " + nic_down_why_[static_cast<size_t>(r.local_nic)]);
  // The connector writes as soon as it reads the welcome: trust it first.
  p.link->trust_peer();
  TxFrame f;
  encode_control(&f, FrameType::kWelcome, {});
  if (!send_at_once(*p.link, f)) return pending_reject(p, "could not send welcome");
  if (r.state != RailState::kDown)
    pr.core->fail_rail(idx, FailReason::kReplaced, "replaced by a new connection from the peer", now_ns());
  if (l.link) drop_link(pr, l, false);
  set_link(l, std::move(p.link));
  pr.opened = true;   // the peer wants these rails: so do we (a ring neighbour's first message)
  l.epoch = p.hs.hello().epoch;
  l.events = EPOLLIN;
  epoll_mod(l.link->wait_fd(), &l.poll, EPOLLIN);
  p.dead = true;
  link_up(pr, l, false);   // the connector trusts us when it reads the welcome: its next frame says so
  // Admitted for a listen that was closed meanwhile (PeerIdentity::wanted): the dialler learns
  // of the close from our goodbye instead of re-dialling until its timeout.
  if (pr.closing == Peer::Closing::kOpen && !identity_->wanted(pr.rank))
    begin_close(pr, "its listen was closed before it was accepted", now_ns());
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
  std::unique_ptr<FrameLink> link;
  try {
    link = rail_transport(r).connect(nics_[r.local_nic], pr.remote[r.remote_nic], linkopt_);
  } catch (const Error& e) {
    set_link(l, nullptr);
    attempt_failed(pr, l, e.what(), false);
    return;
  }
  // A connect that failed at once (the NIC's route is gone: ENETUNREACH, EINVAL) is reported
  // now with its cause; waiting for readiness would only time out.
  if (link->finish_connect() == ConnectState::kFailed) {
    const LinkFailure f = link->failure();
    set_link(l, nullptr);
    attempt_failed(pr, l, f.detail, f.error == LinkError::kRefused);
    return;
  }
  set_link(l, std::move(link));
  pr.core->link_state(l.index, RailState::kConnecting);
  l.events = l.link->needs_writable_watch() ? EPOLLOUT | EPOLLIN : EPOLLIN;
  epoll_add(l.link->wait_fd(), &l.poll, l.events);
}

void Engine::attempt_failed(Peer& pr, Link& l, const std::string& why, bool refused) {
  if (l.link) {
    epoll_del(l.link->wait_fd());
    set_link(l, nullptr);
  }
  l.events = 0;
  pr.core->link_state(l.index, RailState::kDown, why);
  l.refused = refused;
  l.next_attempt_ns = now_ns() + cfg_.reprobe_ms * kMs;
  R2_INFO("%s: connection attempt failed: %s", pr.core->rail_name(l.index).c_str(), why.c_str());
}

void Engine::link_up(Peer& pr, Link& l, bool peer_trusts) {
  l.refused = false;
  l.link->trust_peer();   // the secret is proven both ways: the peer may write into what we advertise
  l.peer_trusts = peer_trusts;
  pr.core->rail_up(l.index, now_ns());
  if (peer_trusts) pr.core->greet(l.index, now_ns());   // the connector's first frame: see Link::peer_trusts
  set_interest(l);
}

}  // namespace r2ccl
