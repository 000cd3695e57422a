// Rail I/O: writing frames (with the software rate cap), reading and validating frames,
// control frames, placing data chunks exactly once, and acknowledgements. Engine thread only.
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
      fail_rail(ch, r, by_peer ? FailReason::kClosedByPeer : FailReason::kIo,
                std::string("send failed: ") + std::strerror(res.err));
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
        fail_rail(ch, r, eof || res.err == ECONNRESET ? FailReason::kClosedByPeer : FailReason::kIo,
                  eof ? "connection closed by the peer" : std::string("receive failed: ") + std::strerror(res.err));
        return;
      }
      r.last_rx_ns = now_ns();
      std::string bad = decode_header(rx.hdr, limits_, &rx.h);
      if (!bad.empty()) {
        fail_rail(ch, r, FailReason::kProtocol, "protocol error: " + bad);
        return;
      }
      rx.in_payload = true;
      rx.got = 0;
      if (rx.h.type == FrameType::kData) {
        if (r.state != RailState::kUp) {
          fail_rail(ch, r, FailReason::kProtocol, "protocol error: data before the handshake finished");
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
      uint8_t* dst;
      if (rx.scratch) {
        dst = scratch_.data();
        want = std::min(want, scratch_.size());
      } else if (rx.grow) {
        // Staging grows by at most one step ahead of the bytes read.
        want = std::min(want, scratch_.size());
        try {
          if (rx.grow->size() < rx.got + want) rx.grow->resize(rx.got + want);
        } catch (const std::bad_alloc&) {
          kill_channel(ch, Cause::kSystem, "out of memory staging a message from rank " + std::to_string(ch.peer) +
                                               " that arrived before its receive was posted");
          return;
        }
        dst = rx.grow->data() + rx.got;
      } else {
        dst = rx.dest + rx.got;
      }
      IoResult res = r.conn->read(dst, want);
      if (res.kind == IoResult::kWouldBlock) goto out;
      if (res.kind != IoResult::kOk) {
        bool eof = res.kind == IoResult::kEof;
        fail_rail(ch, r, eof || res.err == ECONNRESET ? FailReason::kClosedByPeer : FailReason::kIo,
                  eof ? "connection closed by the peer" : std::string("receive failed: ") + std::strerror(res.err));
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
          fail_rail(ch, r, FailReason::kProtocol, "protocol error: ack range outside what was sent");
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
    case FrameType::kHeartbeatAck: {
      // Liveness is last_rx_ns; the round trip is a sample for the health monitor. The echoed
      // clock is our own, so only a value in the past is believed.
      int64_t sent = static_cast<int64_t>(load_le64(body.data() + 8));
      int64_t now = now_ns();
      if (sent > 0 && sent <= now && now - sent < 60 * 1000 * kMs) r.rtt_ns = now - sent;
      return;
    }
    case FrameType::kRailState: {
      uint32_t idx = load_le32(body.data());
      bool up = load_le32(body.data() + 4) != 0;
      if (idx >= ch.rails.size()) {
        fail_rail(ch, r, FailReason::kProtocol,
                  "protocol error: rail state for rail " + std::to_string(idx) + " that does not exist");
        return;
      }
      Rail& t = *ch.rails[idx];
      if (!up) {
        if (&t != &r && t.state != RailState::kDown)
          fail_rail(ch, t, FailReason::kPeerLinkDown, "rank " + std::to_string(ch.peer) + " reports its link down");
      } else if (t.state == RailState::kDown) {
        t.next_attempt_ns = 0;
        if (ch.connector && t.fault != Fault::kClose && t.fault != Fault::kStall &&
            !nic_down_[static_cast<size_t>(t.local_nic)])
          start_connect(ch, t);
      }
      return;
    }
    case FrameType::kBye:
      R2_INFO("rank %d said goodbye on %s", ch.peer, rail_name(ch, r).c_str());
      ch.bye_received = true;
      return;
    default:
      fail_rail(ch, r, FailReason::kProtocol, "protocol error: handshake frame on an established rail");
      return;
  }
}

// The receive state of the message a data chunk belongs to, created on its first chunk:
// matched to the posted receive with the same (tag, k-th), or staged until one is posted.
// Null when the channel died (out of memory for staging).
InMsg* Engine::open_inmsg(Channel& ch, const FrameHeader& h) {
  auto it = ch.inmsgs.find(h.msg_id);
  if (it != ch.inmsgs.end()) return &it->second;
  InMsg m;
  m.tag = h.tag;
  m.tag_seq = h.tag_seq;
  m.len = h.msg_len;
  m.aborted = (h.flags & kFlagAbort) != 0;
  auto key = std::make_pair(h.tag, h.tag_seq);
  auto p = ch.posted.find(key);
  if (p != ch.posted.end()) {
    auto req = p->second;
    ch.posted.erase(p);
    if (req->len != h.msg_len) {
      req->finish_error(Cause::kMismatch, size_mismatch(ch.peer, h.msg_len, h.tag, req->len));
      m.discard = true;
    } else {
      m.req = req;
    }
  } else {
    m.staged = !m.aborted;
    ch.unexpected[key] = h.msg_id;
  }
  return &ch.inmsgs.emplace(h.msg_id, std::move(m)).first->second;
}

// Decides where a data chunk's payload goes: the receive's buffer, staging, or nowhere.
void Engine::rail_data_header(Channel& ch, Rail& r) {
  RxFrame& rx = r.rx;
  const FrameHeader& h = rx.h;
  rx.scratch = true;
  if (ch.seq_applied(h.seq) || h.payload_len == 0) return;
  InMsg* m = open_inmsg(ch, h);
  if (!m) return;
  if (m->tag != h.tag || m->tag_seq != h.tag_seq || m->len != h.msg_len) {
    fail_rail(ch, r, FailReason::kProtocol, "protocol error: chunk disagrees with its message");
    return;
  }
  if (m->discard || m->aborted) return;
  rx.scratch = false;
  // A message that began unexpected keeps landing in staging until whole (chunks already
  // there are copied once at completion); one whose receive came first lands in place.
  if (m->staged) {
    auto& v = m->chunks[h.offset];
    v.clear();
    rx.grow = &v;
    rx.dest = nullptr;
  } else {
    rx.dest = m->req->buf + h.offset;
  }
}

void Engine::rail_data_done(Channel& ch, Rail& r) {
  RxFrame& rx = r.rx;
  const FrameHeader& h = rx.h;
  bool was_applied = ch.seq_applied(h.seq);
  if (rx.grow) rx.grow->resize(h.payload_len);   // (reads may have left it one step ahead)
  const uint8_t* payload = rx.grow ? rx.grow->data() : rx.dest;
  if (!was_applied && !rx.scratch && (h.flags & kFlagPayloadCrc) &&
      crc32c(payload, h.payload_len) != h.payload_crc) {
    fail_rail(ch, r, FailReason::kChecksum, "payload CRC32C mismatch");
    return;
  }
  if (cfg_.crc && !(h.flags & kFlagPayloadCrc) && h.payload_len > 0) {
    fail_rail(ch, r, FailReason::kProtocol, "protocol error: R2CCL_CRC is on here but the peer sent no checksum");
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
  InMsg* m = open_inmsg(ch, h);   // exists unless this is an empty (zero-length or abort) chunk
  if (!m) return;
  if (h.flags & kFlagAbort) m->aborted = true;
  m->received += h.payload_len;
  if (m->aborted && m->req) {
    m->req->finish_error(Cause::kTimeout, abandoned(ch.peer));
    m->req.reset();
    m->discard = true;
    redirect_to_scratch(ch, h.msg_id);
    return;
  }
  if (!m->aborted && m->received == m->len) finish_inmsg(ch, h.msg_id);
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
  if (m.staged && m.req->len == m.len)
    for (auto& [off, v] : m.chunks)
      if (!v.empty()) std::memcpy(m.req->buf + off, v.data(), v.size());   // inside: decode_header checked
  if (m.req->len != m.len)
    m.req->finish_error(Cause::kMismatch, size_mismatch(ch.peer, m.len, m.tag, m.req->len));
  else
    m.req->finish_ok();
  redirect_to_scratch(ch, msg_id);
  ch.inmsgs.erase(it);
}

// A message is finished or abandoned: copies still arriving on other rails must not touch
// its buffer any more (the caller may already be reusing it).
void Engine::redirect_to_scratch(Channel& ch, uint64_t msg_id) {
  for (auto& o : ch.rails)
    if (o->rx.in_payload && o->rx.h.type == FrameType::kData && o->rx.h.msg_id == msg_id) {
      o->rx.scratch = true;
      o->rx.grow = nullptr;   // its staging is about to go
    }
}

void Engine::flush_acks(Channel& ch, Rail& r) {
  // Every ack frame also carries the cumulative point [1, rx_cum): chunks whose own ack is
  // stuck behind a dead rail are released by acks travelling on any other rail.
  if (!r.acks.empty() || !ch.orphan_acks.empty()) {
    if (ch.rx_cum > 1) r.acks.insert(r.acks.begin(), {1, ch.rx_cum});
    r.cum_sent = ch.rx_cum;
  }
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

}  // namespace r2ccl
