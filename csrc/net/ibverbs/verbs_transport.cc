// The verbs backend (verbs_transport.h): RC queue pairs, frames as SENDs of registered
// bounce buffers, credits, a TCP bootstrap that stays open as the peer-death signal.
#include "net/ibverbs/verbs_transport.h"

#include "base/error.h"
#include "base/log.h"
#include "net/ibverbs/boot_record.h"
#include "net/ibverbs/rdma_ports.h"

namespace r2ccl {

const char* VerbsOptions::problem() const {
  if (gid_index < -1 || gid_index > 255) return "R2CCL_IB_GID_INDEX must be -1 (auto) or 0..255";
  if (timeout < 1 || timeout > 31) return "R2CCL_IB_TIMEOUT must be 1..31";
  if (retry_count < 0 || retry_count > 7) return "R2CCL_IB_RETRY_COUNT must be 0..7";
  if (traffic_class < 0 || traffic_class > 255) return "traffic_class must be 0..255";
  if (segment_bytes < 4096 || segment_bytes > (1u << 24)) return "segment_bytes must be 4 KiB..16 MiB";
  if (send_buffers < 2 || send_buffers > 1024) return "send_buffers must be 2..1024";
  if (recv_buffers < 4 || recv_buffers > 1024) return "recv_buffers must be 4..1024";
  if (bootstrap_timeout_ms < 1) return "bootstrap_timeout_ms must be positive";
  return nullptr;
}

}  // namespace r2ccl

#if !R2CCL_HAVE_IBVERBS

namespace r2ccl {

std::string verbs_unavailable_reason() {
  return "this build of jax_r2ccl has no verbs backend: rdma-core's headers (<infiniband/verbs.h>, Debian's "
         "libibverbs-dev) were not found when it was built; install them and reinstall jax_r2ccl";
}

bool verbs_serves(const Nic&, const VerbsOptions&, const std::vector<RdmaPort>&, std::string* why) {
  if (why) *why = verbs_unavailable_reason();
  return false;
}

std::unique_ptr<Transport> make_verbs_transport(const VerbsOptions&) {
  throw Error(Cause::kSystem, -1, "R2CCL_TRANSPORT=ibverbs: " + verbs_unavailable_reason());
}

std::string gpudirect_report() { return "not built (no verbs backend in this build)"; }

}  // namespace r2ccl

#else

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "net/ibverbs/verbs_api.h"
#include "net/socket/io_threads.h"
#include "net/socket/stream.h"

namespace r2ccl {
namespace {

using socket_detail::classify_errno;
using socket_detail::IoResult;
using socket_detail::StreamSocket;
using namespace r2ccl::verbs;

// ---------------------------------------------------------------- the link's own format

// Every SEND starts with this prefix: kind (u8), flags (u8), credits (u16: the data buffers
// its sender has reposted so far, mod 2^16), length (u32: on a frame's first segment, the
// frame's payload length; else 0). Little-endian.
constexpr size_t kPrefix = 8;
enum Kind : uint8_t { kData = 1, kCredit = 2 };
constexpr uint8_t kFirst = 1;   // the segment starts a frame (its header comes first)
constexpr uint8_t kOut = 2;     // the sender spent its last credit: return credits at once
// Receive buffers beyond the data credits, for credit-only messages (reposted at once, owed
// to nobody), and the most credit-only messages one side has in flight.
constexpr uint32_t kCtrlBuffers = 4;
constexpr size_t kCtrlSlotBytes = 64;
constexpr uint64_t kCtrlTag = 1ull << 32;     // wr_id of a credit-only SEND: kCtrlTag | slot

static_assert(IBV_MTU_256 == kBootMtuMin && IBV_MTU_4096 == kBootMtuMax, "boot_record.h's MTU range is ibv_mtu's");

std::string mtu_name(uint32_t m) { return std::to_string(128 << m); }

// ---------------------------------------------------------------- devices

// One opened device: context, protection domain, the state of its ports as the async
// events tell it, and the links to wake when they change. Shared by the transport and its
// links (a link keeps its device open).
struct Device {
  const VerbsApi* api = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  std::string name;
  ibv_device_attr attr{};

