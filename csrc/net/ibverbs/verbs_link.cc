// A verbs link's data path (verbs_internal.h): frames cut into SENDs of the bounce buffers,
// receives copied out of them, one-sided WRITEs straight from registered memory ahead of their
// frame's header (zero copies: the RC queue pair delivers a WRITE before the SEND posted after
// it), credits, and the completions, async events and bootstrap socket taken into the link's
// state. Set-up, registration and teardown live in their own files.
#if R2CCL_HAVE_IBVERBS

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "net/ibverbs/verbs_internal.h"

namespace r2ccl::verbs {

void VerbsLink::post_send(const SendPost& p) {
  if (posts_.size() >= kSendSlots) return misuse("a send posted with every slot taken");
  Post o;
  std::memcpy(o.hdr, p.header, hb_);
  o.payload = static_cast<const uint8_t*>(p.payload);
  o.cookie = p.cookie;
  if (p.write) {
    if (!p.mr || !at_.dev->keys_of(p.mr->handle, &o.lkey, nullptr))
      return misuse("a write from memory not registered on this link's device");
    if (p.payload_len == 0 || p.payload_len > at_.max_msg) return misuse("a write of no bytes, or more than the port takes");
    o.wlen = p.payload_len;
    o.raddr = p.remote_addr;
    o.rkey = p.remote_key;
    o.write_done = false;
  } else {
    o.len = p.payload_len;
  }
  posts_.push_back(o);
}

LinkCompletion VerbsLink::poll_send(size_t budget) {
  LinkCompletion c;
  progress();
  if (failed() && !(closing_ && rx_deliverable())) return failed_completion();
  if (phase_ != Phase::kUp) return c;
  c.moved = pump_data(budget);
  if (!posts_.empty() && posts_.front().off == hb_ + posts_.front().len && posts_.front().write_done) {
    c.kind = LinkCompletion::kSent;
    c.cookie = posts_.front().cookie;
    posts_.pop_front();
  }
  return_credits();
  update_ready();
  if (failed() && c.kind != LinkCompletion::kSent && !(closing_ && rx_deliverable())) return failed_completion(c.moved);
  return c;
}

bool VerbsLink::move_payload(uint64_t cookie, const void* payload) {
  for (auto& p : posts_)
    if (p.cookie == cookie) {
      if (p.wlen) return false;   // a WRITE reads registered memory: the NIC may be reading it now
      p.payload = static_cast<const uint8_t*>(payload);
    }
  return true;   // what was segmented is in the bounce buffers; the rest is read from the copy
}

LinkCompletion VerbsLink::poll_recv() {
  LinkCompletion c;
  progress();
  if (failed() && !(closing_ && rx_deliverable())) return failed_completion();
  if (phase_ != Phase::kUp) return c;
  if (rs_ == Rx::kHeader && !arrived_.empty()) {
    Seg s = arrived_.front();
    arrived_.pop_front();
    if (!(s.flags & kFirst) || s.len < hb_) {
      repost(s);
      fail(LinkError::kIo, 0, "verbs link: a frame's first segment without its header (protocol error)");
      return failed_completion();
    }
    cur_ = s;
    have_cur_ = true;
    cur_off_ = hb_;
    rs_ = Rx::kAwaitAccept;
    c.kind = LinkCompletion::kHeader;
    c.header = buf(s.buf) + kPrefix;
    c.moved = hb_;
  } else if (rs_ == Rx::kPiece) {
    while (piece_got_ < piece_len_) {
      if (cur_off_ == cur_.len) {
        release_cur();
        if (arrived_.empty()) break;
        cur_ = arrived_.front();
        arrived_.pop_front();
        have_cur_ = true;
        cur_off_ = 0;
        if (cur_.flags & kFirst) {
          fail(LinkError::kIo, 0, "verbs link: a frame ended before its announced length (protocol error)");
          return failed_completion(c.moved);
        }
      }
      const size_t n = std::min<size_t>(piece_len_ - piece_got_, cur_.len - cur_off_);
      if (piece_dst_) {
        std::memcpy(piece_dst_ + piece_got_, buf(cur_.buf) + kPrefix + cur_off_, n);
        copied_.rx += n;
      }
      cur_off_ += n;
      piece_got_ += n;
      c.moved += n;
    }
    if (piece_got_ == piece_len_) {
      frame_left_ -= piece_len_;
      if (frame_left_ == 0) {
        if (cur_off_ != cur_.len) {
          fail(LinkError::kIo, 0, "verbs link: a segment holds more than its frame announced (protocol error)");
          return failed_completion(c.moved);
        }
        release_cur();
        rs_ = Rx::kHeader;
      } else {
        rs_ = Rx::kAwaitPost;
      }
      c.kind = LinkCompletion::kPayload;
      c.bytes = piece_len_;
    }
  }
  return_credits();
  update_ready();
  return c;
}

void VerbsLink::accept_header(size_t payload_len) {
  if (rs_ != Rx::kAwaitAccept) return misuse("accept_header without a header");
  if (payload_len != cur_.frame_len)
    return fail(LinkError::kIo, 0, "frame announced " + std::to_string(payload_len) + " payload bytes, the link carried " +
                                       std::to_string(cur_.frame_len));
  frame_left_ = payload_len;
  if (payload_len == 0) {
    if (cur_off_ != cur_.len)
      return fail(LinkError::kIo, 0, "verbs link: an empty frame's segment holds payload (protocol error)");
    release_cur();
    rs_ = Rx::kHeader;
  } else {
    rs_ = Rx::kAwaitPost;
  }
  update_ready();
}

void VerbsLink::post_recv(void* dst, size_t len, const MemRegion*) {
  if (rs_ != Rx::kAwaitPost || len == 0 || len > frame_left_)
    return misuse("receive space posted that the frame does not expect");
  piece_dst_ = static_cast<uint8_t*>(dst);
  piece_len_ = len;
  piece_got_ = 0;
  rs_ = Rx::kPiece;
  update_ready();
}

bool VerbsLink::drop_recv() {
  if (rs_ == Rx::kPiece) piece_dst_ = nullptr;
  return true;
}

bool VerbsLink::post_receive(uint32_t b) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf(b));
  sge.length = static_cast<uint32_t>(kPrefix + capacity_);
  sge.lkey = mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = b;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(qp_, &wr, &bad)) return sys_fail("ibv_post_recv", e);
  return true;
}

