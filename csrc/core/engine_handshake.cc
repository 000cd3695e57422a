// Rail lifecycle: accepting and authenticating connections (acceptor side), dialling and
// re-dialling (connector side), bringing a rail up and failing it over. Engine thread only.
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
    return pending_reject(p, "rail " + std::to_string(h.rail) + " is held down by an injected fault", true);
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
  if (nic_down_[static_cast<size_t>(r.local_nic)])
    return pending_reject(p, "rail " + std::to_string(r.index) + " runs over NIC " + nics_[r.local_nic].name +
                                 ", which is held down: " + nic_down_why_[static_cast<size_t>(r.local_nic)]);
  TxFrame f;
  encode_frame(&f, FrameType::kWelcome, {}, 0);
  iovec iov[1] = {{f.hdr, kHeaderBytes}};
  IoResult res = p.conn->writev(iov, 1);
  if (res.kind != IoResult::kOk || res.bytes != kHeaderBytes) return pending_reject(p, "could not send welcome");
  if (r.state != RailState::kDown) fail_rail(ch, r, FailReason::kReplaced, "replaced by a new connection from the peer");
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
  // A re-dial of a rail that was up before gets a short deadline: an attempt started while
  // the link was still down must not hold the rail out long after the link heals.
  int64_t deadline_ms = r.ever_up ? std::min<int64_t>(cfg_.connect_timeout_ms, std::max(250, 2 * cfg_.reprobe_ms))
                                  : cfg_.connect_timeout_ms;
  r.attempt_deadline_ns = now + deadline_ms * kMs;
  r.epoch++;
  try {
    r.conn = tp_->connect(nics_[r.local_nic], ch.remote[r.remote_nic], sockopt_);
  } catch (const Error& e) {
    r.conn.reset();
    attempt_failed(ch, r, e.what(), false);
    return;
  }
  // A connect that failed at once (the NIC's route is gone: ENETUNREACH, EINVAL) is reported
  // now with its cause; waiting for readiness would only time out.
  IoResult early = r.conn->finish_connect();
  if (early.kind == IoResult::kError) {
    const int err = early.err;
    r.conn.reset();
    attempt_failed(ch, r, std::string("connect: ") + std::strerror(err), err == ECONNREFUSED);
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

void Engine::fail_rail(Channel& ch, Rail& r, FailReason reason, const std::string& why) {
  if (r.state == RailState::kDown) return;
  const bool by_peer = reason == FailReason::kClosedByPeer;
  r.last_reason = fail_reason_name(reason);
  // A frame that breaks the protocol would be re-sent on the next rail and break it too:
  // after a few, the peer is not to be trusted and the channel ends with a clear error.
  if (reason == FailReason::kProtocol || reason == FailReason::kChecksum) {
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
  r.pace.on_idle();
  if (r.busy_since_ns) r.busy_ns += now - r.busy_since_ns;
  r.busy_since_ns = 0;
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

}  // namespace r2ccl
