// The socket backend's I/O threads (io_threads.h): a link whose sendmsg and recv calls run on
// the thread its NIC was dealt to, and the pool of those threads.
//
// Per link, the I/O thread writes the posted sends in order and reads frames as the poster
// asks for them: a header into the link's own buffer, then each piece of payload straight
// into the space posted for it. It announces on the link's eventfd every send finished,
// header read or piece landed, every failure, a pending connect's end, and (at most every
// kLivenessNs) bytes moved with nothing finished, so the poster's liveness clocks keep
// running on a slow path. Small frames skip the hand-over: a post of at most kInlineBytes
// onto an idle link is written by the poster itself, and a small receive piece is read by
// it, so a 4 KiB message costs no thread switch on either side. A send under a software rate
// cap (poll_send with a budget) is written by the poster as on a plain socket, the I/O thread
// only telling it when the socket drains.
#include "net/socket/io_threads.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "net/socket/send_ring.h"

namespace r2ccl {
namespace socket_detail {

using tcp::classify_errno;
using tcp::IoResult;
using tcp::StreamSocket;

namespace {

constexpr size_t kInlineBytes = kCallerPathMaxBytes;   // frames and pieces the poster moves itself (as on the caller's path)
constexpr int64_t kLivenessNs = 10 * 1000000;    // bytes moved are announced at least this often
constexpr int kStepsPerTurn = 16;                // syscalls per link per direction before the next link's turn

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

class IoThread;

// What a link's poster and its I/O thread share. Fields under `st` unless said otherwise.
struct LinkCore {
  LinkCore(std::unique_ptr<StreamSocket> sock, size_t header_bytes, IoThread* thread, bool is_connecting)
      : s(std::move(sock)), hb(header_bytes), th(thread), connecting(is_connecting) {}

  std::unique_ptr<StreamSocket> s;
  const size_t hb;
  IoThread* const th;
  uint64_t id = 0;                  // in th's registry and epoll (set once, before registration)
  std::atomic<bool> queued{false};  // in th's kick list

  std::mutex st;     // the state below; never held across a syscall on the socket
  std::mutex tx_io;  // held across each write of a posted payload (and to move one)
  std::mutex rx_io;  // held across each read into posted space (and to drop one)
  int efd = -1;                     // wait_fd; -1 once closed
  bool closed = false;
  bool signalled = false;           // efd holds a count
  int64_t signal_ns = 0;
  bool connecting;
  bool connect_event = false;       // the socket reported something while connecting
  bool rx_dry = true;               // the last read of this link found the socket empty
  bool dry_event = false;           // it became empty since the poster last looked
  bool liveness_due = false;        // bytes moved, announced with nothing finished
  LinkFailure failure;

  SendRing tx;
  size_t written = 0;               // posts from tx's oldest fully written, not yet reported
  bool poster_sends = false;        // a rate cap: the poster writes, the thread only watches
  bool want_out = false;            // the poster's write would block: announce when writable
  bool out_ready = false;
  size_t tx_moved = 0, rx_moved = 0;

  enum class Rx { kHeader, kHeaderReady, kAwaitAccept, kAwaitPost, kPiece };
  Rx rs = Rx::kHeader;
  uint8_t hdr[kMaxLinkHeaderBytes];
  size_t hdr_got = 0, frame_left = 0;
  uint8_t* piece_dst = nullptr;
  size_t piece_len = 0, piece_got = 0;
  size_t piece_done = 0;            // a landed piece not yet reported (its bytes)
  std::vector<uint8_t> drop;

  bool failed() const { return failure.error != LinkError::kNone; }
  bool pending() const {
    return failed() || written > 0 || out_ready || rs == Rx::kHeaderReady || piece_done > 0 || liveness_due ||
           connect_event || dry_event;
  }
  void signal() {
    signal_ns = mono_ns();
    if (signalled || efd < 0) return;
    signalled = true;
    const uint64_t one = 1;
    ssize_t w = ::write(efd, &one, sizeof one);
    (void)w;
  }
  // The poster, after taking completions: the eventfd reads empty once nothing waits.
  void settle() {
    if (!signalled || pending() || efd < 0) return;
    uint64_t v;
    ssize_t r = ::read(efd, &v, sizeof v);
    (void)r;
    signalled = false;
  }
  void moved_bytes(size_t n, size_t* counter, bool announce) {
    *counter += n;
    if (announce && mono_ns() - signal_ns >= kLivenessNs) {
      liveness_due = true;
      signal();
    }
  }
  void fail(LinkError e, int err, std::string detail) {
    if (failed()) return;
    failure.error = e;
    failure.sys_error = err;
    failure.detail = std::move(detail);
    signal();
  }
  void misuse(const char* what) { fail(LinkError::kIo, 0, std::string("transport misuse: ") + what); }

