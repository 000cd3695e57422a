// A verbs link's set-up (verbs_internal.h): the bootstrap exchange of setup records over the
// TCP stream (net/tcp), the QP made and moved INIT -> RTR -> RTS, and the listener that runs
// each dialler's setup. Nothing of the data path's segments or credits.
#if R2CCL_HAVE_IBVERBS

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/log.h"
#include "net/ibverbs/verbs_internal.h"
#include "net/tcp/stream.h"

namespace r2ccl::verbs {

using tcp::classify_errno;
using tcp::IoResult;

namespace {

std::string mtu_name(uint32_t m) { return std::to_string(128 << m); }

}  // namespace

// ---------------------------------------------------------------- the link's set-up

VerbsLink::VerbsLink(PortRef at, const VerbsOptions& opt, size_t header_bytes,
                     std::unique_ptr<tcp::StreamSocket> boot, bool connector)
    : at_(std::move(at)), api_(at_.dev->api), opt_(opt), hb_(header_bytes), boot_(std::move(boot)),
      connector_(connector) {
  desc_ = "verbs " + at_.dev->name + ":" + std::to_string(at_.port) + " " + boot_->describe();
  if (hb_ == 0 || hb_ > kMaxLinkHeaderBytes)
    throw Error(Cause::kInvalidArgument, -1, "frame header of " + std::to_string(hb_) + " bytes");
  capacity_ = static_cast<uint32_t>(hb_) + opt_.segment_bytes;
  buf_bytes_ = (kPrefix + capacity_ + 63) & ~size_t{63};
  n_send_ = opt_.send_buffers;
  n_recv_ = opt_.recv_buffers + kCtrlBuffers;
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  ready_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || ready_fd_ < 0) throw Error(Cause::kSystem, -1, "epoll/eventfd creation failed");
  watch(ready_fd_, EPOLLIN);
  watch(at_.dev->ctx->async_fd, EPOLLIN);
  watch(boot_->fd(), connector_ ? EPOLLIN | EPOLLOUT : EPOLLIN);
  at_.dev->watch(ready_fd_, at_.port);
  at_.dev->pump();
  std::string why = at_.dev->port_down(at_.port);
  if (why.empty()) at_.dev->query_active(at_.port, &why);
  if (!why.empty()) {
    fail(LinkError::kUnreachable, 0, why);
    return;
  }
  if (!make_qp()) return;
  if (connector_) {
    phase_ = Phase::kConnecting;
    deadline_ns_ = now_ns() + int64_t{opt_.bootstrap_timeout_ms} * 1000000;
  }
}

bool VerbsLink::accept_record(const BootRecord& peer, BootRecord* ours) {
  ours->reject = kRejectNone;
  if (failed()) {
    ours->reject = kRejectQp;
    return false;
  }
  if (peer.header_bytes != hb_) {
    ours->reject = kRejectHeader;
    fail(LinkError::kRefused, 0, "the peer's frame header is " + std::to_string(peer.header_bytes) + " bytes, ours " +
                                     std::to_string(hb_));
    return false;
  }
  *ours = my_record();
  if (!connect_qp(peer)) {
    ours->reject = kRejectQp;
    return false;
  }
  return true;
}