bool VerbsLink::post_write_wr(Post& p) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(p.payload);
  sge.length = static_cast<uint32_t>(p.wlen);
  sge.lkey = p.lkey;
  ibv_send_wr wr{};
  wr.wr_id = kWriteTag | (p.cookie & 0xffffffffu);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = p.raddr;
  wr.wr.rdma.rkey = p.rkey;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(qp_, &wr, &bad)) return sys_fail("ibv_post_send (RDMA WRITE)", e);
  inflight_.push_back(wr.wr_id);
  p.write_posted = true;
  return true;
}

bool VerbsLink::post_send_wr(uint64_t wr_id, uint8_t* addr, size_t len) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(addr);
  sge.length = static_cast<uint32_t>(len);
  sge.lkey = mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(qp_, &wr, &bad)) return sys_fail("ibv_post_send", e);
  returned_ = reposted_;   // every prefix returns what we have reposted
  peer_out_ = false;
  return true;
}

void VerbsLink::write_prefix(uint8_t* p, Kind kind, uint8_t flags, uint32_t len) const {
  p[0] = kind;
  p[1] = flags;
  put16(p + 2, reposted_);
  put32(p + 4, len);
}

size_t VerbsLink::pump_data(size_t budget) {
  size_t moved = 0;
  for (auto& p : posts_) {
    if (p.wlen && !p.write_posted) {   // the payload first, straight from its memory; then the header
      if (failed() || !post_write_wr(p)) return moved;
      moved += p.wlen;
      budget -= std::min(budget, p.wlen);
    }
    const size_t total = hb_ + p.len;
    while (p.off < total) {
      if (budget == 0 || credits_ == 0 || free_send_.empty() || failed()) return moved;
      size_t n = std::min<size_t>({total - p.off, seg_capacity_, budget});
      if (p.off == 0) n = std::max(n, std::min<size_t>(total, std::min<size_t>(seg_capacity_, hb_)));   // the header whole
      const uint32_t b = free_send_.back();
      free_send_.pop_back();
      uint8_t* d = buf(b);
      const uint8_t flags = static_cast<uint8_t>((p.off == 0 ? kFirst : 0) | (credits_ == 1 ? kOut : 0));
      write_prefix(d, kData, flags, p.off == 0 ? static_cast<uint32_t>(p.len) : 0);
      size_t at = p.off, w = 0;
      if (at < hb_) {
        const size_t h = std::min(n, hb_ - at);
        std::memcpy(d + kPrefix, p.hdr + at, h);
        w = h;
        at += h;
      }
      if (w < n) {
        std::memcpy(d + kPrefix + w, p.payload + (at - hb_), n - w);
        copied_.tx += n - w;
      }
      if (!post_send_wr(b, d, kPrefix + n)) return moved;
      inflight_.push_back(b);
      credits_--;
      p.off += n;
      moved += n;
      budget -= std::min(budget, n);
    }
  }
  return moved;
}

void VerbsLink::return_credits() {
  if (phase_ != Phase::kUp || failed()) return;
  const uint16_t owed = static_cast<uint16_t>(reposted_ - returned_);
  if (owed == 0 || (owed < std::max<uint32_t>(1, opt_.recv_buffers / 2) && !peer_out_)) return;
  if (free_ctrl_.empty()) return;   // one goes when a credit message in flight completes
  const uint32_t s = free_ctrl_.back();
  free_ctrl_.pop_back();
  write_prefix(ctrl_slot(s), kCredit, 0, 0);
  if (post_send_wr(kCtrlTag | s, ctrl_slot(s), kPrefix)) inflight_.push_back(kCtrlTag | s);
}