  // One write of the first unwritten post, with tx_io held. `thread`: the I/O thread (it
  // announces what finishes; the poster takes its own completions). False when there is
  // nothing to write now.
  bool write_step(size_t budget, bool thread) {
    iovec iov[2];
    int n = 0;
    size_t slot;
    {
      std::lock_guard<std::mutex> g(st);
      if (closed || failed() || connecting || written == tx.count || budget == 0) return false;
      if (thread && poster_sends) return false;
      // By slot, not by age: the poster may take finished posts off the ring meanwhile.
      slot = (tx.head + written) % SendRing::kSlots;
      n = next_write(tx.ring[slot], hb, budget, iov);
    }
    IoResult r = s->writev(iov, n);
    std::lock_guard<std::mutex> g(st);
    if (r.kind == IoResult::kWouldBlock) {
      if (!thread) want_out = true;
      return false;
    }
    if (r.kind != IoResult::kOk) {
      fail(classify_errno(r.err), r.err, std::string("send failed: ") + std::strerror(r.err));
      return false;
    }
    SendRing::Out& o = tx.ring[slot];
    o.done += r.bytes;
    if (o.done == hb + o.len) {
      written++;
      tx_moved += r.bytes;
      if (thread) signal();   // the poster polls its own inline write at once
      return thread;
    }
    moved_bytes(r.bytes, &tx_moved, thread);
    return true;
  }

  // One read of a header or a posted piece, with rx_io held. False when there is nothing to
  // read now (the socket is empty or the poster has not asked for more).
  bool read_step(bool thread) {
    uint8_t* dst;
    size_t want;
    bool header;
    {
      std::lock_guard<std::mutex> g(st);
      if (closed || failed() || connecting) return false;
      if (rs == Rx::kHeader) {
        header = true;
        dst = hdr + hdr_got;
        want = hb - hdr_got;
      } else if (rs == Rx::kPiece && piece_done == 0) {
        header = false;
        want = piece_len - piece_got;
        if (piece_dst) {
          dst = piece_dst + piece_got;
        } else {
          if (drop.empty()) drop.resize(kDropBytes);
          dst = drop.data();
          want = std::min(want, drop.size());
        }
      } else {
        return false;
      }
    }
    IoResult r = s->read(dst, want);
    std::lock_guard<std::mutex> g(st);
    if (r.kind == IoResult::kWouldBlock) {
      // Read dry: the poster acks now (as a plain socket's poster does when its own read
      // finds nothing). Acking after every piece instead would let the rail whose thread
      // answers first grow its window and take the others' share (striping collapses on
      // unshaped rails; see BENCHMARKS.md, prompt acks).
      if (!rx_dry) {
        rx_dry = true;
        if (thread) {
          dry_event = true;
          signal();
        }
      }
      return false;
    }
    if (r.kind == IoResult::kOk) rx_dry = false;
    if (r.kind == IoResult::kEof) {
      fail(LinkError::kClosedByPeer, 0, "connection closed by the peer");
      return false;
    }
    if (r.kind != IoResult::kOk) {
      fail(classify_errno(r.err), r.err, std::string("receive failed: ") + std::strerror(r.err));
      return false;
    }
    if (header) {
      hdr_got += r.bytes;
      if (hdr_got < hb) {
        moved_bytes(r.bytes, &rx_moved, thread);
        return true;
      }
      rx_moved += r.bytes;
      hdr_got = 0;
      rs = Rx::kHeaderReady;
      signal();
      return false;   // the poster decides what comes next
    }
    piece_got += r.bytes;
    if (piece_got < piece_len) {
      moved_bytes(r.bytes, &rx_moved, thread);
      return true;
    }
    rx_moved += r.bytes;
    piece_done = piece_len;
    frame_left -= piece_len;
    rs = frame_left ? Rx::kAwaitPost : Rx::kHeader;   // at a frame's end the next header follows
    signal();
    return true;   // read on into the next header (whoever reads: a poster's read that
                   // stops at the socket's end leaves the next edge to the thread)
  }