  std::mutex mu;
  std::map<int, bool> port_active;          // by port number, as last seen
  std::map<int, std::string> port_why;      // why a port is down (the event or state seen)
  std::set<uint32_t> dead_qps;              // QPs an async event declared in error
  std::map<int, int> watchers;              // eventfd -> port: links to wake on a change

  ~Device() {
    {
      std::lock_guard<std::mutex> g(reap_mu);
      reap_stop = true;
    }
    reap_cv.notify_one();
    if (reaper.joinable()) reaper.join();   // every retired link's resources are released first
    if (pd) api->dealloc_pd(pd);
    if (ctx) api->close_device(ctx);
  }

  // Releases a dead link's verbs resources on the device's own thread, not the caller's.
  // Destroying a QP can block in the kernel: Soft-RoCE (Debian's 6.1 kernel) took 3.1 s for
  // a QP whose port had just gone down, and the link dies on the progress thread, which
  // carries every other rail: that froze the job's surviving rails for 3 s, and the peer
  // failed them as silent. The thread starts at the first retire(); the destructor waits
  // for it. If it cannot start, the job runs here, as before.
  void retire(std::function<void()> job) {
    std::unique_lock<std::mutex> g(reap_mu);
    if (!reaper.joinable()) {
      try {
        reaper = std::thread([this] { reap(); });
      } catch (const std::system_error&) {
        g.unlock();
        job();
        return;
      }
    }
    reap_jobs.push_back(std::move(job));
    g.unlock();
    reap_cv.notify_one();
  }

 private:
  std::mutex reap_mu;
  std::condition_variable reap_cv;
  std::deque<std::function<void()>> reap_jobs;
  bool reap_stop = false;
  std::thread reaper;

  void reap() {
    name_this_thread("r2ccl-verbs-reap");
    std::unique_lock<std::mutex> g(reap_mu);
    for (;;) {
      reap_cv.wait(g, [this] { return reap_stop || !reap_jobs.empty(); });
      if (reap_jobs.empty()) return;   // stopping, and nothing is left to release
      std::function<void()> job = std::move(reap_jobs.front());
      reap_jobs.pop_front();
      g.unlock();
      job();
      g.lock();
    }
  }

 public:

  bool query_active(int port, std::string* why) {
    ibv_port_attr pa{};
    if (api->query_port(ctx, static_cast<uint8_t>(port), &pa) != 0) {
      *why = name + ":" + std::to_string(port) + ": ibv_query_port failed";
      return false;
    }
    const bool up = pa.state == IBV_PORT_ACTIVE || pa.state == IBV_PORT_ACTIVE_DEFER;
    if (!up) *why = "RDMA port " + name + ":" + std::to_string(port) + " is not ACTIVE (state " +
                    std::to_string(static_cast<int>(pa.state)) + ")";
    return up;
  }

  // Takes every async event waiting on the device's fd (nonblocking) into the port and QP
  // state, waking the links concerned. Any thread; cheap when nothing waits.
  void pump() {
    std::lock_guard<std::mutex> g(mu);
    ibv_async_event ev;
    while (api->get_async_event(ctx, &ev) == 0) {
      std::vector<int> wake;
      const char* what = api->event_type_str(ev.event_type);
      switch (ev.event_type) {
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_PORT_ACTIVE: {
          const int port = ev.element.port_num;
          const bool up = ev.event_type == IBV_EVENT_PORT_ACTIVE;
          port_active[port] = up;
          char at[32];
          std::snprintf(at, sizeof at, "%.3f", unix_time_s());
          port_why[port] = up ? "" : "RDMA port " + name + ":" + std::to_string(port) +
                                         " went down (IBV_EVENT_PORT_ERR at unix time " + at + ")";
          R2_INFO("RDMA %s:%d: %s", name.c_str(), port, what);
          for (auto& [fd, p] : watchers)
            if (p == port) wake.push_back(fd);
          break;
        }
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
          dead_qps.insert(ev.element.qp->qp_num);
          R2_INFO("RDMA %s: QP 0x%x: %s", name.c_str(), ev.element.qp->qp_num, what);
          for (auto& [fd, p] : watchers) wake.push_back(fd);
          break;
        case IBV_EVENT_DEVICE_FATAL:
          for (auto& [p, up] : port_active) {
            up = false;
            port_why[p] = "RDMA device " + name + " failed (IBV_EVENT_DEVICE_FATAL)";
          }
          R2_WARN("RDMA %s: %s", name.c_str(), what);
          for (auto& [fd, p] : watchers) wake.push_back(fd);
          break;
        default:
          R2_TRACE("RDMA %s: async event %s", name.c_str(), what);
          break;
      }
      api->ack_async_event(&ev);
      for (int fd : wake) {
        uint64_t one = 1;
        (void)!::write(fd, &one, sizeof one);
      }
    }
  }

