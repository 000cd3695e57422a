// The channel state machine (channel.h): dealing chunks to rails by weight, acks, placing
// data exactly once, retransmitting what a failed rail held, matching and cancelling
// requests, stall and silence detection, and ending a channel. Time comes in as arguments;
// frames leave through each rail's queue and RailIo::kick.
#include "core/channel.h"

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "core/digest.h"

// Tests only (CMakeLists.txt: test_channel_sim_planted_*): a deliberate bug, to show the
// deterministic suite catches it. 1 (dedup): a duplicate of the chunk just below the
// cumulative point is applied again (an off-by-one). 2 (retransmit): when a failed rail
// held two or more unacknowledged chunks, the newest is not sent again.
#ifndef R2CCL_PLANT_FAULT
#define R2CCL_PLANT_FAULT 0
#endif

namespace r2ccl {

namespace {
constexpr int64_t kMs = 1000000;
constexpr uint64_t kMinChunkBytes = 16 << 10;   // smallest chunk a low-weight rail is dealt
constexpr int kMaxProtocolErrors = 8;
constexpr int kLazyAckChunks = 16;             // eager chunks whose acks wait at most (zero-byte ones too)

std::string size_mismatch(const std::string& peer, uint64_t sent, uint64_t tag, uint64_t expects) {
  return peer + " sent " + std::to_string(sent) + " bytes with tag " + std::to_string(tag) +
         " but this receive expects " + std::to_string(expects);
}

std::string abandoned(const std::string& peer, bool mismatch) {
  return peer +
         (mismatch ? " abandoned this message: its collective did not match another process's (mismatch)"
                   : " abandoned this message (its send was cancelled or timed out)");
}

Cause abandoned_cause(bool mismatch) { return mismatch ? Cause::kMismatch : Cause::kTimeout; }
}  // namespace


void encode_control(TxFrame* f, FrameType t, std::vector<uint8_t> payload, uint64_t seq, uint8_t flags) {
  FrameHeader h;
  h.type = t;
  h.flags = flags;
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

ChannelSettings ChannelSettings::from(const Config& cfg) {
  ChannelSettings s;
  s.crc = cfg.crc;
  s.stall_ns = cfg.stall_ms * kMs;
  s.heartbeat_ns = cfg.heartbeat_ms * kMs;
  s.heartbeat_misses = cfg.heartbeat_misses;
  s.rest_heartbeat_ns = static_cast<int64_t>(cfg.rest_heartbeat_ms) * kMs;
  s.timeout_ns = static_cast<int64_t>(cfg.timeout_s * 1e9);
  s.pace.max_window = cfg.rail_window_bytes;
  s.pace.max_chunk = cfg.chunk_bytes;
  s.pace.min_chunk = kMinChunkBytes;
  s.pace.min_window = 2 * kMinChunkBytes;
  s.pace.target_ns = cfg.rail_queue_ms * kMs;
  s.eager_bytes = cfg.eager_bytes;
  s.advert_wait_ns = static_cast<int64_t>(cfg.advert_wait_ms) * kMs;
  s.eager_held_bytes = kEagerHeldBytes;
  // Half the smallest window a rail can have: a sender held back by its window is never
  // waiting for acks the receiver holds back.
  s.lazy_ack_bytes = std::min<uint64_t>(kMinChunkBytes, std::min(s.pace.min_window, s.pace.max_window) / 2);
  // Likewise for data read in passes: acks go out before a full window is read.
  s.read_pass_bytes = std::min<uint64_t>(kReadPassBytes, std::max<uint64_t>(s.pace.max_window / 2, 1));
  return s;
}

ChannelCore::ChannelCore(int peer, std::string peer_name, std::vector<std::string> rail_names,
                         const std::vector<std::pair<int, int>>& nic_pairs, const ChannelSettings& set, RailIo* io,
                         int64_t now)
    : peer_name_(std::move(peer_name)), rail_names_(std::move(rail_names)), set_(set), io_(io) {
  ch.peer = peer;
  for (size_t i = 0; i < nic_pairs.size(); i++) {
    auto r = std::make_unique<Rail>();
    r->index = static_cast<int>(i);
    r->local_nic = nic_pairs[i].first;
    r->remote_nic = nic_pairs[i].second;
    r->pace = RailPace(set.pace);
    r->changed_ns = now;
    ch.rails.push_back(std::move(r));
  }
  rail_names_.resize(nic_pairs.size());
}

uint64_t ChannelCore::staged_bytes() const {
  uint64_t n = 0;
  for (auto& [id, m] : ch.inmsgs) n += m.staged_bytes();
  return n;
}

void ChannelCore::queue_ctrl(Rail& r, FrameType t, std::vector<uint8_t> payload, uint64_t seq, uint8_t flags) {
  TxFrame f;
  encode_control(&f, t, std::move(payload), seq, flags);
  transport_frame(r.index, std::move(f));
}

// A heartbeat (or its echo, `echoed` the peer's clock) on `r`, saying whether this connection
// is at rest: the peer waits accordingly, and this end may beat slowly on `r` only once it
// has said so there.
void ChannelCore::queue_heartbeat(Rail& r, int64_t now, const uint8_t* echoed) {
  std::vector<uint8_t> body(kHeartbeatBytes, 0);
  store_le64(body.data(), static_cast<uint64_t>(now));
  if (echoed) std::memcpy(body.data() + 8, echoed, 8);
  r.rest_announced = ch.resting;
  queue_ctrl(r, echoed ? FrameType::kHeartbeatAck : FrameType::kHeartbeat, std::move(body), 0,
             ch.resting ? kFlagResting : 0);
  io_->kick(r.index);
}

void ChannelCore::frame_written(int rail, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  r.last_tx_ns = now;
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

std::vector<std::pair<uint64_t, std::vector<uint8_t>>> ChannelCore::staged_heads(size_t n) const {
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> out;
  for (auto& [key, id] : ch.unexpected) {
    auto it = ch.inmsgs.find(id);
    if (it == ch.inmsgs.end() || !it->second.staged) continue;
    auto c = it->second.chunks.find(0);
    if (c == it->second.chunks.end() || c->second.size() < n) continue;
    bool reading = false;   // (a chunk still being read may hold storage ahead of its bytes)
    for (auto& r : ch.rails) reading = reading || (r->rx.in_payload && r->rx.grow == &c->second);
    if (reading) continue;
    out.push_back({key.first, std::vector<uint8_t>(c->second.begin(), c->second.begin() + static_cast<long>(n))});
  }
  return out;
}

void ChannelCore::transport_frame(int rail, TxFrame f) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  if (!r.cur.active)
    r.cur = std::move(f);
  else
    r.ctrl.push_back(std::move(f));
}

void ChannelCore::link_state(int rail, RailState s, const std::string& why) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  r.state = s;
  if (s == RailState::kDown) {
    r.last_error = why;
    r.rx.reset();
  }
  if (s == RailState::kHandshake) {
    r.cur = TxFrame();
    r.ctrl.clear();
  }
}

// ---------------------------------------------------------------- rails

void ChannelCore::rail_up(int rail, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  if (r.ever_up) {
    r.recoveries++;
    R2_WARN("%s recovered (failback)", rail_name(rail).c_str());
  } else {
    R2_INFO("%s up", rail_name(rail).c_str());
  }
  r.state = RailState::kUp;
  r.ever_up = true;
  r.closed_by_peer = false;
  r.said_bye = false;
  r.last_rx_ns = r.last_tx_ns = r.last_ack_ns = r.progress_ns = r.changed_ns = now;
  r.peer_resting = r.rest_announced = false;   // a new connection: neither end has said anything
  r.vtime = ch.vclock;
  r.cur = TxFrame();
  r.ctrl.clear();
  r.rx.reset();
  r.inflight = 0;
  ch.all_down_since = 0;
  pump(now);
}

void ChannelCore::greet(int rail, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  if (r.state == RailState::kUp) queue_heartbeat(r, now, nullptr);
}

void ChannelCore::set_paused(int rail, bool paused, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  r.paused = paused;
  // Restart the stall clocks so the paused time is not counted against the rail.
  if (!paused && r.state == RailState::kUp) r.last_rx_ns = r.progress_ns = now;
}

void ChannelCore::fail_rail(int rail, FailReason reason, const std::string& why, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  if (r.state == RailState::kDown || ch.dead) return;
  r.last_reason = reason;
  // A frame that breaks the protocol would be re-sent on the next rail and break it too:
  // after a few, the peer is not to be trusted and the channel ends with a clear error.
  if (reason == FailReason::kProtocol || reason == FailReason::kChecksum) {
    if (++ch.protocol_errors >= kMaxProtocolErrors) {
      kill(Cause::kProtocol, "rank " + std::to_string(ch.peer) + " keeps violating the wire protocol (" +
                                 std::to_string(ch.protocol_errors) + " times); last: " + why);
      return;
    }
  }
  if (r.state != RailState::kUp) {
    R2_INFO("%s: connection attempt failed: %s", rail_name(rail).c_str(), why.c_str());
    r.state = RailState::kDown;
    r.last_error = why;
    r.rx.reset();
    io_->drop(rail, false);
    return;
  }
  const bool abandoned = reason == FailReason::kAbandoned;   // not the rail's fault: not counted
  // Nor is a rail that ends while either side closes the channel in order (no fault: INFO).
  const bool orderly = abandoned || ch.closing || ch.bye_received;
  R2_LOG(orderly ? LogLevel::kInfo : LogLevel::kWarn,
         "%s failed: %s; %zu unacknowledged chunk(s) move to other rails", rail_name(rail).c_str(), why.c_str(),
         static_cast<size_t>(std::count_if(ch.window.begin(), ch.window.end(),
                                           [&](auto& kv) { return kv.second.rail == r.index; })));
  r.state = RailState::kDown;
  if (!orderly) r.failures++;
  r.downs++;
  r.fences_told.clear();   // notices queued on this link are lost with it
  r.closed_by_peer = reason == FailReason::kClosedByPeer;
  r.last_error = why;
  r.changed_ns = r.failed_ns = now;
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
  r.lazy_bytes = 0;
  r.lazy_chunks = 0;
  r.ack_now = false;
  r.rx_unacked = 0;
  r.dealt_since_ask = 0;
  r.cur = TxFrame();
  r.ctrl.clear();
  r.rx.reset();
  r.inflight = 0;
  r.eager_inflight = 0;
  r.pace.on_idle();
  if (r.busy_since_ns) r.busy_ns += now - r.busy_since_ns;
  r.busy_since_ns = 0;
  io_->drop(rail, true);
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
#if R2CCL_PLANT_FAULT == 2
  if (moved.size() >= 2) moved.pop_back();
#endif
  for (auto it = moved.rbegin(); it != moved.rend(); ++it) {
    // A write of it may still be on its way through this rail's far end: the peer fences that
    // end before it sees the chunk again (tell_fences). A write that met revoked memory drops
    // its message's advert: what is left of it goes in frames.
    if (it->written) {
      it->fences.push_back({r.index, r.downs});
      if (abandoned && it->req) forget_advert(*it->req);
    }
    it->written = false;
    it->resend = true;
    it->rail = -1;
    ch.retx.push_front(std::move(*it));
  }
  if (ch.rails_up() == 0 && ch.all_down_since == 0) ch.all_down_since = now;
  pump(now);
  // Orphaned acks may have found a rail in pump(); flush them on any live rail.
  for (auto& o : ch.rails)
    if (o->state == RailState::kUp && !o->paused && !ch.orphan_acks.empty()) {
      flush_acks(*o);
      break;
    }
}

void ChannelCore::send_rail_state(int rail, bool up, int64_t now) {
  (void)now;
  const Rail& r = *ch.rails[static_cast<size_t>(rail)];
  std::vector<uint8_t> body(kRailStateBytes);
  store_le32(body.data(), static_cast<uint32_t>(r.index));
  store_le32(body.data() + 4, up ? 1u : 0u);
  for (auto& o : ch.rails)
    if (o->state == RailState::kUp && o->local_nic != r.local_nic && !o->paused) {
      queue_ctrl(*o, FrameType::kRailState, std::move(body));
      io_->kick(o->index);
      return;
    }
}

void ChannelCore::begin_close(Cause cause, const std::string& why, int64_t now) {
  ch.closing = true;
  if (ch.dead) return;
  std::vector<std::shared_ptr<Request>> held(ch.sends.begin(), ch.sends.end());
  for (auto& [k, req] : ch.posted) held.push_back(req);
  for (auto& [id, m] : ch.inmsgs)
    if (m.req) held.push_back(m.req);
  for (auto& req : held)
    if (!req->finished()) cancel(req, cause, why, now);
}

void ChannelCore::goodbye() {
  for (auto& r : ch.rails)
    if (r->state == RailState::kUp) {
      if (!r->paused) flush_acks(*r);
      queue_ctrl(*r, FrameType::kBye, {});
      io_->kick(r->index);
    }
}

size_t ChannelCore::request_acks(int64_t now) {
  if (ch.dead || ch.eager_sends.empty()) return ch.dead ? 0 : ch.eager_sends.size();
  for (auto& r : ch.rails)
    if (r->state == RailState::kUp && !r->paused && r->ctrl.empty()) queue_heartbeat(*r, now, nullptr);
  return ch.eager_sends.size();
}

// ---------------------------------------------------------------- dealing and acks

bool ChannelCore::awaits_advert(const Request& req, int64_t now) const {
  return req.registered && !req.eager && req.next_offset == 0 && ch.peer_advertises &&
         now - req.posted_ns < set_.advert_wait_ns && !ch.adverts.count({req.tag, req.tag_seq});
}

bool ChannelCore::next_chunk(Chunk* c, uint64_t max_len, int64_t now) {
  while (!ch.retx.empty()) {
    *c = std::move(ch.retx.front());
    ch.retx.pop_front();
    // A send that failed or was cancelled meanwhile still owes the receiver this sequence
    // number: it goes as an abort mark, so the receiver learns the message is abandoned and
    // its cumulative point moves on (a skipped number would hold it back for good).
    if (!c->void_ && (c->req->eager ? c->req->undeliverable : c->req->finished())) {
      c->void_ = true;
      c->len = 0;
      c->offset = 0;
    }
    return true;
  }
  for (auto it = ch.sendq.begin(); it != ch.sendq.end();) {
    auto req = *it;
    if (req->cancelled || req->undeliverable) {
      it = ch.sendq.erase(it);
      continue;
    }
    if (awaits_advert(*req, now)) {   // the next message goes meanwhile
      ++it;
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
      ch.sendq.erase(it);
    }
    return true;
  }
  return false;
}

void ChannelCore::pump(int64_t now) {
  if (ch.dead) return;
  // Weighted fair dealing: among rails free to take a chunk, the one furthest behind its
  // share (bytes / weight) gets it. Each rail's window and chunk size follow its measured
  // bandwidth (RailPace: about R2CCL_RAIL_QUEUE_MS of its own traffic), so when every rail is
  // window-bound (the sender outruns the network or the receiver) the split follows what
  // each rail delivers; a rail that cannot keep up is skipped rather than waited for, so it
  // never sets the pace. Standby rails (backups) take chunks only while no other rail is up.
  bool primary_up = false;
  for (auto& rp : ch.rails)
    if (!rp->standby && rp->state == RailState::kUp && !rp->paused && rp->weight > 0) primary_up = true;
  for (;;) {
    Rail* best = nullptr;
    double best_vt = 0;
    for (auto& rp : ch.rails) {
      Rail& r = *rp;
      if (r.state != RailState::kUp || r.paused || r.cur.active || !r.ctrl.empty()) continue;
      if (r.weight <= 0 || (r.standby && primary_up)) continue;
      const uint64_t chunk = r.pace.chunk();
      if (r.inflight > 0 && r.inflight + chunk > r.pace.window()) continue;
      if (r.hold_until_ns > now) continue;
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
    if (!next_chunk(&c, r.pace.chunk(), now)) return;
    if (c.void_) {
      c.len = 0;
      c.offset = 0;
    }
    if (tell_fences(r, c)) {   // the notices go first; the chunk waits for the next turn
      ch.retx.push_front(std::move(c));
      io_->kick(r.index);
      continue;
    }
    ch.vclock = std::max(ch.vclock, best_vt);
    r.vtime = best_vt + static_cast<double>(std::max<uint32_t>(c.len, 1)) / r.weight;
    // An eager chunk's ack may wait at the receiver: it takes window but measures nothing
    // (neither busy time nor a rate or round-trip sample).
    const bool eager = c.req->eager;
    const bool rated_idle = r.inflight == r.eager_inflight;
    if (r.inflight == 0) r.progress_ns = now;
    if (!eager && rated_idle && c.len > 0) r.busy_since_ns = now;
    if (!eager && c.len > 0) r.pace.on_deal(now, rated_idle);
    c.dealt_ns = now;
    r.inflight += c.len;
    if (eager) r.eager_inflight += c.len;
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
    const uint8_t* payload = c.req->payload() + c.offset;
    if (c.void_) {
      h.flags |= kFlagAbort;
      if (c.req->failed() && c.req->error_cause() == Cause::kMismatch) h.flags |= kFlagAbortMismatch;
    }
    if (eager) h.flags |= kFlagEager;
    // Ask for the ack at the end of the receiver's read pass once per half window dealt, so
    // a rail held by its window always has an asked chunk in flight, and where waiting could
    // hold the send (its last chunk, an abort mark, a resend).
    if (!eager) {
      r.dealt_since_ask += c.len;
      if (c.resend || c.void_ || c.offset + c.len == c.req->len || 2 * r.dealt_since_ask >= r.pace.window()) {
        h.flags |= kFlagAckAsk;
        r.dealt_since_ask = 0;
      }
    }
    if (set_.crc && c.len > 0) {
      h.flags |= kFlagPayloadCrc;
      h.payload_crc = crc32c(payload, c.len);
    }
    r.cur = TxFrame();
    // Where the chunk lands is decided here, once: written into the receive the peer
    // advertised (at its offset, through the key of the peer's NIC on this rail), or in the frame.
    // Only a first deal is written: a resend may be a duplicate of a chunk the receiver already
    // applied, and its write would land after the receive completed (in a buffer its owner
    // may be reusing); in a frame, a duplicate's payload is dropped on arrival.
    c.written = false;
    if (!c.void_ && !c.resend && c.len > 0 && !eager) {
      auto a = ch.adverts.find({c.req->tag, c.req->tag_seq});
      if (a != ch.adverts.end() && c.offset + c.len <= a->second.len &&
          static_cast<size_t>(r.remote_nic) < a->second.keys.size() && a->second.keys[r.remote_nic] != 0 &&
          io_->writes(r.index, *c.req, c.len)) {
        h.flags |= kFlagWritten;
        c.written = true;
        r.cur.written = true;
        r.cur.remote_addr = a->second.addr + c.offset;
        r.cur.remote_key = a->second.keys[r.remote_nic];
      }
    }
    encode_header(h, r.cur.hdr);
    r.cur.req = c.req.get();
    r.cur.payload = payload;
    r.cur.payload_len = c.len;
    r.cur.active = true;
    r.cur.is_data = true;
    r.cur.seq = c.seq;
    R2_TRACE("deal seq %lu len %u to rail %d (inflight %lu)", (unsigned long)c.seq, c.len, r.index, (unsigned long)r.inflight);
    ch.window.emplace(c.seq, std::move(c));
    io_->kick(r.index);
  }
}

void ChannelCore::on_ack(uint64_t first, uint64_t last, int64_t now) {
  for (auto it = ch.window.lower_bound(first); it != ch.window.end() && it->first < last;) {
    Chunk& c = it->second;
    const bool eager = c.req->eager;
    if (c.rail >= 0) {
      Rail& carrier = *ch.rails[static_cast<size_t>(c.rail)];
      // A re-sent copy still queued or half-written on its rail (the first copy arrived and
      // was acknowledged meanwhile): it must not read the send's buffer once the send is done.
      if (carrier.cur.active && carrier.cur.is_data && carrier.cur.seq == it->first) own_payload(carrier);
      carrier.inflight -= std::min<uint64_t>(carrier.inflight, c.len);
      if (eager) carrier.eager_inflight -= std::min<uint64_t>(carrier.eager_inflight, c.len);
      carrier.acked_bytes += c.len;
      const uint64_t rated = carrier.inflight - std::min(carrier.inflight, carrier.eager_inflight);
      if (c.len > 0 && !eager) carrier.pace.on_ack(now, c.len, c.resend ? 0 : c.dealt_ns, rated);
      if (rated == 0 && carrier.busy_since_ns) {
        carrier.busy_ns += now - carrier.busy_since_ns;
        carrier.busy_since_ns = 0;
      }
      carrier.progress_ns = now;
      carrier.last_ack_ns = now;
    }
    auto req = c.req;
    it = ch.window.erase(it);
    if (eager) {
      if (++req->chunks_acked == req->chunks_cut && req->fully_cut) eager_acked(req);
      continue;
    }
    if (req->finished()) continue;
    req->chunks_acked++;
    if (req->fully_cut && req->chunks_acked == req->chunks_cut) {
      req->received = req->len;
      forget_advert(*req);
      req->finish_ok();
      ch.sends.erase(std::remove(ch.sends.begin(), ch.sends.end(), req), ch.sends.end());
    }
  }
}

void ChannelCore::set_weight(int rail, double w, int64_t now) {
  ch.rails[static_cast<size_t>(rail)]->weight = w;
  pump(now);
}

void ChannelCore::set_standby(int rail, bool standby, int64_t now) {
  ch.rails[static_cast<size_t>(rail)]->standby = standby;
  pump(now);
}

// ---------------------------------------------------------------- frames in

bool ChannelCore::on_header(int rail, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  RxFrame& rx = r.rx;
  r.last_rx_ns = now;
  rx.in_payload = true;
  rx.got = 0;
  const FrameHeader& h = rx.h;
  if (h.type != FrameType::kData) {
    rx.ctrl.resize(h.payload_len);
    rx.dest = rx.ctrl.data();
    return true;
  }
  // Decides where a data chunk's payload goes: the receive's buffer, staging, or nowhere.
  rx.scratch = true;
  if (applied(h.seq) || h.payload_len == 0) return true;
  InMsg* m = open_inmsg(h);
  if (m->tag != h.tag || m->tag_seq != h.tag_seq || m->len != h.msg_len) {
    fail_rail(rail, FailReason::kProtocol, "protocol error: chunk disagrees with its message", now);
    return false;
  }
  if (m->discard || m->aborted) return true;
  rx.scratch = false;
  if (h.flags & kFlagWritten) {
    // Already in place, written by the peer into the receive this side advertised: only a
    // chunk of that receive, inside it, may say so (the CRC, if any, is checked on arrival).
    if (m->staged || !m->req || !m->req->advertised || h.offset + h.payload_len > m->req->len) {
      fail_rail(rail, FailReason::kProtocol, "protocol error: a written chunk for memory this side did not advertise",
                now);
      return false;
    }
    rx.dest = m->req->buf + h.offset;
    return true;
  }
  // Another rail is landing a copy of this very chunk (a retransmit racing its original):
  // this one lands aside and is placed if it is the first to pass its checks.
  for (auto& o : ch.rails)
    if (o.get() != &r && o->rx.in_payload && o->rx.h.type == FrameType::kData && o->rx.h.seq == h.seq &&
        !o->rx.scratch) {
      rx.to_side = true;
      rx.side.clear();
      rx.grow = &rx.side;
      rx.dest = nullptr;
      return true;
    }
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
  return true;
}

void ChannelCore::on_frame(int rail, int64_t now) {
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  r.last_rx_ns = now;
  if (r.rx.h.type == FrameType::kData) {
    ch.active_ns = now;   // the peer is sending: not at rest
    ch.resting = false;
    data_frame(r);
  } else {
    control_frame(r, now);
  }
  r.rx.reset();
}

void ChannelCore::rx_pass_end(int rail, int64_t now, bool drained) {
  (void)now;
  Rail& r = *ch.rails[static_cast<size_t>(rail)];
  if (r.state != RailState::kUp) return;
  // Acks the sender asked for, or a pass's worth: at the end of every pass.
  if (r.ack_now || r.rx_unacked >= set_.read_pass_bytes) return flush_acks(r);
  // Read dry: also the acks owed on other rails, and eager chunks' once enough wait; the rest
  // wait (for more, or for the tick).
  if (drained && (!ch.orphan_acks.empty() || r.lazy_bytes >= set_.lazy_ack_bytes || r.lazy_chunks >= kLazyAckChunks))
    flush_acks(r);
}

// Dedup: this sequence number was applied before (its payload must not land again).
bool ChannelCore::applied(uint64_t seq) const {
#if R2CCL_PLANT_FAULT == 1
  if (seq + 1 == ch.rx_cum) return false;
#endif
  return ch.seq_applied(seq);
}

// The receive state of the message a data chunk belongs to, created on its first chunk:
// matched to the posted receive with the same (tag, k-th), or staged until one is posted.
InMsg* ChannelCore::open_inmsg(const FrameHeader& h) {
  auto it = ch.inmsgs.find(h.msg_id);
  if (it != ch.inmsgs.end()) return &it->second;
  InMsg m;
  m.tag = h.tag;
  m.tag_seq = h.tag_seq;
  m.len = h.msg_len;
  m.aborted = (h.flags & kFlagAbort) != 0;
  m.abort_mismatch = m.aborted && (h.flags & kFlagAbortMismatch) != 0;
  auto key = std::make_pair(h.tag, h.tag_seq);
  auto p = ch.posted.find(key);
  if (p != ch.posted.end()) {
    auto req = p->second;
    ch.posted.erase(p);
    if (!req->takes(h.msg_len)) {
      end_request(req, Cause::kMismatch, size_mismatch(peer_name_, h.msg_len, h.tag, req->len));
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

void ChannelCore::data_frame(Rail& r) {
  RxFrame& rx = r.rx;
  const FrameHeader& h = rx.h;
  const bool was_applied = applied(h.seq);
  if (rx.grow) rx.grow->resize(h.payload_len);   // (reads may have left it one step ahead)
  const uint8_t* payload = rx.grow ? rx.grow->data() : rx.dest;
  if (!was_applied && !rx.scratch && (h.flags & kFlagPayloadCrc) &&
      crc32c(payload, h.payload_len) != h.payload_crc) {
    fail_rail(r.index, FailReason::kChecksum, "payload CRC32C mismatch", r.last_rx_ns);
    return;
  }
  if (set_.crc && !(h.flags & kFlagPayloadCrc) && h.payload_len > 0) {
    fail_rail(r.index, FailReason::kProtocol, "protocol error: R2CCL_CRC is on here but the peer sent no checksum",
              r.last_rx_ns);
    return;
  }
  if (!r.acks.empty() && r.acks.back().second == h.seq)
    r.acks.back().second++;
  else
    r.acks.push_back({h.seq, h.seq + 1});
  // A duplicate means the sender re-sent it (it lost its rail or its ack): ack at once.
  if ((h.flags & kFlagEager) && !was_applied) {
    r.lazy_bytes += h.payload_len;
    r.lazy_chunks++;
  } else {
    r.rx_unacked += h.payload_len;
    if (was_applied || (h.flags & kFlagAckAsk)) r.ack_now = true;
  }
  if (was_applied) return;
  ch.mark_applied(h.seq);
  r.rx_bytes += h.payload_len;
  r.rx_chunks++;
  drop_other_copies(h.seq, r.index);
  InMsg* m = open_inmsg(h);
  if (rx.to_side && !rx.scratch && !m->discard && !m->aborted) {
    if (m->staged)
      m->chunks[h.offset] = std::move(rx.side);
    else if (m->req)
      std::memcpy(m->req->buf + h.offset, rx.side.data(), h.payload_len);   // inside: decode_header checked
  }
  if (h.flags & kFlagAbort) {
    m->aborted = true;
    m->abort_mismatch = m->abort_mismatch || (h.flags & kFlagAbortMismatch) != 0;
  }
  m->received += h.payload_len;
  if (m->aborted && m->req) {
    end_request(m->req, abandoned_cause(m->abort_mismatch), abandoned(peer_name_, m->abort_mismatch));
    m->req.reset();
    m->discard = true;
    redirect_to_scratch(h.msg_id);
    return;
  }
  if (!m->aborted && m->received == m->len) {
    // The message is whole: its acks go at the end of this pass (the sender's send completes
    // on them); the cumulative point in the ack frame covers its chunks read on other rails.
    r.ack_now = true;
    finish_inmsg(h.msg_id);
  }
}

void ChannelCore::control_frame(Rail& r, int64_t now) {
  const FrameHeader& h = r.rx.h;
  const std::vector<uint8_t>& body = r.rx.ctrl;
  switch (h.type) {
    case FrameType::kAck: {
      r.last_ack_ns = now;
      for (size_t i = 0; i < h.seq; i++) {
        uint64_t a = load_le64(body.data() + i * kAckRangeBytes);
        uint64_t b = load_le64(body.data() + i * kAckRangeBytes + 8);
        if (a >= b || b > ch.next_seq) {
          fail_rail(r.index, FailReason::kProtocol, "protocol error: ack range outside what was sent", now);
          return;
        }
        on_ack(a, b, now);
      }
      pump(now);
      return;
    }
    case FrameType::kHeartbeat: {
      r.peer_resting = (r.rx.h.flags & kFlagResting) != 0;
      r.ack_now = true;   // the acks that wait go out with the echo (a closing sender asks so)
      queue_heartbeat(r, now, body.data());
      return;
    }
    case FrameType::kHeartbeatAck: {
      r.peer_resting = (r.rx.h.flags & kFlagResting) != 0;
      // Liveness is last_rx_ns; the round trip is a sample for the health monitor and for
      // the window's smallest round trip (RailPace::on_rtt). The echoed clock is our own, so
      // only a value in the past is believed.
      int64_t sent = static_cast<int64_t>(load_le64(body.data() + 8));
      if (sent > 0 && sent <= now && now - sent < 60 * 1000 * kMs) {
        r.rtt_ns = now - sent;
        r.pace.on_rtt(r.rtt_ns);
      }
      return;
    }
    case FrameType::kRailState: {
      uint32_t idx = load_le32(body.data());
      bool up = load_le32(body.data() + 4) != 0;
      if (idx >= ch.rails.size()) {
        fail_rail(r.index, FailReason::kProtocol,
                  "protocol error: rail state for rail " + std::to_string(idx) + " that does not exist", now);
        return;
      }
      Rail& t = *ch.rails[idx];
      if (!up) {
        if (&t != &r && t.state != RailState::kDown)
          fail_rail(t.index, FailReason::kPeerLinkDown, "rank " + std::to_string(ch.peer) + " reports its link down",
                    now);
      } else if (t.state == RailState::kDown) {
        io_->redial(t.index);
      }
      return;
    }
    case FrameType::kAdvert: {
      AdvertBody a;
      const std::string bad = decode_advert(body, &a);
      if (!bad.empty()) {
        fail_rail(r.index, FailReason::kProtocol, "protocol error: " + bad, now);
        return;
      }
      const auto key = std::make_pair(a.tag, a.tag_seq);
      if (!ch.adverts.count(key)) {
        ch.advert_order.push_back(key);
        while (ch.advert_order.size() > kMaxAdverts) {
          ch.adverts.erase(ch.advert_order.front());
          ch.advert_order.pop_front();
        }
      }
      ch.adverts[key] = std::move(a);
      ch.peer_advertises = true;
      pump(now);   // a send that waited for it goes now
      return;
    }
    case FrameType::kBye: {
      // The peer closed its end in order: what it promised is delivered and acknowledged (its
      // close waits for that). Its goodbye follows the acks it owed on each rail, so the channel
      // ends once every up rail has said it (frames still on a sibling are read first);
      // messages that arrived whole stay deliverable, and the peer sees our links close (its
      // own close waits for that, or for its linger).
      R2_INFO("%s said goodbye on %s", peer_name_.c_str(), rail_name(r.index).c_str());
      ch.bye_received = true;
      r.said_bye = true;
      bool all = true;
      for (auto& o : ch.rails) all = all && (o->state != RailState::kUp || o->said_bye);
      if (all) kill(Cause::kPeerGone, peer_name_ + ": the peer closed its end (it said goodbye)");
      return;
    }
    default:
      fail_rail(r.index, FailReason::kProtocol, "protocol error: handshake frame on an established rail", now);
      return;
  }
}

void ChannelCore::finish_inmsg(uint64_t msg_id) {
  auto it = ch.inmsgs.find(msg_id);
  InMsg& m = it->second;
  m.complete = true;
  if (m.discard) {
    ch.inmsgs.erase(it);
    return;
  }
  if (!m.req) return;   // unexpected: waits for its receive
  if (m.staged && m.req->takes(m.len))
    for (auto& [off, v] : m.chunks)
      if (!v.empty()) std::memcpy(m.req->buf + off, v.data(), v.size());   // inside: decode_header checked
  if (!m.req->takes(m.len)) {
    end_request(m.req, Cause::kMismatch, size_mismatch(peer_name_, m.len, m.tag, m.req->len));
  } else {
    m.req->received = m.len;
    m.req->finish_ok();
  }
  redirect_to_scratch(msg_id);
  ch.inmsgs.erase(it);
}

void ChannelCore::drop_other_copies(uint64_t seq, int rail) {
  for (auto& o : ch.rails)
    if (o->index != rail && o->rx.in_payload && o->rx.h.type == FrameType::kData && o->rx.h.seq == seq &&
        !o->rx.scratch) {
      o->rx.scratch = true;
      o->rx.grow = nullptr;
      io_->recv_dropped(o->index);
    }
}

// A message is finished or abandoned: copies still arriving on other rails must not touch
// its buffer any more (the caller may already be reusing it).
void ChannelCore::redirect_to_scratch(uint64_t msg_id) {
  for (auto& o : ch.rails)
    if (o->rx.in_payload && o->rx.h.type == FrameType::kData && o->rx.h.msg_id == msg_id) {
      o->rx.scratch = true;
      o->rx.grow = nullptr;   // its staging is about to go
      io_->recv_dropped(o->index);
    }
}

void ChannelCore::flush_acks(Rail& r) {
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
  r.lazy_bytes = 0;
  r.lazy_chunks = 0;
  r.ack_now = false;
  r.rx_unacked = 0;
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
  if (r.cur.active) io_->kick(r.index);
}

// ---------------------------------------------------------------- requests

void ChannelCore::submit(const std::shared_ptr<Request>& req, int64_t now) {
  ch.active_ns = now;   // no longer at rest: heartbeats at R2CCL_HEARTBEAT_MS again
  ch.resting = false;
  if (ch.dead) {
    if (req->kind == Request::kRecv &&
        ch.unexpected.count({req->tag, !req->tag_once && ch.rx_tag_seq.count(req->tag) ? ch.rx_tag_seq[req->tag] : 0u})) {
      post_recv(req);   // arrived whole before the peer left
      return;
    }
    req->finish_error(ch.dead_cause, ch.dead_msg);
    return;
  }
  if (!ch.undelivered.empty()) {
    // An earlier eager send completed, then could not be delivered: this request says so.
    req->finish_error(Cause::kAllRailsDown, ch.undelivered);
    ch.undelivered.clear();
    return;
  }
  req->posted_ns = now;
  if (req->kind == Request::kSend) {
    req->msg_id = ch.next_msg_id++;
    req->tag_seq = req->tag_once ? 0 : ch.tx_tag_seq[req->tag]++;
    // Eager: the bytes are copied now and the send finishes at once; the copy is what goes
    // out (and again over another rail if one fails) until the peer acknowledges it.
    const bool eager = set_.eager_bytes > 0 && req->len <= set_.eager_bytes &&
                       ch.eager_held + req->len <= set_.eager_held_bytes;
    if (eager) {
      req->eager = true;
      req->copy.assign(req->buf, req->buf + req->len);
      ch.eager_held += req->len;
      ch.eager_sends.push_back(req);
    } else {
      ch.sends.push_back(req);
    }
    ch.sendq.push_back(req);
    pump(now);
    if (eager) {
      req->received = req->len;
      req->finish_ok();
    }
  } else {
    post_recv(req);
  }
}

void ChannelCore::post_recv(const std::shared_ptr<Request>& req) {
  req->tag_seq = req->tag_once ? 0 : ch.rx_tag_seq[req->tag]++;
  auto key = std::make_pair(req->tag, req->tag_seq);
  auto u = ch.unexpected.find(key);
  if (u == ch.unexpected.end()) {
    ch.posted[key] = req;
    advertise(req);
    return;
  }
  uint64_t msg_id = u->second;
  ch.unexpected.erase(u);
  InMsg& m = ch.inmsgs.at(msg_id);
  if (m.aborted) {
    end_request(req, abandoned_cause(m.abort_mismatch), abandoned(peer_name_, m.abort_mismatch));
    m.discard = true;
    return;
  }
  if (!req->takes(m.len)) {
    end_request(req, Cause::kMismatch, size_mismatch(peer_name_, m.len, req->tag, req->len));
    m.discard = true;
    redirect_to_scratch(msg_id);
    m.chunks.clear();
    if (m.complete) ch.inmsgs.erase(msg_id);
    return;
  }
  m.req = req;
  if (m.complete) finish_inmsg(msg_id);
}

// A receive posted before its message began: offered to the peer's one-sided writes when the
// transport can take them, on one up rail (none up: its message goes in frames).
void ChannelCore::advertise(const std::shared_ptr<Request>& req) {
  if (req->len == 0 || ch.dead) return;
  Rail* on = nullptr;
  for (auto& r : ch.rails)
    if (r->state == RailState::kUp && !r->paused && (!on || r->ctrl.size() < on->ctrl.size())) on = r.get();
  if (!on) return;
  AdvertBody a;
  if (!io_->advertise(*req, &a) || a.keys.empty() || a.keys.size() > kMaxAdvertKeys || a.len < req->len) return;
  a.tag = req->tag;
  a.tag_seq = req->tag_seq;
  req->advertised = true;
  queue_ctrl(*on, FrameType::kAdvert, encode_advert(a));
  io_->kick(on->index);
}

void ChannelCore::end_request(const std::shared_ptr<Request>& req, Cause cause, const std::string& why) {
  // A receive that ends before its message was applied whole goes back to its caller while
  // writes of its message may still be on their way: its advertised keys stop working first.
  if (req->kind == Request::kRecv && req->advertised) io_->revoke(*req);
  req->finish_error(cause, why);
}

void ChannelCore::forget_advert(const Request& send) {
  auto key = std::make_pair(send.tag, send.tag_seq);
  if (ch.adverts.erase(key))
    ch.advert_order.erase(std::find(ch.advert_order.begin(), ch.advert_order.end(), key));
}

bool ChannelCore::tell_fences(Rail& r, const Chunk& c) {
  bool told = false;
#if R2CCL_PLANT_FAULT == 3
  return false;   // planted: a chunk written on a failed rail goes again with no fence notice first
#endif
  for (const auto& [rail, downs] : c.fences) {
    auto it = r.fences_told.find(rail);
    if (rail == r.index || (it != r.fences_told.end() && it->second >= downs)) continue;
    r.fences_told[rail] = downs;
    std::vector<uint8_t> body(kRailStateBytes);
    store_le32(body.data(), static_cast<uint32_t>(rail));
    store_le32(body.data() + 4, 0);
    queue_ctrl(r, FrameType::kRailState, std::move(body));
    told = true;
  }
  return told;
}

void ChannelCore::cancel(const std::shared_ptr<Request>& req, Cause cause, const std::string& why, int64_t now) {
  if (req->finished()) return;
  req->cancelled = true;
  std::vector<int> writing;
  if (req->kind == Request::kRecv) {    for (auto p = ch.posted.begin(); p != ch.posted.end();) p = p->second == req ? ch.posted.erase(p) : std::next(p);
    for (auto& [id, m] : ch.inmsgs)
      if (m.req == req) {
        m.req.reset();
        m.discard = true;
        redirect_to_scratch(id);
        m.chunks.clear();
      }
  } else {
    writing = abandon_send(req);
  }
  end_request(req, cause, why);
  // A one-sided write the NIC may still be reading from the caller's buffer: its rail fails now
  // (its link's end goes to error before cancel returns). After the request failed, so that
  // the abort marks this deals say why (kFlagAbortMismatch).
  for (int rail : writing)
    fail_rail(rail, FailReason::kAbandoned, "a one-sided write of a cancelled send was in flight", now);
  pump(now);
}

std::vector<int> ChannelCore::abandon_send(const std::shared_ptr<Request>& req) {
  // Frames being written keep their bytes (copied: the caller gets its buffer back; an
  // eager send's copy stays until acknowledged); unsent chunks become abort marks. A one-sided
  // write the NIC may still be reading from the caller's buffer cannot be copied: its rail is
  // returned, for the caller to fail (its chunk goes again, as an abort mark).
  std::vector<int> writing;
  if (!req->eager)
    for (auto& r : ch.rails)
      if (r->cur.active && r->cur.is_data) {
        auto w = ch.window.find(r->cur.seq);
        if (w == ch.window.end() || w->second.req != req) continue;
        if (r->cur.written) {
          w->second.void_ = true;   // goes again as an abort mark, never from the buffer
          writing.push_back(r->index);
        } else {
          own_payload(*r);
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
    if (c.req == req && !(c.rail >= 0 && ch.rails[static_cast<size_t>(c.rail)]->cur.active &&
                          ch.rails[static_cast<size_t>(c.rail)]->cur.seq == s)) {
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
    req->chunks_cut++;
    ch.sendq.erase(std::remove(ch.sendq.begin(), ch.sendq.end(), req), ch.sendq.end());
  }
  ch.sends.erase(std::remove(ch.sends.begin(), ch.sends.end(), req), ch.sends.end());
  forget_advert(*req);
  return writing;
}

void ChannelCore::own_payload(Rail& r) {
  // A written frame reads registered memory only: acknowledged, its write is done (the header
  // arrives after the payload); a cancelled send's is stopped by failing its rail (cancel).
  if (r.cur.written) return;
  if (r.cur.payload_len == 0 || r.cur.payload == r.cur.owned.data()) return;
  r.cur.owned.assign(r.cur.payload, r.cur.payload + r.cur.payload_len);
  r.cur.payload = r.cur.owned.data();
  io_->payload_moved(r.index);
}

void ChannelCore::eager_acked(const std::shared_ptr<Request>& req) {
  ch.eager_held -= std::min(ch.eager_held, req->len);
  std::vector<uint8_t>().swap(req->copy);
  ch.eager_sends.erase(std::remove(ch.eager_sends.begin(), ch.eager_sends.end(), req), ch.eager_sends.end());
}

void ChannelCore::kill(Cause cause, const std::string& why) {
  if (ch.dead) return;
  ch.dead = true;
  ch.dead_cause = cause;
  ch.dead_msg = why;
  if (!ch.eager_sends.empty())
    ch.dead_msg += " (" + std::to_string(ch.eager_sends.size()) +
                   " eager send(s) that had completed (R2CCL_EAGER_BYTES) were not all acknowledged)";
  R2_LOG(cause == Cause::kClosed || ch.bye_received ? LogLevel::kInfo : LogLevel::kWarn, "channel to %s is dead: %s",
         peer_name_.c_str(), why.c_str());
  for (auto& r : ch.rails) {
    const bool was_up = r->state == RailState::kUp;
    r->state = RailState::kDown;
    r->cur = TxFrame();
    r->ctrl.clear();
    r->rx.reset();
    io_->drop(r->index, was_up);
  }
  for (auto& req : ch.sends) req->finish_error(cause, why);
  // Receives go back to their callers: their advertised keys stop working first (the rails'
  // far ends are fenced already: every link was dropped above).
  for (auto& [k, req] : ch.posted) end_request(req, cause, why);
  for (auto& [id, m] : ch.inmsgs)
    if (m.req) end_request(m.req, cause, why);
  ch.adverts.clear();
  ch.advert_order.clear();
  ch.sends.clear();
  for (auto& req : ch.eager_sends) std::vector<uint8_t>().swap(req->copy);
  ch.eager_sends.clear();
  ch.eager_held = 0;
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

void ChannelCore::tick(int64_t now, const std::vector<int64_t>& nic_drain_ns) {
  if (ch.dead) return;
  const int64_t stall = set_.stall_ns, hb = set_.heartbeat_ns;
  // At rest: nothing posted, queued or unacknowledged either way for rest_heartbeat_ns.
  const bool busy = !ch.sendq.empty() || !ch.retx.empty() || !ch.window.empty() || !ch.sends.empty() ||
                    !ch.eager_sends.empty() || !ch.posted.empty() || !ch.inmsgs.empty();
  if (busy || ch.active_ns == 0) ch.active_ns = now;
  ch.resting = set_.rest_heartbeat_ns > hb && now - ch.active_ns >= set_.rest_heartbeat_ns;
  for (auto& rp : ch.rails) {
    Rail& r = *rp;
    if (r.state != RailState::kUp) continue;
    bool sibling_alive = false;
    for (auto& o : ch.rails)
      if (o.get() != &r && o->state == RailState::kUp && now - o->last_rx_ns < stall) sibling_alive = true;
    // Slow is not dead: the peer gets what the rail's own measured rate needs to drain what
    // it holds, on top of R2CCL_STALL_MS.
    const size_t nic = static_cast<size_t>(r.local_nic);
    const int64_t drain =
        r.inflight > 0 ? r.pace.drain_ns(r.inflight, nic < nic_drain_ns.size() ? nic_drain_ns[nic] : 0) : 0;
    if (r.inflight > 0 && now - r.progress_ns > stall + drain && sibling_alive) {
      r.stalls++;
      fail_rail(r.index, FailReason::kStalled,
                "stalled: " + std::to_string(r.inflight) + " bytes unacknowledged for " +
                    std::to_string((now - r.progress_ns) / kMs) + " ms (its measured drain time: " +
                    std::to_string(drain / kMs) + " ms) while other rails progress",
                now);
    } else if (now - r.last_rx_ns > (r.peer_resting ? std::max(hb, set_.rest_heartbeat_ns) : hb) * set_.heartbeat_misses) {
      fail_rail(r.index, FailReason::kSilent,
                "silent for " + std::to_string((now - r.last_rx_ns) / kMs) + " ms (" +
                    std::to_string(set_.heartbeat_misses) + " heartbeats missed" +
                    (r.peer_resting ? ", the peer at rest" : "") + ")",
                now);
    } else if (now - r.last_tx_ns >= (ch.resting && r.rest_announced ? set_.rest_heartbeat_ns : hb) && !r.cur.active &&
               r.ctrl.empty() && !r.paused) {
      queue_heartbeat(r, now, nullptr);
    }
    if (ch.dead) return;
    // Acks of eager chunks wait at most until here.
    if (r.state == RailState::kUp && !r.paused && !r.acks.empty()) flush_acks(r);
  }
  // The cumulative point may have reached the peer only on a rail that just died: send it
  // on every live rail that has not carried it yet.
  for (auto& rp : ch.rails) {
    Rail& r = *rp;
    if (r.cum_sent < ch.rx_cum) {
      if (r.state != RailState::kUp || r.paused || !r.ctrl.empty()) continue;
      r.cum_sent = ch.rx_cum;
      std::vector<uint8_t> body(kAckRangeBytes);
      store_le64(body.data(), 1);
      store_le64(body.data() + 8, ch.rx_cum);
      queue_ctrl(r, FrameType::kAck, std::move(body), 1);
      io_->kick(r.index);
    }
  }
  if (ch.rails_up() > 0) {
    ch.all_down_since = 0;
    return;
  }
  if (ch.all_down_since == 0) ch.all_down_since = now;
  // Still starting up counts too: a request posted to a peer none of whose rails ever came up
  // (its process never started, or an NCCL listener closed before it accepted) fails after
  // R2CCL_TIMEOUT as one whose rails all went down does (the job's wait_ready fails sooner).
  if (ch.bye_received) {
    kill(Cause::kPeerGone, peer_name_ + ": the peer closed its end (it said goodbye)");
    return;
  }
  expire(now);
  if (!ch.sendq.empty()) pump(now);   // sends whose wait for an advert ran out (awaits_advert)
}

// Every rail has been down: requests older than R2CCL_TIMEOUT (counted from when the last
// rail went down, or from their posting) fail with kAllRailsDown.
void ChannelCore::expire(int64_t now) {
  const int64_t down_ms = (now - ch.all_down_since) / kMs;
  auto one = [&](const std::shared_ptr<Request>& req) {
    int64_t since = std::max(req->posted_ns, ch.all_down_since);
    if (!req->finished() && now - since > set_.timeout_ns) {
      std::string last;
      bool ever_up = false;
      for (auto& r : ch.rails) {
        last += "\n  " + rail_name(r->index) + ": " + (r->last_error.empty() ? "down" : r->last_error);
        ever_up = ever_up || r->ever_up;
      }
      end_request(req, Cause::kAllRailsDown, (ever_up ? "every rail to " + peer_name_ + " has been down for "
                                                      : "no rail to " + peer_name_ + " has come up in ") +
                                                  std::to_string(down_ms) + " ms (R2CCL_TIMEOUT=" +
                                                  std::to_string(static_cast<double>(set_.timeout_ns) / 1e9) +
                                                  " s):" + last);
    }
  };
  for (auto& req : ch.sends) one(req);
  // An eager send finished long ago: it is abandoned (the receiver is told when a rail comes
  // back), and the next request on this channel fails saying so.
  size_t lost = 0;
  std::string first;
  for (auto& req : std::vector<std::shared_ptr<Request>>(ch.eager_sends)) {
    if (req->undeliverable || now - std::max(req->posted_ns, ch.all_down_since) <= set_.timeout_ns) continue;
    req->undeliverable = true;
    abandon_send(req);   // (an eager send: never written)
    if (lost++ == 0)
      first = std::to_string(req->len) + " bytes, tag " + std::to_string(req->tag);
  }
  if (lost > 0) {
    if (!ch.undelivered.empty()) ch.undelivered += "; ";
    ch.undelivered += std::to_string(lost) + " eager send(s) to " + peer_name_ + " (first: " + first +
                      ") completed when copied (R2CCL_EAGER_BYTES) but were never delivered: every rail has been "
                      "down for " + std::to_string(down_ms) + " ms (R2CCL_TIMEOUT=" +
                      std::to_string(static_cast<double>(set_.timeout_ns) / 1e9) + " s)";
  }
  for (auto& [k, req] : ch.posted) one(req);
  for (auto& [id, m] : ch.inmsgs)
    if (m.req) one(m.req);
}

}  // namespace r2ccl