  // The I/O thread's turn on this link. False: it stopped short of the socket's end (the
  // link is due another turn).
  bool serve() {
    {
      std::lock_guard<std::mutex> g(st);
      if (closed || failed()) return true;
      if (connecting) {
        connect_event = true;
        signal();
        return true;
      }
      if (want_out) {
        want_out = false;
        out_ready = true;
        signal();
      }
    }
    bool done = true;
    {
      std::lock_guard<std::mutex> g(tx_io);
      int i = 0;
      while (i < kStepsPerTurn && write_step(SIZE_MAX, true)) i++;
      if (i == kStepsPerTurn) done = false;
    }
    {
      std::lock_guard<std::mutex> g(rx_io);
      int i = 0;
      while (i < kStepsPerTurn && read_step(true)) i++;
      if (i == kStepsPerTurn) done = false;
    }
    return done;
  }
};

// One I/O thread: an epoll set of its links' sockets (edge-triggered) and a kick list of
// links whose poster gave it work (a post, an accepted header, posted space).
class IoThread {
 public:
  explicit IoThread(int index) : index_(index) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ep_ < 0 || wake_ < 0) throw Error(Cause::kSystem, -1, "I/O thread: epoll/eventfd creation failed");
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = 0;
    epoll_ctl(ep_, EPOLL_CTL_ADD, wake_, &e);
    th_ = std::thread([this] { run(); });
  }
  ~IoThread() {
    stop_.store(true);
    const uint64_t one = 1;
    ssize_t w = ::write(wake_, &one, sizeof one);
    (void)w;
    th_.join();
    ::close(ep_);
    ::close(wake_);
  }

  int index() const { return index_; }
  void add(const std::shared_ptr<LinkCore>& c) {
    std::lock_guard<std::mutex> g(mu_);
    c->id = next_id_++;
    links_[c->id] = c;
    epoll_event e{};
    e.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    e.data.u64 = c->id;
    epoll_ctl(ep_, EPOLL_CTL_ADD, c->s->fd(), &e);
  }
  void remove(const LinkCore& c) {
    std::lock_guard<std::mutex> g(mu_);
    links_.erase(c.id);
    epoll_ctl(ep_, EPOLL_CTL_DEL, c.s->fd(), nullptr);
  }
  void kick(const std::shared_ptr<LinkCore>& c) {
    if (c->queued.exchange(true)) return;
    std::lock_guard<std::mutex> g(mu_);
    kicks_.push_back(c);
    if (sleeping_ && !woken_) {
      woken_ = true;
      const uint64_t one = 1;
      ssize_t w = ::write(wake_, &one, sizeof one);
      (void)w;
    }
  }
  void pin(const std::vector<int>& cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus)
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    if (pthread_setaffinity_np(th_.native_handle(), sizeof set, &set) != 0)
      R2_WARN("I/O thread %d: could not pin it to its NIC's NUMA node", index_);
  }

 private:
  void run() {
    name_this_thread(("r2ccl-io" + std::to_string(index_)).c_str());
    epoll_event evs[64];
    std::vector<std::shared_ptr<LinkCore>> work, again;
    while (!stop_.load()) {
      int timeout = 1000;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (!kicks_.empty() || !again.empty()) {
          timeout = 0;
        } else {
          sleeping_ = true;
        }
      }
      const int n = epoll_wait(ep_, evs, 64, timeout);
      work.clear();
      {
        std::lock_guard<std::mutex> g(mu_);
        sleeping_ = false;
        for (int i = 0; i < n; i++) {
          if (evs[i].data.u64 == 0) {
            uint64_t v;
            ssize_t r = ::read(wake_, &v, sizeof v);
            (void)r;
            woken_ = false;
            continue;
          }
          auto it = links_.find(evs[i].data.u64);
          if (it == links_.end()) continue;   // removed since the event
          if (auto c = it->second.lock()) work.push_back(std::move(c));
        }
        for (auto& c : kicks_) work.push_back(std::move(c));
        kicks_.clear();
      }
      for (auto& c : again) work.push_back(std::move(c));
      again.clear();
      for (auto& c : work) {
        c->queued.store(false);
        if (!c->serve()) again.push_back(c);
      }
      work.clear();
    }
  }

  int index_;
  int ep_ = -1, wake_ = -1;
  std::mutex mu_;
  std::unordered_map<uint64_t, std::weak_ptr<LinkCore>> links_;
  std::vector<std::shared_ptr<LinkCore>> kicks_;
  uint64_t next_id_ = 1;
  bool sleeping_ = false, woken_ = false;
  std::atomic<bool> stop_{false};
  std::thread th_;
};