ConnectState VerbsLink::finish_connect() {
  if (failed()) return ConnectState::kFailed;
  if (phase_ == Phase::kUp) return ConnectState::kUp;
  if (now_ns() > deadline_ns_) {
    fail(LinkError::kTimedOut, ETIMEDOUT, "verbs setup with the peer not done in " +
                                              std::to_string(opt_.bootstrap_timeout_ms) + " ms");
    return ConnectState::kFailed;
  }
  if (phase_ == Phase::kConnecting) {
    IoResult r = boot_->finish_connect();
    if (r.kind == IoResult::kWouldBlock) return ConnectState::kPending;
    if (r.kind != IoResult::kOk) {
      fail(classify_errno(r.err), r.err, std::string("connect: ") + std::strerror(r.err));
      return ConnectState::kFailed;
    }
    epoll_ctl_mod(boot_->fd(), EPOLLIN);
    uint8_t b[kBootBytes];
    encode_boot(my_record(), b);
    iovec iov{b, kBootBytes};
    r = boot_->writev(&iov, 1);
    if (r.kind != IoResult::kOk || r.bytes != kBootBytes) {
      fail(LinkError::kIo, r.err, "verbs setup: could not send our record");
      return ConnectState::kFailed;
    }
    phase_ = Phase::kAwaitRecord;
  }
  if (phase_ == Phase::kAwaitRecord) {
    while (boot_got_ < kBootBytes) {
      IoResult r = boot_->read(boot_in_ + boot_got_, kBootBytes - boot_got_);
      if (r.kind == IoResult::kWouldBlock) return ConnectState::kPending;
      if (r.kind == IoResult::kEof) {
        // A socket-backend listener reads our record as a bad hello and closes.
        fail(LinkError::kRefused, 0, "the listener closed the verbs setup (not a verbs listener, or it refused us)");
        return ConnectState::kFailed;
      }
      if (r.kind != IoResult::kOk) {
        fail(classify_errno(r.err), r.err, std::string("verbs setup: ") + std::strerror(r.err));
        return ConnectState::kFailed;
      }
      boot_got_ += r.bytes;
    }
    BootRecord peer;
    std::string bad = decode_boot(boot_in_, &peer);
    if (bad.empty() && peer.reject != kRejectNone)
      bad = peer.reject == kRejectHeader ? "the listener has another frame header size"
                                         : "the listener could not make its queue pair";
    if (!bad.empty()) {
      fail(LinkError::kRefused, 0, "verbs setup: " + bad);
      return ConnectState::kFailed;
    }
    if (!connect_qp(peer)) return ConnectState::kFailed;
    iovec iov{const_cast<uint8_t*>(&kReady), 1};
    IoResult r = boot_->writev(&iov, 1);
    if (r.kind != IoResult::kOk) {
      fail(LinkError::kIo, r.err, "verbs setup: could not send the ready byte");
      return ConnectState::kFailed;
    }
    phase_ = Phase::kUp;
  }
  return ConnectState::kUp;
}

void VerbsLink::watch(int fd, uint32_t events) {
  epoll_event e{};
  e.events = events;
  e.data.fd = fd;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &e);
}

void VerbsLink::epoll_ctl_mod(int fd, uint32_t events) {
  epoll_event e{};
  e.events = events;
  e.data.fd = fd;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &e);
}

