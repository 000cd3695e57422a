// Frames over a TCP stream: the socket backend's side of the transport seam
// (net/transport.h). A frame on the stream is its header's bytes then its payload's, with
// nothing between frames; the receiver's accept_header says how long each payload is.
// Posted sends are written with one sendmsg of header and payload (no copy of the payload);
// receives read straight into the space the receiver posted. Sockets need no memory
// registration. Knows nothing of rails or of the frame format's fields.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "net/socket/io_threads.h"
#include "net/socket/send_ring.h"
#include "net/tcp/stream.h"
#include "net/transport.h"

namespace r2ccl {
namespace {

using socket_detail::IoPool;
using socket_detail::kDropBytes;
using socket_detail::make_io_pool;
using socket_detail::make_threaded_link;
using socket_detail::next_write;
using socket_detail::SendRing;
using tcp::classify_errno;
using tcp::IoResult;
using tcp::StreamSocket;

class TcpFrameLink final : public FrameLink {
 public:
  TcpFrameLink(std::unique_ptr<StreamSocket> s, size_t header_bytes) : s_(std::move(s)), hb_(header_bytes) {
    if (hb_ == 0 || hb_ > kMaxLinkHeaderBytes)
      throw Error(Cause::kInvalidArgument, -1, "frame header of " + std::to_string(hb_) + " bytes");
  }

  int wait_fd() const override { return s_->fd(); }
  bool needs_writable_watch() const override { return true; }

  ConnectState finish_connect() override {
    if (failed()) return ConnectState::kFailed;
    IoResult r = s_->finish_connect();
    if (r.kind == IoResult::kWouldBlock) return ConnectState::kPending;
    if (r.kind == IoResult::kOk) return ConnectState::kUp;
    fail(classify_errno(r.err), r.err, std::string("connect: ") + std::strerror(r.err));
    return ConnectState::kFailed;
  }

  size_t send_slots() const override { return SendRing::kSlots; }

  void post_send(const SendPost& p) override {
    if (tx_.full()) return misuse("a send posted with every slot taken");
    tx_.push(p, hb_);
  }

  LinkCompletion poll_send(size_t budget) override {
    LinkCompletion c;
    if (failed()) return failed_completion();
    while (tx_.count > 0 && budget > 0) {
      SendRing::Out& o = tx_.at(0);
      const size_t total = hb_ + o.len;
      iovec iov[2];
      const int n = next_write(o, hb_, budget, iov);
      IoResult r = s_->writev(iov, n);
      if (r.kind == IoResult::kWouldBlock) {
        blocked_ = true;
        return c;
      }
      if (r.kind != IoResult::kOk) {
        fail(classify_errno(r.err), r.err, std::string("send failed: ") + std::strerror(r.err));
        return failed_completion(c.moved);
      }
      blocked_ = false;
      o.done += r.bytes;
      c.moved += r.bytes;
      budget -= std::min(budget, r.bytes);
      if (o.done == total) {
        c.kind = LinkCompletion::kSent;
        c.cookie = o.cookie;
        tx_.pop();
        return c;
      }
    }
    return c;
  }

  size_t head_sent() const override { return tx_.count ? tx_.at(0).done : 0; }
  bool send_blocked() const override { return blocked_ && tx_.count > 0; }

  bool move_payload(uint64_t cookie, const void* payload) override {
    tx_.move_payload(cookie, payload);
    return true;
  }

  LinkCompletion poll_recv() override {
    LinkCompletion c;
    if (failed()) return failed_completion();
    if (rs_ == Rx::kHeader) {
      while (hdr_got_ < hb_) {
        IoResult r = s_->read(hdr_ + hdr_got_, hb_ - hdr_got_);
        if (r.kind != IoResult::kOk) return read_ended(r, c.moved);
        hdr_got_ += r.bytes;
        c.moved += r.bytes;
      }
      hdr_got_ = 0;
      rs_ = Rx::kAwaitAccept;
      c.kind = LinkCompletion::kHeader;
      c.header = hdr_;
      return c;
    }
    if (rs_ != Rx::kPiece) return c;   // waiting for accept_header / post_recv
    while (piece_got_ < piece_len_) {
      size_t want = piece_len_ - piece_got_;
      uint8_t* dst;
      if (piece_dst_) {
        dst = piece_dst_ + piece_got_;
      } else {
        if (drop_.empty()) drop_.resize(kDropBytes);
        dst = drop_.data();
        want = std::min(want, drop_.size());
      }
      IoResult r = s_->read(dst, want);
      if (r.kind == IoResult::kWouldBlock) wake_at(piece_len_ - piece_got_);
      if (r.kind != IoResult::kOk) return read_ended(r, c.moved);
      piece_got_ += r.bytes;
      c.moved += r.bytes;
    }
    wake_at(1);
    frame_left_ -= piece_len_;
    rs_ = frame_left_ ? Rx::kAwaitPost : Rx::kHeader;
    c.kind = LinkCompletion::kPayload;
    c.bytes = piece_len_;
    return c;
  }

  void accept_header(size_t payload_len) override {
    if (rs_ != Rx::kAwaitAccept) return misuse("accept_header without a header");
    frame_left_ = payload_len;
    rs_ = payload_len ? Rx::kAwaitPost : Rx::kHeader;
  }

  void post_recv(void* dst, size_t len, const MemRegion*) override {
    if (rs_ != Rx::kAwaitPost || len == 0 || len > frame_left_)
      return misuse("receive space posted that the frame does not expect");
    piece_dst_ = static_cast<uint8_t*>(dst);
    piece_len_ = len;
    piece_got_ = 0;
    rs_ = Rx::kPiece;
  }