int read_int_file(const std::string& path, int fallback) {
  std::ifstream f(path);
  int v;
  return (f >> v) ? v : fallback;
}

// "0-3,8-11" -> {0,1,2,3,8,9,10,11}
std::vector<int> parse_cpulist(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t end = s.find(',', i);
    if (end == std::string::npos) end = s.size();
    const std::string part = s.substr(i, end - i);
    const size_t dash = part.find('-');
    try {
      const int a = std::stoi(part.substr(0, dash));
      const int b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
      for (int c = a; c <= b && c - a < 4096; c++) out.push_back(c);
    } catch (const std::exception&) {
      return {};
    }
    i = end + 1;
  }
  return out;
}

}  // namespace

class IoPool {
 public:
  explicit IoPool(int threads) {
    for (int i = 0; i < threads; i++) threads_.push_back(std::make_unique<IoThread>(i));
    node_.assign(static_cast<size_t>(threads), -1);
    multi_node_ = access("/sys/devices/system/node/node1", F_OK) == 0;
  }
  int size() const { return static_cast<int>(threads_.size()); }

  // NIC k (in the order first used) goes to thread k mod size. A NIC is one entry of
  // R2CCL_NICS as given (its name): loopback rails 127.0.0.1 and 127.0.0.2 share the kernel
  // interface "lo" but are two NICs, each with a thread of its own. A thread is pinned to its
  // NICs' NUMA node when the machine has several and they all share one; unpinned otherwise.
  IoThread* thread_for(const Nic& nic) {
    std::lock_guard<std::mutex> g(mu_);
    const std::string key = nic.name.empty() ? nic.addr_str() : nic.name;
    auto it = nic_thread_.find(key);
    if (it != nic_thread_.end()) return threads_[static_cast<size_t>(it->second)].get();
    const int t = static_cast<int>(nic_thread_.size() % threads_.size());
    nic_thread_[key] = t;
    if (multi_node_) place(t, nic);
    return threads_[static_cast<size_t>(t)].get();
  }

 private:
  void place(int t, const Nic& nic) {
    int& node = node_[static_cast<size_t>(t)];
    const int nic_node =
        nic.ifname.empty() ? -1 : read_int_file("/sys/class/net/" + nic.ifname + "/device/numa_node", -1);
    const bool first = node == -1;
    if (first && nic_node >= 0) {
      std::ifstream f("/sys/devices/system/node/node" + std::to_string(nic_node) + "/cpulist");
      std::string list;
      std::vector<int> cpus = (f >> list) ? parse_cpulist(list) : std::vector<int>();
      if (!cpus.empty()) {
        threads_[static_cast<size_t>(t)]->pin(cpus);
        R2_INFO("I/O thread %d: NIC %s on NUMA node %d, pinned to cpus %s", t, nic.name.c_str(), nic_node,
                list.c_str());
        node = nic_node;
        return;
      }
    }
    if (!first && node >= 0 && nic_node != node) {
      // NICs of different nodes share this thread: let it run anywhere.
      std::vector<int> all;
      for (int c = 0; c < CPU_SETSIZE; c++) all.push_back(c);
      threads_[static_cast<size_t>(t)]->pin(all);
      node = -2;
    }
    if (first) node = nic_node >= 0 ? nic_node : -2;
  }

  std::vector<std::unique_ptr<IoThread>> threads_;
  std::mutex mu_;
  std::map<std::string, int> nic_thread_;
  std::vector<int> node_;   // per thread: its NICs' node (-1: no NIC yet, -2: unknown or mixed)
  bool multi_node_ = false;
};

std::shared_ptr<IoPool> make_io_pool(int threads) { return std::make_shared<IoPool>(threads); }
int io_pool_threads(const IoPool& pool) { return pool.size(); }