  // "" while the port is usable; else why not.
  std::string port_down(int port) {
    std::lock_guard<std::mutex> g(mu);
    auto it = port_active.find(port);
    if (it == port_active.end() || it->second) return "";
    return port_why[port];
  }
  bool qp_dead(uint32_t qpn) {
    std::lock_guard<std::mutex> g(mu);
    return dead_qps.count(qpn) != 0;
  }
  void watch(int fd, int port) {
    std::lock_guard<std::mutex> g(mu);
    watchers[fd] = port;
  }
  void unwatch(int fd) {
    std::lock_guard<std::mutex> g(mu);
    watchers.erase(fd);
  }
};

// Where a link's NIC is served: a device, a port and a GID index.
struct PortRef {
  std::shared_ptr<Device> dev;
  int port = 0;
  int gid_index = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  bool roce = true;
};

// ---------------------------------------------------------------- the link

class VerbsLink final : public FrameLink {
 public:
  // A connector (its bootstrap socket is connecting) or an accepted link (its socket is
  // connected and the connector's record is in `peer`, already checked).
  VerbsLink(PortRef at, const VerbsOptions& opt, size_t header_bytes, std::unique_ptr<StreamSocket> boot,
            bool connector)
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

  ~VerbsLink() override {
    at_.dev->unwatch(ready_fd_);
    if (epfd_ >= 0) ::close(epfd_);
    if (ready_fd_ >= 0) ::close(ready_fd_);
    // The QP, CQs, channel and registered memory go on the device's thread (Device::retire):
    // nothing else refers to them (frames were copied into mem_, which dies with them).
    at_.dev->retire([api = api_, qp = qp_, scq = scq_, scq_events = scq_events_, rcq = rcq_,
                     rcq_events = rcq_events_, ch = ch_, mr = mr_, mem = mem_, desc = desc_] {
      const int64_t t0 = now_ns();
      if (qp) api->destroy_qp(qp);
      const int64_t t1 = now_ns();
      if (scq) {
        if (scq_events) api->ack_cq_events(scq, scq_events);
        api->destroy_cq(scq);
      }
      if (rcq) {
        if (rcq_events) api->ack_cq_events(rcq, rcq_events);
        api->destroy_cq(rcq);
      }
      if (ch) api->destroy_comp_channel(ch);
      const int64_t t2 = now_ns();
      if (mr) api->dereg_mr(mr);
      std::free(mem);
      const int64_t t3 = now_ns();
      if (t3 - t0 > 10000000)
        R2_INFO("%s: teardown took %.0f ms (QP %.0f, CQs %.0f, MR %.0f), off the progress thread", desc.c_str(),
                (t3 - t0) / 1e6, (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6);
    });
  }

  // The accepting side: our record for the connector (our QP moved to RTS against theirs).
  bool accept_record(const BootRecord& peer, BootRecord* ours) {
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
  void set_up() { phase_ = Phase::kUp; }

  // ---- FrameLink
  int wait_fd() const override { return epfd_; }
  bool needs_writable_watch() const override { return false; }

  ConnectState finish_connect() override {
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

  size_t send_slots() const override { return kSendSlots; }

  void post_send(const SendPost& p) override {
    if (posts_.size() >= kSendSlots) return misuse("a send posted with every slot taken");
    Post o;
    std::memcpy(o.hdr, p.header, hb_);
    o.payload = static_cast<const uint8_t*>(p.payload);
    o.len = p.payload_len;
    o.cookie = p.cookie;
    posts_.push_back(o);
  }

  LinkCompletion poll_send(size_t budget) override {
    LinkCompletion c;
    progress();
    if (failed() && !(closing_ && rx_deliverable())) return failed_completion();
    if (phase_ != Phase::kUp) return c;
    c.moved = pump_data(budget);
    if (!posts_.empty() && posts_.front().off == hb_ + posts_.front().len) {
      c.kind = LinkCompletion::kSent;
      c.cookie = posts_.front().cookie;
      posts_.pop_front();
    }
    return_credits();
    update_ready();
    if (failed() && c.kind != LinkCompletion::kSent && !(closing_ && rx_deliverable())) return failed_completion(c.moved);
    return c;
  }

  size_t head_sent() const override { return posts_.empty() ? 0 : posts_.front().off; }
  bool send_blocked() const override { return false; }

  bool move_payload(uint64_t cookie, const void* payload) override {
    for (auto& p : posts_)
      if (p.cookie == cookie) p.payload = static_cast<const uint8_t*>(payload);
    return true;   // what was segmented is in the bounce buffers; the rest is read from the copy
  }

  LinkCompletion poll_recv() override {
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
        if (piece_dst_) std::memcpy(piece_dst_ + piece_got_, buf(cur_.buf) + kPrefix + cur_off_, n);
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

  void accept_header(size_t payload_len) override {
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

  void post_recv(void* dst, size_t len, const MemRegion*) override {
    if (rs_ != Rx::kAwaitPost || len == 0 || len > frame_left_)
      return misuse("receive space posted that the frame does not expect");
    piece_dst_ = static_cast<uint8_t*>(dst);
    piece_len_ = len;
    piece_got_ = 0;
    rs_ = Rx::kPiece;
    update_ready();
  }

  bool drop_recv() override {
    if (rs_ == Rx::kPiece) piece_dst_ = nullptr;
    return true;
  }

  const LinkFailure& failure() const override { return failure_; }

  void shutdown() override {
    boot_->shutdown();
    if (qp_) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      api_->modify_qp(qp_, &a, IBV_QP_STATE);
    }
  }

  std::string describe() const override { return desc_; }

 private:
  enum class Phase { kSetup, kConnecting, kAwaitRecord, kUp };
  enum class Rx { kHeader, kAwaitAccept, kAwaitPost, kPiece };
  static constexpr size_t kSendSlots = 4;
  static constexpr uint8_t kReady = 'R';
  struct Post {
    uint8_t hdr[kMaxLinkHeaderBytes];
    const uint8_t* payload = nullptr;
    size_t len = 0;
    size_t off = 0;   // header and payload bytes segmented
    uint64_t cookie = 0;
  };
  struct Seg {
    uint32_t buf = 0;        // receive buffer index
    uint32_t len = 0;        // bytes after the prefix
    uint8_t flags = 0;
    uint32_t frame_len = 0;  // kFirst: the frame's payload length
  };

  uint8_t* buf(uint32_t i) const { return mem_ + size_t{i} * buf_bytes_; }   // send: [0, n_send_), receive after
  uint8_t* ctrl_slot(uint32_t i) const { return mem_ + size_t{n_send_ + n_recv_} * buf_bytes_ + i * kCtrlSlotBytes; }

  void watch(int fd, uint32_t events) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &e);
  }
  void epoll_ctl_mod(int fd, uint32_t events) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &e);
  }