void VerbsLink::repost(const Seg& s) {
  if (post_receive(s.buf)) reposted_++;
}

void VerbsLink::release_cur() {
  if (!have_cur_) return;
  have_cur_ = false;
  repost(cur_);
}

bool VerbsLink::rx_deliverable() const {
  if (rs_ == Rx::kHeader) return !arrived_.empty();
  if (rs_ == Rx::kPiece) return cur_off_ < cur_.len || !arrived_.empty();
  return false;
}

void VerbsLink::update_ready() {
  const bool want = rx_deliverable() || failed();
  if (want == ready_set_) return;
  uint64_t v = 1;
  if (want) (void)!::write(ready_fd_, &v, sizeof v);
  else (void)!::read(ready_fd_, &v, sizeof v);
  ready_set_ = want;
}

void VerbsLink::progress() {
  if (!qp_) return;
  at_.dev->pump();
  {
    uint64_t v;
    if (::read(ready_fd_, &v, sizeof v) == sizeof v) ready_set_ = false;   // a device wake-up, or ours
  }
  if (!failed()) check_device();
  ibv_cq* cq;
  void* ctx;
  while (api_->get_cq_event(ch_, &cq, &ctx) == 0) (cq == scq_ ? scq_events_ : rcq_events_)++;
  if (scq_events_ >= 64) api_->ack_cq_events(scq_, scq_events_), scq_events_ = 0;
  if (rcq_events_ >= 64) api_->ack_cq_events(rcq_, rcq_events_), rcq_events_ = 0;
  ibv_req_notify_cq(scq_, 0);
  ibv_req_notify_cq(rcq_, 0);
  drain(scq_);
  drain(rcq_);
  if (phase_ == Phase::kUp && !closing_) check_bootstrap();
  if (!failed() && phase_ != Phase::kUp && deadline_ns_ && now_ns() > deadline_ns_)
    fail(LinkError::kTimedOut, ETIMEDOUT, "verbs setup not done in time");
}

void VerbsLink::drain(ibv_cq* cq) {
  ibv_wc wc[16];
  for (;;) {
    int n = ibv_poll_cq(cq, 16, wc);
    if (n < 0) {
      fail(LinkError::kIo, 0, "ibv_poll_cq failed");
      return;
    }
    for (int i = 0; i < n; i++) absorb(wc[i]);
    if (n < 16) return;
  }
}

void VerbsLink::absorb(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) return fail_wc(wc);
  if (wc.opcode == IBV_WC_RDMA_WRITE) {
    if (inflight_.empty() || inflight_.front() != wc.wr_id) return fail(LinkError::kIo, 0, "verbs link: a write completion out of order");
    inflight_.pop_front();
    for (auto& p : posts_)
      if (p.wlen && p.write_posted && !p.write_done && (kWriteTag | (p.cookie & 0xffffffffu)) == wc.wr_id) {
        p.write_done = true;
        break;
      }
    return;
  }
  if (wc.opcode == IBV_WC_SEND) {
    if (inflight_.empty() || inflight_.front() != wc.wr_id) return fail(LinkError::kIo, 0, "verbs link: a send completion out of order");
    inflight_.pop_front();
    if (wc.wr_id & kCtrlTag) free_ctrl_.push_back(static_cast<uint32_t>(wc.wr_id & 0xffffffffu));
    else free_send_.push_back(static_cast<uint32_t>(wc.wr_id));
    return;
  }
  if (wc.opcode != IBV_WC_RECV) return;
  const uint32_t b = static_cast<uint32_t>(wc.wr_id);
  if (b < n_send_ || b >= n_send_ + n_recv_ || wc.byte_len < kPrefix) return fail(LinkError::kIo, 0, "verbs link: a runt message");
  const uint8_t* p = buf(b);
  const uint16_t cum = get16(p + 2);
  const uint16_t delta = static_cast<uint16_t>(cum - peer_cum_);
  peer_cum_ = cum;
  credits_ += delta;
  if (credits_ > peer_credits_) return fail(LinkError::kIo, 0, "verbs link: the peer returned more credits than it had");
  Seg s;
  s.buf = b;
  s.len = wc.byte_len - static_cast<uint32_t>(kPrefix);
  s.flags = p[1];
  s.frame_len = get32(p + 4);
  if (p[0] == kCredit) {
    post_receive(b);   // owed to nobody: credit messages use the extra buffers
    return;
  }
  if (p[0] != kData || s.len == 0 || s.len > capacity_) return fail(LinkError::kIo, 0, "verbs link: a malformed segment");
  if (s.flags & kOut) peer_out_ = true;
  arrived_.push_back(s);
}

}  // namespace r2ccl::verbs

#endif  // R2CCL_HAVE_IBVERBS