namespace {

class ThreadedLink final : public FrameLink {
 public:
  ThreadedLink(const std::shared_ptr<IoPool>& pool, IoThread* th, std::unique_ptr<StreamSocket> s, size_t hb,
               bool connecting)
      : pool_(pool), th_(th) {
    if (hb == 0 || hb > kMaxLinkHeaderBytes)
      throw Error(Cause::kInvalidArgument, -1, "frame header of " + std::to_string(hb) + " bytes");
    desc_ = s->describe() + " (I/O thread " + std::to_string(th->index()) + ")";
    c_ = std::make_shared<LinkCore>(std::move(s), hb, th, connecting);
    c_->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c_->efd < 0) throw Error(Cause::kSystem, -1, std::string("eventfd: ") + std::strerror(errno));
    th_->add(c_);
  }
  ~ThreadedLink() override {
    th_->remove(*c_);
    std::lock_guard<std::mutex> t(c_->tx_io), r(c_->rx_io);
    std::lock_guard<std::mutex> g(c_->st);
    c_->closed = true;
    ::close(c_->efd);
    c_->efd = -1;
    c_->s.reset();   // closes the socket: nothing reads or writes it any more
  }
  ThreadedLink(const ThreadedLink&) = delete;
  ThreadedLink& operator=(const ThreadedLink&) = delete;

  int wait_fd() const override { return c_->efd; }
  bool needs_writable_watch() const override { return false; }

  ConnectState finish_connect() override {
    std::unique_lock<std::mutex> g(c_->st);
    if (c_->failed()) return ConnectState::kFailed;
    c_->connect_event = false;
    if (!c_->connecting) {
      c_->settle();
      return ConnectState::kUp;
    }
    IoResult r = c_->s->finish_connect();
    if (r.kind == IoResult::kWouldBlock) {
      c_->settle();
      return ConnectState::kPending;
    }
    if (r.kind != IoResult::kOk) {
      c_->fail(classify_errno(r.err), r.err, std::string("connect: ") + std::strerror(r.err));
      return ConnectState::kFailed;
    }
    c_->connecting = false;
    // wait_fd stays readable until the poller asks again: a plain socket reads as writable
    // once connected, and a poller that saw kUp here from its first call may still wait for
    // that event.
    c_->connect_event = true;
    c_->signal();
    g.unlock();
    th_->kick(c_);   // bytes may have arrived with the connect
    return ConnectState::kUp;
  }

  size_t send_slots() const override { return SendRing::kSlots; }

  void post_send(const SendPost& p) override {
    bool inline_write;
    {
      std::lock_guard<std::mutex> g(c_->st);
      if (c_->tx.full()) return c_->misuse("a send posted with every slot taken");
      c_->tx.push(p, c_->hb);
      if (c_->poster_sends || c_->connecting) return;   // the poster's poll_send writes it, or the connect's end kicks
      inline_write = c_->tx.count - c_->written == 1 && c_->hb + p.payload_len <= kInlineBytes;
    }
    if (inline_write) {
      std::lock_guard<std::mutex> t(c_->tx_io);
      while (c_->write_step(SIZE_MAX, false)) {
      }
      std::lock_guard<std::mutex> g(c_->st);
      const bool rest = c_->written < c_->tx.count;
      c_->want_out = false;   // the thread takes the rest: a writable edge or this kick
      if (!rest) return;
    }
    th_->kick(c_);
  }

  LinkCompletion poll_send(size_t budget) override {
    LinkCompletion c;
    if (budget != SIZE_MAX) {
      {
        std::lock_guard<std::mutex> g(c_->st);
        c_->poster_sends = true;
        c_->out_ready = false;
      }
      std::lock_guard<std::mutex> t(c_->tx_io);   // waits out the thread's write in progress
      size_t left = budget;
      for (;;) {
        size_t before;
        {
          std::lock_guard<std::mutex> g(c_->st);
          if (c_->written > 0 || left == 0) break;
          before = c_->tx_moved;
        }
        const bool more = c_->write_step(left, false);
        std::lock_guard<std::mutex> g(c_->st);
        left -= std::min(left, c_->tx_moved - before);
        if (!more) break;
      }
    } else {
      bool kick = false;
      {
        std::lock_guard<std::mutex> g(c_->st);
        if (c_->poster_sends) {
          c_->poster_sends = false;
          c_->want_out = false;
          kick = c_->written < c_->tx.count;
        }
      }
      if (kick) th_->kick(c_);
    }
    std::lock_guard<std::mutex> g(c_->st);
    c.moved = c_->tx_moved;
    c_->tx_moved = 0;
    c_->out_ready = false;
    if (c_->failed()) {
      c.kind = LinkCompletion::kFailed;
    } else if (c_->written > 0) {
      c.kind = LinkCompletion::kSent;
      c.cookie = c_->tx.at(0).cookie;
      c_->tx.pop();
      c_->written--;
    }
    c_->settle();
    return c;
  }