  bool drop_recv() override {
    if (rs_ == Rx::kPiece) piece_dst_ = nullptr;   // the rest is read into drop_ (piece_got_ counts on)
    return true;
  }

  const LinkFailure& failure() const override { return failure_; }
  void shutdown() override { s_->shutdown(); }
  std::string describe() const override { return s_->describe(); }

 private:
  enum class Rx { kHeader, kAwaitAccept, kAwaitPost, kPiece };

  bool failed() const { return failure_.error != LinkError::kNone; }
  void fail(LinkError e, int err, std::string detail) {
    if (failed()) return;
    failure_.error = e;
    failure_.sys_error = err;
    failure_.detail = std::move(detail);
  }
  void misuse(const char* what) { fail(LinkError::kIo, 0, std::string("transport misuse: ") + what); }
  LinkCompletion failed_completion(size_t moved = 0) const {
    LinkCompletion c;
    c.kind = LinkCompletion::kFailed;
    c.moved = moved;
    return c;
  }
  LinkCompletion read_ended(const IoResult& r, size_t moved) {
    LinkCompletion c;
    c.moved = moved;
    if (r.kind == IoResult::kWouldBlock) return c;
    if (r.kind == IoResult::kEof)
      fail(LinkError::kClosedByPeer, 0, "connection closed by the peer");
    else
      fail(classify_errno(r.err), r.err, std::string("receive failed: ") + std::strerror(r.err));
    return failed_completion(moved);
  }

  // The socket's receive low-water mark: readable (and the engine woken) only once this many
  // bytes wait. Set to the rest of a piece the socket ran dry in (from kLowatMin up to
  // kLowatMax), back to 1 when the piece is whole: a large frame wakes its reader about once
  // instead of once per burst of segments. On the 2-core test bed (veth, 4 rails, 256 MiB)
  // every wakeup of a sleeping receiver cost the sender's thread its share of an IPI, and
  // this took p2p from 1.9 to 3.0 GB/s (BENCHMARKS.md, issue 14). A slow rail's partial
  // piece is still read on the engine's tick, so its receiver sees it alive.
  void wake_at(size_t bytes) {
    int v = bytes >= kLowatMin ? static_cast<int>(std::min(bytes, kLowatMax)) : 1;
    if (v == lowat_) return;
    if (::setsockopt(s_->fd(), SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0) lowat_ = v;
  }
  static constexpr size_t kLowatMin = 16 << 10;
  static constexpr size_t kLowatMax = 1 << 20;
  int lowat_ = 1;

  std::unique_ptr<StreamSocket> s_;
  size_t hb_;
  LinkFailure failure_;
  SendRing tx_;
  bool blocked_ = false;
  // receive
  Rx rs_ = Rx::kHeader;
  uint8_t hdr_[kMaxLinkHeaderBytes];
  size_t hdr_got_ = 0, frame_left_ = 0;
  uint8_t* piece_dst_ = nullptr;
  size_t piece_len_ = 0, piece_got_ = 0;
  std::vector<uint8_t> drop_;
};

// A link over `s`: driven by the poster alone, or by `pool`'s thread for the NIC.
std::unique_ptr<FrameLink> make_link(const std::shared_ptr<IoPool>& pool, const Nic& nic,
                                     std::unique_ptr<StreamSocket> s, size_t header_bytes, bool connecting) {
  if (pool) return make_threaded_link(pool, nic, std::move(s), header_bytes, connecting);
  return std::make_unique<TcpFrameLink>(std::move(s), header_bytes);
}

class TcpFrameListener final : public FrameListener {
 public:
  TcpFrameListener(int fd, const Nic& nic, const LinkOptions& opt, std::shared_ptr<IoPool> pool)
      : fd_(fd), nic_(nic), opt_(opt), pool_(std::move(pool)) {}
  ~TcpFrameListener() override { ::close(fd_); }
  int wait_fd() const override { return fd_; }
  NetAddr local_addr() const override { return tcp::local_addr_of(fd_); }
  std::unique_ptr<FrameLink> accept() override {
    auto s = tcp::accept_socket(fd_, nic_, opt_);
    if (!s) return nullptr;
    return make_link(pool_, nic_, std::move(s), opt_.header_bytes, false);
  }

 private:
  int fd_;
  Nic nic_;
  LinkOptions opt_;
  std::shared_ptr<IoPool> pool_;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(int io_threads) {
    if (io_threads > 0) pool_ = make_io_pool(io_threads);
  }
  const char* name() const override { return "socket"; }
  std::unique_ptr<FrameListener> listen(const Nic& nic, int port, const LinkOptions& opt) override {
    return std::make_unique<TcpFrameListener>(tcp::listen_socket(nic, port, opt), nic, opt, pool_);
  }
  std::unique_ptr<FrameLink> connect(const Nic& local, const NetAddr& remote, const LinkOptions& opt) override {
    return make_link(pool_, local, tcp::connect_socket(local, remote, opt), opt.header_bytes, true);
  }
  // Registration: the seam's defaults (sockets need none).

 private:
  std::shared_ptr<IoPool> pool_;   // null: every link's I/O runs on its poster's thread
};

}  // namespace

std::unique_ptr<Transport> make_socket_transport(int io_threads) {
  return std::make_unique<TcpTransport>(std::max(0, io_threads));
}

}  // namespace r2ccl
