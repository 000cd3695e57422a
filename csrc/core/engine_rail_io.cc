// Rail I/O over TCP: writing a rail's queued frames as bytes (with the software rate cap),
// reading bytes into frames, validating headers, and the connector's side of the handshake.
// Each whole frame goes to the channel (ChannelCore), which decides what it means and where
// its payload lands. Engine thread only.
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
#include "core/registration.h"

namespace r2ccl {

using namespace detail;

// ---------------------------------------------------------------- rail I/O

bool Engine::rail_flush(Peer& pr, Link& l) {
  if (l.flushing) return true;   // a kick from inside this loop: the loop writes it
  l.flushing = true;
  Rail& r = pr.rail(l.index);
  while (r.cur.active) {
    if (l.fault == Fault::kStall || !l.link) break;
    if (!l.posted) {
      SendPost post;
      post.header = r.cur.hdr;
      post.payload = r.cur.payload;
      post.payload_len = r.cur.payload_len;
      post.cookie = ++l.cookie;
      if (r.cur.written) {   // (RailIo::writes said this link and the memory can)
        post.write = true;
        post.remote_addr = r.cur.remote_addr;
        post.remote_key = r.cur.remote_key;
        post.mr = r.cur.req && r.cur.req->reg ? r.cur.req->reg->on(rail_transport(r)) : nullptr;
      }
      l.link->post_send(post);
      l.posted = true;
    }
    size_t budget = SIZE_MAX;
    if (l.fault == Fault::kRate) {
      const size_t left = r.cur.total() - l.link->head_sent();
      int64_t now = now_ns();
      l.tokens = std::min(l.tokens + (now - l.tokens_ns) * 1e-9 * l.rate_bps, std::max(65536.0, l.rate_bps / 100));
      l.tokens_ns = now;
      // Write in batches of at least 16 KiB (or the rest of the frame): trickling a few
      // bytes per syscall as tokens accrue would spin the engine and starve other rails.
      double need = static_cast<double>(std::min<size_t>(left, 16384));
      if (l.tokens < need) {
        l.next_tx_ns = now + std::max<int64_t>(kMs / 2, static_cast<int64_t>(1e9 * (need - l.tokens) / l.rate_bps));
        pr.core->hold_rail(l.index, l.next_tx_ns);
        break;
      }
      budget = static_cast<size_t>(l.tokens);
    }
    LinkCompletion c = l.link->poll_send(budget);
    if (l.fault == Fault::kRate) l.tokens -= static_cast<double>(c.moved);
    if (c.kind == LinkCompletion::kFailed) {
      const LinkFailure& f = l.link->failure();
      const FailReason why = fail_reason_of(f);
      const std::string detail = f.detail;
      l.flushing = false;
      pr.core->fail_rail(l.index, why, detail, now_ns());
      return false;
    }
    const int64_t now = now_ns();
    if (c.kind == LinkCompletion::kSent) {
      l.posted = false;
      r.cur.done = r.cur.total();
      pr.core->frame_written(l.index, now);
      continue;
    }
    r.cur.done = l.link->head_sent();
    if (c.moved) pr.core->tx_progress(l.index, now);
    if (l.fault != Fault::kRate || c.moved == 0) break;   // the link would block
  }
  l.flushing = false;
  set_interest(l);
  return true;
}

void Engine::rail_writable(Peer& pr, Link& l) {
  Rail& r = pr.rail(l.index);
  if (r.state == RailState::kConnecting) {
    ConnectState st = l.link->finish_connect();
    if (st == ConnectState::kPending) return;
    if (st == ConnectState::kFailed) {
      const LinkFailure f = l.link->failure();
      attempt_failed(pr, l, f.detail, f.error == LinkError::kRefused);
      return;
    }
    HelloBody h;
    const HelloIds ids = identity_->hello_to(pr.rank);
    h.job_id = ids.domain;
    h.from_rank = ids.from;
    h.to_rank = ids.to;
    h.rail = static_cast<uint32_t>(l.index);
    h.epoch = l.epoch;
    random_bytes(h.nonce.data(), kNonceBytes);
    l.hs = ConnectorHandshake(&identity_->key(pr.rank));
    pr.core->link_state(l.index, RailState::kHandshake);
    TxFrame f;
    encode_control(&f, FrameType::kHello, l.hs.hello(h));
    pr.core->transport_frame(l.index, std::move(f));
    rail_flush(pr, l);
    return;
  }
  if (!rail_flush(pr, l)) return;
  if (r.state == RailState::kUp && !r.cur.active) pr.core->pump(now_ns());
}

void Engine::rail_readable(Peer& pr, Link& l) {
  if (l.fault == Fault::kStall) return;
  Rail& r = pr.rail(l.index);
  const uint64_t my_link = l.generation;
  auto gone = [&] { return !l.link || l.generation != my_link; };
  auto read_failed = [&] {
    const LinkFailure& f = l.link->failure();
    const std::string detail = f.detail;
    pr.core->fail_rail(l.index, fail_reason_of(f), detail, now_ns());
  };
  // One read pass: bounded in frames (one busy rail cannot starve its siblings' writers) and
  // in payload bytes (every rail with data gets the same service; kReadPassBytes). What is
  // left stays readable and is read on the next turn of the loop.
  uint64_t pass_bytes = 0;
  const uint64_t pass_limit = pr.core->settings().read_pass_bytes;
  bool drained = true;
  for (int frames = 0;; frames++) {
    if (pass_bytes >= pass_limit || frames == 64) {
      drained = false;
      break;
    }
    if (gone()) return;
    RxFrame& rx = r.rx;
    if (!rx.in_payload) {
      LinkCompletion c = l.link->poll_recv();
      if (c.kind == LinkCompletion::kNone) {
        if (c.moved) pr.core->rx_progress(l.index, now_ns());
        break;
      }
      if (c.kind != LinkCompletion::kHeader) return read_failed();
      std::memcpy(rx.hdr, c.header, kHeaderBytes);
      rx.hdr_got = kHeaderBytes;
      const int64_t now = now_ns();
      std::string bad = decode_header(rx.hdr, limits_, &rx.h);
      if (!bad.empty()) return pr.core->fail_rail(l.index, FailReason::kProtocol, "protocol error: " + bad, now);
      if (r.state == RailState::kUp) {
        l.peer_trusts = true;   // sent after the peer's link_up (see Link::peer_trusts)
        if (!pr.core->on_header(l.index, now) || gone()) return;
      } else if (rx.h.type == FrameType::kData) {
        return pr.core->fail_rail(l.index, FailReason::kProtocol, "protocol error: data before the handshake finished",
                                  now);
      } else {
        rx.ctrl.resize(rx.h.payload_len);
        rx.dest = rx.ctrl.data();
        rx.in_payload = true;
        rx.got = 0;
      }
      l.link->accept_header(link_payload_len(rx.h));
      l.piece_posted = false;
    }
    // payload (a written chunk's is in place already: its frame carries none)
    while (rx.got < link_payload_len(rx.h)) {
      if (!l.piece_posted) {
        size_t want = link_payload_len(rx.h) - rx.got;
        uint8_t* dst;
        if (rx.scratch) {
          dst = nullptr;
        } else if (rx.grow) {
          // Staging grows by at most one step ahead of the bytes read.
          want = std::min(want, scratch_.size());
          try {
            if (rx.grow->size() < rx.got + want) rx.grow->resize(rx.got + want);
          } catch (const std::bad_alloc&) {
            pr.core->kill(Cause::kSystem, "out of memory staging a message from rank " + std::to_string(pr.rank) +
                                              " that arrived before its receive was posted");
            return;
          }
          dst = rx.grow->data() + rx.got;
        } else {
          dst = rx.dest + rx.got;
        }
        l.link->post_recv(dst, want, nullptr);
        l.piece_posted = true;
      }
      LinkCompletion c = l.link->poll_recv();
      if (c.moved) pr.core->rx_progress(l.index, now_ns());
      if (c.kind == LinkCompletion::kNone) goto out;
      if (c.kind != LinkCompletion::kPayload) return read_failed();
      rx.got += c.bytes;
      pass_bytes += c.bytes;
      l.piece_posted = false;
    }
    if (r.state == RailState::kUp)
      pr.core->on_frame(l.index, now_ns());
    else
      handshake_frame(pr, l);
    if (gone()) return;
    r.rx.reset();
  }
out:
  if (r.state == RailState::kUp) pr.core->rx_pass_end(l.index, now_ns(), drained && l.link->rx_drained());
}

// The connector's side of the handshake: the listener's challenge (answered with our proof
// of the secret), then its welcome (the rail is up).
void Engine::handshake_frame(Peer& pr, Link& l) {
  Rail& r = pr.rail(l.index);
  const FrameHeader& h = r.rx.h;
  const std::vector<uint8_t>& body = r.rx.ctrl;
  Mac auth;
  std::string why;
  switch (r.state == RailState::kHandshake ? l.hs.on_frame(h, body, &auth, &why) : ConnectorHandshake::Step::kFail) {
    case ConnectorHandshake::Step::kSendAuth: {
      TxFrame f;
      encode_control(&f, FrameType::kAuth, std::vector<uint8_t>(auth.begin(), auth.end()));
      pr.core->transport_frame(l.index, std::move(f));
      rail_flush(pr, l);
      return;
    }
    case ConnectorHandshake::Step::kUp:
      r.rx.reset();
      link_up(pr, l, true);   // the acceptor trusted us before it sent the welcome
      return;
    case ConnectorHandshake::Step::kFail:
      if (why.empty()) why = "unexpected frame during the handshake";
      R2_WARN("%s: %s; dropping the connection", pr.core->rail_name(l.index).c_str(), why.c_str());
      attempt_failed(pr, l, why, false);
      return;
  }
}

}  // namespace r2ccl