  // CQs on one completion channel, the RC QP in INIT, the bounce buffers registered and every
  // receive posted (so the peer may SEND the moment our record reaches it).
  bool make_qp() {
    ch_ = api_->create_comp_channel(at_.dev->ctx);
    if (!ch_) return sys_fail("ibv_create_comp_channel");
    fcntl(ch_->fd, F_SETFL, fcntl(ch_->fd, F_GETFL) | O_NONBLOCK);
    watch(ch_->fd, EPOLLIN);
    scq_ = api_->create_cq(at_.dev->ctx, static_cast<int>(n_send_ + kCtrlBuffers), nullptr, ch_, 0);
    rcq_ = api_->create_cq(at_.dev->ctx, static_cast<int>(n_recv_), nullptr, ch_, 0);
    if (!scq_ || !rcq_) return sys_fail("ibv_create_cq");
    const size_t bytes = size_t{n_send_ + n_recv_} * buf_bytes_ + kCtrlBuffers * kCtrlSlotBytes;
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095}));
    if (!mem_) return sys_fail("bounce buffer allocation");
    mr_ = api_->reg_mr(at_.dev->pd, mem_, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!mr_) return sys_fail("ibv_reg_mr of " + std::to_string(bytes) + " bytes of bounce buffers (RLIMIT_MEMLOCK?)");
    ibv_qp_init_attr qa{};
    qa.send_cq = scq_;
    qa.recv_cq = rcq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = n_send_ + kCtrlBuffers;
    qa.cap.max_recv_wr = n_recv_;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    qp_ = api_->create_qp(at_.dev->pd, &qa);
    if (!qp_) return sys_fail("ibv_create_qp");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<uint8_t>(at_.port);
    a.qp_access_flags = 0;   // SENDs only: no remote access to anything of ours
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

