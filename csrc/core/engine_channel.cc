// Channels: cutting messages into chunks and dealing them to rails by weight, acks,
// posting, matching and cancelling requests, and ending a channel. Engine thread only.
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

// ---------------------------------------------------------------- dealing and acks

bool Engine::next_chunk(Channel& ch, Chunk* c, uint64_t max_len) {
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
    uint64_t len = std::min<uint64_t>(max_len, req->len - req->next_offset);
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
  // share (bytes / weight) gets it. Each rail's window and chunk size follow its measured
  // bandwidth (RailPace: about R2CCL_RAIL_QUEUE_MS of its own traffic), so when every rail is
  // window-bound (the sender outruns the network or the receiver) the split follows what
  // each rail delivers; a rail that cannot keep up is skipped rather than waited for, so it
  // never sets the pace.
  for (;;) {
    Rail* best = nullptr;
    double best_vt = 0;
    int64_t now = now_ns();
    for (auto& rp : ch.rails) {
      Rail& r = *rp;
      if (r.state != RailState::kUp || r.fault == Fault::kStall || r.cur.active || !r.ctrl.empty()) continue;
      if (r.weight <= 0) continue;
      const uint64_t chunk = r.pace.chunk();
      if (r.inflight > 0 && r.inflight + chunk > r.pace.window()) continue;
      if (r.next_tx_ns > now) continue;
      // A rail that was busy keeps up to one window of credit, so it catches up when free.
      double vt = std::max(r.vtime, ch.vclock - static_cast<double>(r.pace.window()));
      if (!best || vt < best_vt) {
        best = &r;
        best_vt = vt;
      }
    }
    if (!best) return;
    Rail& r = *best;
    Chunk c;
    if (!next_chunk(ch, &c, r.pace.chunk())) return;
    if (c.void_) {
      c.len = 0;
      c.offset = 0;
    }
    ch.vclock = std::max(ch.vclock, best_vt);
    r.vtime = best_vt + static_cast<double>(std::max<uint32_t>(c.len, 1)) / r.weight;
    if (r.inflight == 0) r.progress_ns = now;
    if (r.inflight == 0 && c.len > 0) r.busy_since_ns = now;
    if (c.len > 0) r.pace.on_deal(now, r.inflight == 0);
    c.dealt_ns = now;
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
      if (c.len > 0) carrier.pace.on_ack(now, c.len, c.resend ? 0 : c.dealt_ns, carrier.inflight);
      if (carrier.inflight == 0 && carrier.busy_since_ns) {
        carrier.busy_ns += now - carrier.busy_since_ns;
        carrier.busy_since_ns = 0;
      }
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
    req->finish_error(Cause::kTimeout, abandoned(ch.peer));
    m.discard = true;
    return;
  }
  if (m.len != req->len) {
    req->finish_error(Cause::kMismatch, size_mismatch(ch.peer, m.len, req->tag, req->len));
    m.discard = true;
    redirect_to_scratch(ch, msg_id);
    m.chunks.clear();
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
              redirect_to_scratch(ch, id);
              m.chunks.clear();
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

}  // namespace r2ccl