bool VerbsLink::make_qp() {
  ch_ = api_->create_comp_channel(at_.dev->ctx);
  if (!ch_) return sys_fail("ibv_create_comp_channel");
  fcntl(ch_->fd, F_SETFL, fcntl(ch_->fd, F_GETFL) | O_NONBLOCK);
  watch(ch_->fd, EPOLLIN);
  scq_ = api_->create_cq(at_.dev->ctx, static_cast<int>(n_send_ + kCtrlBuffers), nullptr, ch_, 0);
  rcq_ = api_->create_cq(at_.dev->ctx, static_cast<int>(n_recv_), nullptr, ch_, 0);
  if (!scq_ || !rcq_) return sys_fail("ibv_create_cq");
  if (!register_buffers()) return false;
  ibv_qp_init_attr qa{};
  qa.send_cq = scq_;
  qa.recv_cq = rcq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = n_send_ + kCtrlBuffers + kSendSlots;   // (one WRITE per post at most)
  qa.cap.max_recv_wr = n_recv_;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qp_ = api_->create_qp(at_.dev->pd, &qa);
  if (!qp_) return sys_fail("ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(at_.port);
  a.qp_access_flags = 0;   // SENDs only until the peer proves itself (trust_peer): no remote access yet
  if (int e = api_->modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return sys_fail("ibv_modify_qp(INIT)", e);
  for (uint32_t i = 0; i < n_send_; i++) free_send_.push_back(i);
  for (uint32_t i = 0; i < kCtrlBuffers; i++) free_ctrl_.push_back(i);
  for (uint32_t i = 0; i < n_recv_; i++)
    if (!post_receive(n_send_ + i)) return false;
  if (ibv_req_notify_cq(scq_, 0) || ibv_req_notify_cq(rcq_, 0)) return sys_fail("ibv_req_notify_cq");
  std::random_device rd;
  psn_ = rd() & 0xffffff;
  return true;
}

BootRecord VerbsLink::my_record() const {
  BootRecord r;
  r.qpn = qp_ ? qp_->qp_num : 0;
  r.psn = psn_;
  r.lid = at_.lid;
  std::memcpy(r.gid, at_.gid.raw, 16);
  r.mtu = at_.mtu;
  r.credits = opt_.recv_buffers;
  r.capacity = capacity_;
  r.header_bytes = static_cast<uint32_t>(hb_);
  return r;
}

bool VerbsLink::connect_qp(const BootRecord& peer) {
  if (peer.header_bytes != hb_) {
    fail(LinkError::kRefused, 0, "verbs setup: the peer's frame header is " + std::to_string(peer.header_bytes) +
                                     " bytes, ours " + std::to_string(hb_));
    return false;
  }
  credits_ = peer.credits;
  peer_credits_ = peer.credits;
  seg_capacity_ = std::min(capacity_, peer.capacity);
  const ibv_mtu mtu = static_cast<ibv_mtu>(std::min<uint32_t>(at_.mtu, peer.mtu));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;   // 0.01 ms: a credit message that found no buffer is resent soon
  a.ah_attr.port_num = static_cast<uint8_t>(at_.port);
  if (at_.roce) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(at_.gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(opt_.traffic_class);
  } else {
    a.ah_attr.dlid = peer.lid;
  }
  if (int e = api_->modify_qp(qp_, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return sys_fail("ibv_modify_qp(RTR)", e);
  ibv_qp_attr b{};
  b.qp_state = IBV_QPS_RTS;
  b.timeout = static_cast<uint8_t>(opt_.timeout);
  b.retry_cnt = static_cast<uint8_t>(opt_.retry_count);
  b.rnr_retry = 7;   // see verbs_transport.h: only credit messages can meet a full receive queue
  b.sq_psn = psn_;
  b.max_rd_atomic = 1;
  if (int e = api_->modify_qp(qp_, &b,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC))
    return sys_fail("ibv_modify_qp(RTS)", e);
  char qps[64];
  std::snprintf(qps, sizeof qps, " qp 0x%x->0x%x mtu %s", qp_->qp_num, peer.qpn, mtu_name(mtu).c_str());
  desc_ += qps;
  return true;
}

// ---------------------------------------------------------------- the listener

namespace {

class VerbsListener final : public FrameListener {
 public:
  VerbsListener(PortRef at, int fd, const Nic& nic, const LinkOptions& lopt, const VerbsOptions& vopt)
      : at_(std::move(at)), fd_(fd), nic_(nic), lopt_(lopt), vopt_(vopt) {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw Error(Cause::kSystem, -1, "epoll_create1 failed");
    add(fd_);
  }
  ~VerbsListener() override {
    ::close(fd_);
    ::close(epfd_);
  }
  int wait_fd() const override { return epfd_; }
  NetAddr local_addr() const override { return tcp::local_addr_of(fd_); }

  // Accepts, reads each dialler's record, answers with ours (QP at RTS) and hands out the
  // link once its ready byte arrives. Setups past bootstrap_timeout_ms are dropped.
  std::unique_ptr<FrameLink> accept() override {
    const int64_t now = now_ns();
    while (pending_.size() < kMaxPending) {
      auto s = tcp::accept_socket(fd_, nic_, lopt_);
      if (!s) break;
      add(s->fd());
      Pending p;
      p.fd = s->fd();
      p.sock = std::move(s);
      p.deadline_ns = now + int64_t{vopt_.bootstrap_timeout_ms} * 1000000;
      pending_.push_back(std::move(p));
    }
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      bool drop = now > p.deadline_ns;
      std::unique_ptr<FrameLink> done;
      if (!drop) drop = !step(p, &done);
      if (done || drop) {
        epoll_ctl(epfd_, EPOLL_CTL_DEL, p.fd, nullptr);
        if (done) {
          pending_.erase(pending_.begin() + static_cast<long>(i));
          return done;
        }
        if (p.link) R2_INFO("verbs setup from %s dropped: %s", p.link->describe().c_str(), p.link->failure().detail.c_str());
        pending_.erase(pending_.begin() + static_cast<long>(i));
        continue;
      }
      i++;
    }
    return nullptr;
  }

 private:
  // Setups in progress at once. Each holds a QP and its bounce buffers (~4.3 MiB pinned)
  // before the peer has proven the job's secret (that happens over the QP), so strangers on
  // the port can pin at most this many, each for at most the setup timeout.
  static constexpr size_t kMaxPending = 16;
  struct Pending {
    std::unique_ptr<tcp::StreamSocket> sock;   // moved into the link once it is made
    std::unique_ptr<VerbsLink> link;
    int fd = -1;                               // the socket's fd, while it or the link holds it
    uint8_t in[kBootBytes] = {};
    size_t got = 0;
    int64_t deadline_ns = 0;
  };

  void add(int fd) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &e);
  }

  // Moves one setup on; false: drop it. *done: the link, up.
  bool step(Pending& p, std::unique_ptr<FrameLink>* done) {
    if (!p.link) {
      while (p.got < kBootBytes) {
        IoResult r = p.sock->read(p.in + p.got, kBootBytes - p.got);
        if (r.kind == IoResult::kWouldBlock) return true;
        if (r.kind != IoResult::kOk) return false;
        p.got += r.bytes;
      }
      BootRecord peer;
      std::string bad = decode_boot(p.in, &peer);
      if (!bad.empty()) {
        R2_INFO("verbs listener %s: rejected a connection: %s", nic_.addr_str().c_str(), bad.c_str());
        return false;
      }
      const int sock_fd = p.fd;
      auto link = std::make_unique<VerbsLink>(at_, vopt_, lopt_.header_bytes, std::move(p.sock), false);
      BootRecord ours;
      link->accept_record(peer, &ours);
      uint8_t b[kBootBytes];
      encode_boot(ours, b);
      ssize_t w = ::send(sock_fd, b, kBootBytes, MSG_NOSIGNAL | MSG_DONTWAIT);
      p.link = std::move(link);
      if (w != static_cast<ssize_t>(kBootBytes) || ours.reject != kRejectNone) return false;
    }
    uint8_t x;
    ssize_t r = ::recv(p.fd, &x, 1, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (r != 1 || x != 'R') return false;
    p.link->set_up();
    *done = std::move(p.link);
    return true;
  }

  PortRef at_;
  int fd_ = -1, epfd_ = -1;
  Nic nic_;
  LinkOptions lopt_;
  VerbsOptions vopt_;
  std::vector<Pending> pending_;
};

}  // namespace

std::unique_ptr<FrameListener> listen_verbs(PortRef at, const Nic& nic, int port, const LinkOptions& lopt,
                                            const VerbsOptions& vopt) {
  return std::make_unique<VerbsListener>(std::move(at), tcp::listen_socket(nic, port, lopt), nic, lopt, vopt);
}

std::unique_ptr<FrameLink> connect_verbs(PortRef at, const Nic& local, const NetAddr& remote,
                                         const LinkOptions& lopt, const VerbsOptions& vopt) {
  return std::make_unique<VerbsLink>(std::move(at), vopt, lopt.header_bytes, tcp::connect_socket(local, remote, lopt),
                                     true);
}

void VerbsLink::trust_peer() {
  if (!qp_ || failed()) return;
  ibv_qp_attr a{};
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;   // into memory registered for it, through advertised keys
  if (int e = api_->modify_qp(qp_, &a, IBV_QP_ACCESS_FLAGS)) sys_fail("ibv_modify_qp(remote write access)", e);
}

}  // namespace r2ccl::verbs

#endif  // R2CCL_HAVE_IBVERBS