  BootRecord my_record() const {
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

  // RTR against the peer's record, then RTS.
  bool connect_qp(const BootRecord& peer) {
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
    b.rnr_retry = 7;   // see the header: only credit messages can meet a full receive queue
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

  bool post_receive(uint32_t b) {
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

  bool post_send_wr(uint64_t wr_id, uint8_t* addr, size_t len) {
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

  void write_prefix(uint8_t* p, Kind kind, uint8_t flags, uint32_t len) const {
    p[0] = kind;
    p[1] = flags;
    put16(p + 2, reposted_);
    put32(p + 4, len);
  }

  // Segments the posts in order while credits, bounce buffers and `budget` last.
  size_t pump_data(size_t budget) {
    size_t moved = 0;
    for (auto& p : posts_) {
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
        if (w < n) std::memcpy(d + kPrefix + w, p.payload + (at - hb_), n - w);
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

  // A credit-only message when half the credits are owed, or any are and the peer ran out.
  void return_credits() {
    if (phase_ != Phase::kUp || failed()) return;
    const uint16_t owed = static_cast<uint16_t>(reposted_ - returned_);
    if (owed == 0 || (owed < std::max<uint32_t>(1, opt_.recv_buffers / 2) && !peer_out_)) return;
    if (free_ctrl_.empty()) return;   // one goes when a credit message in flight completes
    const uint32_t s = free_ctrl_.back();
    free_ctrl_.pop_back();
    write_prefix(ctrl_slot(s), kCredit, 0, 0);
    if (post_send_wr(kCtrlTag | s, ctrl_slot(s), kPrefix)) inflight_.push_back(kCtrlTag | s);
  }

  void repost(const Seg& s) {
    if (post_receive(s.buf)) reposted_++;
  }
  void release_cur() {
    if (!have_cur_) return;
    have_cur_ = false;
    repost(cur_);
  }

  bool rx_deliverable() const {
    if (rs_ == Rx::kHeader) return !arrived_.empty();
    if (rs_ == Rx::kPiece) return cur_off_ < cur_.len || !arrived_.empty();
    return false;
  }
  // The eventfd in our epoll set is readable exactly while a poll would hand something out.
  void update_ready() {
    const bool want = rx_deliverable() || failed();
    if (want == ready_set_) return;
    uint64_t v = 1;
    if (want) (void)!::write(ready_fd_, &v, sizeof v);
    else (void)!::read(ready_fd_, &v, sizeof v);
    ready_set_ = want;
  }

  // Async events, completions, and the bootstrap socket, into the link's state.
  void progress() {
    if (!qp_) return;
    at_.dev->pump();
    {
      uint64_t v;
      if (::read(ready_fd_, &v, sizeof v) == sizeof v) ready_set_ = false;   // a device wake-up, or ours
    }
    if (!failed()) {
      std::string why = at_.dev->port_down(at_.port);
      if (!why.empty()) fail(LinkError::kUnreachable, 0, why);
      else if (at_.dev->qp_dead(qp_->qp_num)) fail(LinkError::kIo, 0, "the QP was put in error by the device (async event)");
    }
    ibv_cq* cq;
    void* ctx;
    while (api_->get_cq_event(ch_, &cq, &ctx) == 0) (cq == scq_ ? scq_events_ : rcq_events_)++;
    if (scq_events_ >= 64) api_->ack_cq_events(scq_, scq_events_), scq_events_ = 0;
    if (rcq_events_ >= 64) api_->ack_cq_events(rcq_, rcq_events_), rcq_events_ = 0;
    ibv_req_notify_cq(scq_, 0);
    ibv_req_notify_cq(rcq_, 0);
    drain(scq_);
    drain(rcq_);
    if (phase_ == Phase::kUp && !closing_) {
      uint8_t x;
      ssize_t r = ::recv(boot_->fd(), &x, 1, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        closing_ = true;
        fail(LinkError::kClosedByPeer, r < 0 ? errno : 0, "connection closed by the peer (its verbs bootstrap socket ended)");
      } else if (r > 0) {
        fail(LinkError::kIo, 0, "verbs link: unexpected bytes on the bootstrap socket");
      }
    }
    if (!failed() && phase_ != Phase::kUp && deadline_ns_ && now_ns() > deadline_ns_)
      fail(LinkError::kTimedOut, ETIMEDOUT, "verbs setup not done in time");
  }

  void drain(ibv_cq* cq) {
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

  void absorb(const ibv_wc& wc) {
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status == IBV_WC_WR_FLUSH_ERR) {
        fail(closing_ ? LinkError::kClosedByPeer : LinkError::kIo, wc.status, "work request flushed: the QP is in error");
      } else {
        fail(wc.status == IBV_WC_RETRY_EXC_ERR ? LinkError::kTimedOut : LinkError::kIo, wc.status,
             std::string("work completion: ") + api_->wc_status_str(wc.status) + " (wc status " +
                 std::to_string(static_cast<int>(wc.status)) + ")");
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

  bool sys_fail(const std::string& what, int e = 0) {
    const int err = e ? e : errno;
    fail(LinkError::kIo, err, what + " failed on " + at_.dev->name + ":" + std::to_string(at_.port) +
                                  (err ? std::string(": ") + std::strerror(err) : std::string()));
    return false;
  }
  bool failed() const { return failure_.error != LinkError::kNone; }
  void fail(LinkError e, int err, std::string detail) {
    if (failed()) return;
    failure_.error = e;
    failure_.sys_error = err;
    failure_.detail = std::move(detail);
    R2_TRACE("%s: %s", desc_.c_str(), failure_.detail.c_str());
    update_ready();
  }
  void misuse(const char* what) { fail(LinkError::kIo, 0, std::string("transport misuse: ") + what); }
  static LinkCompletion failed_completion(size_t moved = 0) {
    LinkCompletion c;
    c.kind = LinkCompletion::kFailed;
    c.moved = moved;
    return c;
  }

  PortRef at_;
  const VerbsApi* api_;
  VerbsOptions opt_;
  size_t hb_;
  std::unique_ptr<StreamSocket> boot_;
  bool connector_;
  std::string desc_;
  LinkFailure failure_;
  Phase phase_ = Phase::kSetup;
  int64_t deadline_ns_ = 0;
  uint8_t boot_in_[kBootBytes] = {};
  size_t boot_got_ = 0;
  bool closing_ = false;   // the bootstrap socket ended: what arrived is still handed out

  int epfd_ = -1, ready_fd_ = -1;
  bool ready_set_ = false;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq *scq_ = nullptr, *rcq_ = nullptr;
  unsigned scq_events_ = 0, rcq_events_ = 0;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  uint8_t* mem_ = nullptr;
  uint32_t psn_ = 0;
  uint32_t capacity_ = 0, seg_capacity_ = 0;
  size_t buf_bytes_ = 0;
  uint32_t n_send_ = 0, n_recv_ = 0;

  // send
  std::deque<Post> posts_;
  std::vector<uint32_t> free_send_, free_ctrl_;
  std::deque<uint64_t> inflight_;   // wr_ids of the SENDs in flight, in post order
  uint32_t credits_ = 0, peer_credits_ = 0;
  uint16_t peer_cum_ = 0;            // the peer's reposted count, as last seen
  // receive
  std::deque<Seg> arrived_;
  Seg cur_;
  bool have_cur_ = false;
  size_t cur_off_ = 0;
  Rx rs_ = Rx::kHeader;
  size_t frame_left_ = 0;
  uint8_t* piece_dst_ = nullptr;
  size_t piece_len_ = 0, piece_got_ = 0;
  uint16_t reposted_ = 0, returned_ = 0;   // data buffers reposted; the count our last SEND carried
  bool peer_out_ = false;
};

// ---------------------------------------------------------------- the registry of devices

class Devices {
 public:
  explicit Devices(const VerbsApi* api) : api_(api) {}

  // The device, port and GID serving `nic`; throws Error(kSystem) naming the NIC. The sysfs
  // map is read once per NIC and kept: a NIC's rails are re-dialled every R2CCL_REPROBE_MS
  // while its port is down, and a scan of the GID tables costs tens of ms under emulation.
  // Whether the port is up comes from the port events and ibv_query_port, not from the map.
  PortRef port_for(const Nic& nic, const VerbsOptions& opt) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = by_nic_.find(nic.addr_str());
      if (it != by_nic_.end()) return it->second;
    }
    RdmaPort rp;
    int gid = 0;
    std::string why;
    if (!rdma_port_for(nic, rdma_ports(), opt.gid_index, &rp, &gid, &why))
      throw Error(Cause::kSystem, -1, "NIC " + nic.name + " has no RDMA port: " + why);
    PortRef ref;
    ref.dev = open(rp.device);
    ref.port = rp.port;
    ref.gid_index = gid;
    ref.roce = rp.link_layer != "InfiniBand";
    ibv_port_attr pa{};
    if (api_->query_port(ref.dev->ctx, static_cast<uint8_t>(rp.port), &pa) != 0)
      throw Error(Cause::kSystem, -1, "ibv_query_port(" + rp.device + ":" + std::to_string(rp.port) + ") failed");
    if (api_->query_gid(ref.dev->ctx, static_cast<uint8_t>(rp.port), gid, &ref.gid) != 0)
      throw Error(Cause::kSystem, -1, "ibv_query_gid(" + rp.device + ":" + std::to_string(rp.port) + ", " +
                                          std::to_string(gid) + ") failed");
    ref.lid = pa.lid;
    ref.mtu = pa.active_mtu;
    std::lock_guard<std::mutex> g(mu_);
    by_nic_[nic.addr_str()] = ref;
    return ref;
  }

 private:
  std::shared_ptr<Device> open(const std::string& name) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = open_.find(name);
    if (it != open_.end()) return it->second;
    int n = 0;
    ibv_device** list = api_->get_device_list(&n);
    if (!list) throw Error(Cause::kSystem, -1, std::string("ibv_get_device_list failed: ") + std::strerror(errno));
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n && !ctx; i++)
      if (name == api_->get_device_name(list[i])) ctx = api_->open_device(list[i]);
    api_->free_device_list(list);
    if (!ctx) throw Error(Cause::kSystem, -1, "RDMA device " + name + " could not be opened");
    auto d = std::make_shared<Device>();
    d->api = api_;
    d->ctx = ctx;
    d->name = name;
    d->pd = api_->alloc_pd(ctx);
    if (!d->pd) throw Error(Cause::kSystem, -1, "ibv_alloc_pd on " + name + " failed");
    api_->query_device(ctx, &d->attr);
    fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
    open_[name] = d;
    return d;
  }

  const VerbsApi* api_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Device>> open_;
  std::map<std::string, PortRef> by_nic_;   // by the NIC's IPv4 address
};

// ---------------------------------------------------------------- listener and transport

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
  NetAddr local_addr() const override { return socket_detail::local_addr_of(fd_); }

  // Accepts, reads each dialler's record, answers with ours (QP at RTS) and hands out the
  // link once its ready byte arrives. Setups past bootstrap_timeout_ms are dropped.
  std::unique_ptr<FrameLink> accept() override {
    const int64_t now = now_ns();
    while (pending_.size() < kMaxPending) {
      auto s = socket_detail::accept_socket(fd_, nic_, lopt_);
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
    std::unique_ptr<StreamSocket> sock;   // moved into the link once it is made
    std::unique_ptr<VerbsLink> link;
    int fd = -1;                          // the socket's fd, while it or the link holds it
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

class VerbsTransport final : public Transport {
 public:
  VerbsTransport(const VerbsApi* api, const VerbsOptions& opt) : devices_(api), opt_(opt) {}
  const char* name() const override { return "ibverbs"; }
  std::unique_ptr<FrameListener> listen(const Nic& nic, int port, const LinkOptions& opt) override {
    PortRef at = devices_.port_for(nic, opt_);
    return std::make_unique<VerbsListener>(std::move(at), socket_detail::listen_socket(nic, port, opt), nic, opt, opt_);
  }
  std::unique_ptr<FrameLink> connect(const Nic& local, const NetAddr& remote, const LinkOptions& opt) override {
    PortRef at = devices_.port_for(local, opt_);
    return std::make_unique<VerbsLink>(std::move(at), opt_, opt.header_bytes,
                                       socket_detail::connect_socket(local, remote, opt), true);
  }
  // Registration: the seam's defaults (none). Posts are copied into the link's own
  // registered buffers, so nothing of the caller's needs a key.

 private:
  Devices devices_;
  VerbsOptions opt_;
};

}  // namespace

std::string verbs_unavailable_reason() {
  std::string why;
  const VerbsApi* api = verbs_api(&why);
  if (!api) return why;
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  if (list) api->free_device_list(list);
  if (!list || n == 0) return "libibverbs found no RDMA device on this host";
  return "";
}

std::string gpudirect_report() {
  std::string why;
  const VerbsApi* api = verbs_api(&why);
  const bool peermem = access("/sys/module/nvidia_peermem", F_OK) == 0;
  std::string s = "not used (frames are staged through host bounce buffers); this host has: ";
  s += api ? (api->reg_dmabuf_mr ? "ibv_reg_dmabuf_mr in libibverbs" : "no ibv_reg_dmabuf_mr in libibverbs")
           : "no libibverbs";
  s += peermem ? ", nvidia_peermem loaded" : ", no nvidia_peermem module";
  return s;
}

bool verbs_serves(const Nic& nic, const VerbsOptions& opt, const std::vector<RdmaPort>& ports, std::string* why) {
  std::string w = verbs_unavailable_reason();
  RdmaPort rp;
  int gid = 0;
  if (w.empty() && rdma_port_for(nic, ports, opt.gid_index, &rp, &gid, &w) && !rp.active())
    w = "RDMA port " + rp.device + ":" + std::to_string(rp.port) + " of NIC " + nic.name + " is " + rp.state_name;
  if (why) *why = w;
  return w.empty();
}

std::unique_ptr<Transport> make_verbs_transport(const VerbsOptions& opt) {
  if (const char* bad = opt.problem()) throw Error(Cause::kInvalidArgument, -1, bad);
  std::string why = verbs_unavailable_reason();
  if (!why.empty()) throw Error(Cause::kSystem, -1, "R2CCL_TRANSPORT=ibverbs: " + why);
  return std::make_unique<VerbsTransport>(verbs_api(nullptr), opt);
}

}  // namespace r2ccl

#endif  // R2CCL_HAVE_IBVERBS