  size_t head_sent() const override {
    std::lock_guard<std::mutex> g(c_->st);
    return c_->tx.count ? c_->tx.at(0).done : 0;
  }
  bool send_blocked() const override { return false; }

  bool move_payload(uint64_t cookie, const void* payload) override {
    std::lock_guard<std::mutex> t(c_->tx_io);
    std::lock_guard<std::mutex> g(c_->st);
    c_->tx.move_payload(cookie, payload);
    return true;
  }

  LinkCompletion poll_recv() override {
    LinkCompletion c;
    {
      std::lock_guard<std::mutex> g(c_->st);
      c.moved = c_->rx_moved;
      c_->rx_moved = 0;
      c_->liveness_due = false;
      c_->dry_event = false;
      c_->out_ready = false;   // a hint only: the poller tries the send after every readable
      if (!c_->connecting) c_->connect_event = false;
      if (c_->failed()) {
        c.kind = LinkCompletion::kFailed;
      } else if (c_->piece_done > 0) {
        c.kind = LinkCompletion::kPayload;
        c.bytes = c_->piece_done;
        c_->piece_done = 0;
      } else if (c_->rs == LinkCore::Rx::kHeaderReady) {
        c.kind = LinkCompletion::kHeader;
        c.header = c_->hdr;
        c_->rs = LinkCore::Rx::kAwaitAccept;
      }
      c_->settle();
    }
    return c;
  }

  void accept_header(size_t payload_len) override {
    {
      std::lock_guard<std::mutex> g(c_->st);
      if (c_->rs != LinkCore::Rx::kAwaitAccept) return c_->misuse("accept_header without a header");
      c_->frame_left = payload_len;
      c_->rs = payload_len ? LinkCore::Rx::kAwaitPost : LinkCore::Rx::kHeader;
      if (payload_len) return;
    }
    th_->kick(c_);
  }

  void post_recv(void* dst, size_t len, const MemRegion*) override {
    {
      std::lock_guard<std::mutex> g(c_->st);
      if (c_->rs != LinkCore::Rx::kAwaitPost || len == 0 || len > c_->frame_left)
        return c_->misuse("receive space posted that the frame does not expect");
      c_->piece_dst = static_cast<uint8_t*>(dst);
      c_->piece_len = len;
      c_->piece_got = 0;
      c_->rs = LinkCore::Rx::kPiece;
    }
    if (len <= kInlineBytes) {
      std::unique_lock<std::mutex> r(c_->rx_io, std::try_to_lock);
      if (r.owns_lock()) {
        while (c_->read_step(false)) {
        }
        std::lock_guard<std::mutex> g(c_->st);
        // Landed (poll_recv reports it); the next header was read too or the socket is
        // empty, and its next edge goes to the thread.
        if (c_->piece_done > 0) return;
      }
    }
    th_->kick(c_);
  }

  bool drop_recv() override {
    std::lock_guard<std::mutex> r(c_->rx_io);
    std::lock_guard<std::mutex> g(c_->st);
    if (c_->rs == LinkCore::Rx::kPiece) c_->piece_dst = nullptr;   // the rest is read into `drop`
    return true;
  }

  bool rx_drained() const override {
    std::lock_guard<std::mutex> g(c_->st);
    return c_->rx_dry;
  }

  const LinkFailure& failure() const override {
    std::lock_guard<std::mutex> g(c_->st);
    failure_copy_ = c_->failure;
    return failure_copy_;
  }
  void shutdown() override {
    std::lock_guard<std::mutex> g(c_->st);
    if (c_->s) c_->s->shutdown();
  }
  std::string describe() const override { return desc_; }

 private:
  std::shared_ptr<IoPool> pool_;   // outlives the thread pointer below
  IoThread* th_;
  std::shared_ptr<LinkCore> c_;
  std::string desc_;
  mutable LinkFailure failure_copy_;
};

}  // namespace

std::unique_ptr<FrameLink> make_threaded_link(const std::shared_ptr<IoPool>& pool, const Nic& nic,
                                              std::unique_ptr<StreamSocket> s, size_t header_bytes,
                                              bool connecting) {
  return std::make_unique<ThreadedLink>(pool, pool->thread_for(nic), std::move(s), header_bytes, connecting);
}

}  // namespace socket_detail
}  // namespace r2ccl
