// The socket backend's links through the transport seam (net/transport.h), with the I/O on
// the poster's thread (0 I/O threads) and on I/O threads (1 and 3): connect, frames of many
// sizes both ways at once checked byte for byte, pieces posted in parts, a dropped receive,
// a moved payload, a rate-capped send (budgets), the peer closing, and a link destroyed with
// sends and receives posted; the plain link's receive low-water mark; and NICs dealt to I/O threads by NIC, not by kernel interface.
// Loopback only (127.0.0.1 to 127.0.0.3).
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "net/socket/socket_backend.h"
#include "net/transport.h"
#include "check.h"

using namespace r2ccl;

namespace {

constexpr size_t kHb = 64;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits (bounded) for either link's poller events.
void wait_two(FrameLink& a, FrameLink& b, int ms) {
  pollfd p[2] = {{a.wait_fd(), POLLIN, 0}, {b.wait_fd(), POLLIN, 0}};
  if (a.needs_writable_watch()) p[0].events |= POLLOUT;
  if (b.needs_writable_watch()) p[1].events |= POLLOUT;
  ::poll(p, 2, ms);
}

// Waits (bounded) for the link's poller events.
void wait_on(FrameLink& l, bool out, int ms = 20) {
  short ev = POLLIN;
  if (out && l.needs_writable_watch()) ev |= POLLOUT;
  pollfd p{l.wait_fd(), ev, 0};
  ::poll(&p, 1, ms);
}

struct Pair {
  std::unique_ptr<Transport> tp;
  std::unique_ptr<FrameListener> lis;
  std::unique_ptr<FrameLink> a, b;   // a: connector, b: acceptor
};

Pair open_pair(int threads, const std::string& what) {
  Pair p;
  p.tp = make_socket_transport(threads);
  LinkOptions opt;
  opt.header_bytes = kHb;
  opt.bind_device = false;
  Nic nic = resolve_nic("127.0.0.1");
  p.lis = p.tp->listen(nic, 0, opt);
  p.a = p.tp->connect(nic, p.lis->local_addr(), opt);
  const int64_t until = now_ms() + 5000;
  ConnectState st = ConnectState::kPending;
  while (now_ms() < until) {
    if (!p.b) p.b = p.lis->accept();
    st = p.a->finish_connect();
    if (st != ConnectState::kPending && p.b) break;
    wait_on(*p.a, true, 5);
  }
  check(st == ConnectState::kUp && p.b, what + ": the link comes up");
  return p;
}

struct Frame {
  uint8_t hdr[kHb];
  std::vector<uint8_t> payload;
};

Frame make_frame(std::mt19937& rng, size_t len, uint32_t seq) {
  Frame f;
  for (auto& c : f.hdr) c = static_cast<uint8_t>(rng());
  std::memcpy(f.hdr, &seq, 4);
  uint64_t n = len;
  std::memcpy(f.hdr + 4, &n, 8);
  f.payload.resize(len);
  for (auto& c : f.payload) c = static_cast<uint8_t>(rng());
  return f;
}

// A send of frame `f` under `cookie`.
SendPost post_of(const Frame& f, uint64_t cookie) {
  SendPost s;
  s.header = f.hdr;
  s.payload = f.payload.data();
  s.payload_len = f.payload.size();
  s.cookie = cookie;
  return s;
}

// One direction's state: frames to send from `tx`, frames arriving on `rx` checked against
// `expect`. Receive space is posted in pieces of at most `piece`.
struct Flow {
  FrameLink* tx = nullptr;
  FrameLink* rx = nullptr;
  std::vector<Frame> frames;
  size_t next_post = 0, sent = 0;
  bool posted = false;
  size_t budget = SIZE_MAX;
  // receive
  size_t got_frames = 0;
  bool in_payload = false;
  std::vector<uint8_t> dst;
  size_t rx_got = 0, piece = SIZE_MAX;
  bool piece_posted = false;
  bool bad = false;

  void send_step() {
    while (sent < frames.size()) {
      if (!posted) {
        tx->post_send(post_of(frames[next_post], next_post + 1));
        posted = true;
      }
      LinkCompletion c = tx->poll_send(budget);
      if (c.kind == LinkCompletion::kFailed) {
        bad = true;
        return;
      }
      if (c.kind != LinkCompletion::kSent) return;
      if (c.cookie != next_post + 1) bad = true;
      posted = false;
      next_post++;
      sent++;
    }
  }
  void recv_step() {
    for (int i = 0; i < 64 && got_frames < frames.size(); i++) {
      const Frame& want = frames[got_frames];
      if (!in_payload) {
        LinkCompletion c = rx->poll_recv();
        if (c.kind == LinkCompletion::kNone) return;
        if (c.kind != LinkCompletion::kHeader || std::memcmp(c.header, want.hdr, kHb) != 0) {
          bad = true;
          return;
        }
        rx->accept_header(want.payload.size());
        dst.assign(want.payload.size(), 0);
        rx_got = 0;
        in_payload = true;
        piece_posted = false;
      }
      while (rx_got < dst.size()) {
        if (!piece_posted) {
          rx->post_recv(dst.data() + rx_got, std::min(piece, dst.size() - rx_got), nullptr);
          piece_posted = true;
        }
        LinkCompletion c = rx->poll_recv();
        if (c.kind == LinkCompletion::kNone) return;
        if (c.kind != LinkCompletion::kPayload) {
          bad = true;
          return;
        }
        rx_got += c.bytes;
        piece_posted = false;
      }
      if (dst != want.payload) bad = true;
      in_payload = false;
      got_frames++;
    }
  }
  bool done() const { return sent == frames.size() && got_frames == frames.size(); }
};

// Frames of mixed sizes both ways at once; every byte checked.
void test_exchange(int threads, size_t piece, size_t budget, const std::string& what) {
  Pair p = open_pair(threads, what);
  if (!p.b) return;
  std::mt19937 rng(threads * 1000 + static_cast<unsigned>(piece % 997));
  const size_t sizes[] = {0, 1, 4099, 32 << 10, (32 << 10) + 1, 256 << 10, 1 << 20, 3 << 20, 17};
  Flow ab, ba;
  ab.tx = ba.rx = p.a.get();
  ab.rx = ba.tx = p.b.get();
  uint32_t seq = 0;
  for (int round = 0; round < 3; round++)
    for (size_t s : sizes) {
      ab.frames.push_back(make_frame(rng, s, seq++));
      ba.frames.push_back(make_frame(rng, s / 2 + 3, seq++));
    }
  ab.piece = ba.piece = piece;
  ab.budget = ba.budget = budget;
  const int64_t until = now_ms() + 20000;
  while (!(ab.done() && ba.done()) && !ab.bad && !ba.bad && now_ms() < until) {
    ab.send_step();
    ba.send_step();
    ab.recv_step();
    ba.recv_step();
    if (!(ab.done() && ba.done())) wait_two(*p.a, *p.b, 1);
  }
  check(!ab.bad && !ba.bad, what + ": every frame arrives intact and in order");
  check(ab.done() && ba.done(), what + ": every frame arrives in time (" + std::to_string(ab.got_frames) + "+" +
                                    std::to_string(ba.got_frames) + " of " + std::to_string(2 * ab.frames.size()) +
                                    ")");
}

// A receive dropped mid-piece: the rest of that frame is read and thrown away, the next
// frame lands whole. A payload moved mid-send (to a copy; the original is then overwritten)
// keeps the stream in step.
void test_drop_and_move(int threads, const std::string& what) {
  Pair p = open_pair(threads, what);
  if (!p.b) return;
  std::mt19937 rng(7);
  Frame big = make_frame(rng, 8 << 20, 1), small = make_frame(rng, 1000, 2);
  std::vector<uint8_t> copy = big.payload;
  p.a->post_send(post_of(big, 1));
  p.a->poll_send();
  check(p.a->move_payload(1, copy.data()), what + ": a posted payload can move");
  std::fill(big.payload.begin(), big.payload.end(), 0xEE);   // the original is the caller's again
  std::vector<uint8_t> dst(big.payload.size());
  bool hdr = false, dropped = false, sent_big = false, sent_small = false;
  size_t small_posted = 0;
  const int64_t until = now_ms() + 20000;
  std::vector<uint8_t> small_dst(small.payload.size());
  int phase = 0;   // 0: big header, 1: big piece, 2: small header, 3: small piece, 4: done
  while (phase < 4 && now_ms() < until) {
    if (!sent_big) {
      LinkCompletion c = p.a->poll_send();
      if (c.kind == LinkCompletion::kSent) {
        sent_big = true;
        p.a->post_send(post_of(small, 2));
        small_posted = 1;
      }
    }
    if (small_posted && !sent_small && p.a->poll_send().kind == LinkCompletion::kSent) sent_small = true;
    LinkCompletion c = p.b->poll_recv();
    if (phase == 0 && c.kind == LinkCompletion::kHeader) {
      hdr = std::memcmp(c.header, big.hdr, kHb) == 0;
      p.b->accept_header(dst.size());
      p.b->post_recv(dst.data(), dst.size(), nullptr);
      phase = 1;
    } else if (phase == 1) {
      if (!dropped && c.moved > 0) {
        dropped = p.b->drop_recv();
        std::vector<uint8_t>().swap(dst);   // the space is gone
      }
      if (c.kind == LinkCompletion::kPayload) phase = 2;
    } else if (phase == 2 && c.kind == LinkCompletion::kHeader) {
      check(std::memcmp(c.header, small.hdr, kHb) == 0, what + ": the frame after a dropped one has its header");
      p.b->accept_header(small_dst.size());
      p.b->post_recv(small_dst.data(), small_dst.size(), nullptr);
      phase = 3;
    }
    if (phase == 3) {
      LinkCompletion d = p.b->poll_recv();
      if (d.kind == LinkCompletion::kPayload || c.kind == LinkCompletion::kPayload) phase = 4;
    }
    if (c.kind == LinkCompletion::kFailed) break;
    if (phase < 4) wait_on(*p.b, false, 1);
  }
  check(hdr, what + ": the big frame's header arrives");
  check(phase == 4, what + ": the dropped frame is consumed and the next one lands (phase " +
                        std::to_string(phase) + ")");
  check(small_dst == small.payload, what + ": the next frame's payload is intact");
}

// The peer closing fails the link with kClosedByPeer; destroying links with posts outstanding
// neither crashes nor hangs.
void test_close(int threads, const std::string& what) {
  Pair p = open_pair(threads, what);
  if (!p.b) return;
  p.b.reset();
  LinkCompletion c;
  const int64_t until = now_ms() + 5000;
  while (now_ms() < until) {
    c = p.a->poll_recv();
    if (c.kind == LinkCompletion::kFailed) break;
    wait_on(*p.a, false, 5);
  }
  check(c.kind == LinkCompletion::kFailed && p.a->failure().error == LinkError::kClosedByPeer,
        what + ": the peer's close fails the link as closed by the peer (" + p.a->failure().detail + ")");
  Pair q = open_pair(threads, what + " (second pair)");
  if (!q.b) return;
  std::vector<uint8_t> big(16 << 20, 1), dst(1 << 20);
  uint8_t hdr[kHb] = {};
  SendPost s;
  s.header = hdr;
  s.payload = big.data();
  s.payload_len = big.size();
  q.a->post_send(s);
  q.b->post_send(s);
  q.a->poll_send();
  usleep(2000);
  for (int i = 0; i < 50; i++) {
    if (q.b->poll_recv().kind == LinkCompletion::kHeader) {
      q.b->accept_header(big.size());
      q.b->post_recv(dst.data(), dst.size(), nullptr);
      break;
    }
    wait_on(*q.b, false, 2);
  }
  q.b.reset();
  q.a.reset();
  check(true, "links destroyed with posts outstanding");
}

bool readable_within(FrameLink& l, int ms) {
  pollfd p{l.wait_fd(), POLLIN, 0};
  return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

// Sends `bytes` more of the posted frame (a budgeted poll_send writes at most that).
bool send_some(FrameLink& l, size_t bytes) {
  size_t left = bytes;
  const int64_t until = now_ms() + 5000;
  while (left > 0 && now_ms() < until) {
    LinkCompletion c = l.poll_send(left);
    if (c.kind == LinkCompletion::kFailed) return false;
    left -= std::min(left, c.moved);
    if (c.kind == LinkCompletion::kSent) break;
    if (left) wait_on(l, true, 5);
  }
  return left == 0;
}

// The plain socket link (0 I/O threads) wakes its reader once a large piece is whole, not on
// every burst of it: once the socket ran dry mid-piece it is not readable while less than
// the rest has arrived, yet poll_recv called anyway (the engine's tick) still takes what
// came, and a small frame after it is readable at once. Checked byte for byte.
void test_wake_when_piece_whole() {
  const std::string what = "0 I/O threads, receive low-water mark";
  Pair p = open_pair(0, what);
  if (!p.b) return;
  std::mt19937 rng(7);
  Frame big = make_frame(rng, 512 << 10, 1), small = make_frame(rng, 4096, 2);
  p.a->post_send(post_of(big, 1));
  check(send_some(*p.a, kHb + (100 << 10)), what + ": the first 100 KiB are written");
  std::vector<uint8_t> dst(big.payload.size());
  LinkCompletion c;
  for (int i = 0; i < 100 && c.kind != LinkCompletion::kHeader; i++) {
    c = p.b->poll_recv();
    if (c.kind == LinkCompletion::kNone) wait_on(*p.b, false, 10);
  }
  check(c.kind == LinkCompletion::kHeader && std::memcmp(c.header, big.hdr, kHb) == 0, what + ": the header arrives");
  p.b->accept_header(dst.size());
  p.b->post_recv(dst.data(), dst.size(), nullptr);
  size_t got = 0;
  for (int i = 0; i < 100 && got < (100 << 10); i++) {
    c = p.b->poll_recv();
    got += c.moved;
    if (got < (100 << 10)) wait_on(*p.b, false, 10);
  }
  check(got == (100 << 10) && c.kind == LinkCompletion::kNone, what + ": the first 100 KiB are read, the piece open");
  check(!readable_within(*p.b, 50), what + ": dry mid-piece, the socket is not readable");
  check(send_some(*p.a, 100 << 10), what + ": 100 KiB more are written");
  check(!readable_within(*p.b, 50), what + ": still not readable with less than the rest there");
  c = p.b->poll_recv();
  check(c.moved == (100 << 10) && c.kind == LinkCompletion::kNone,
        what + ": a poll without an event takes what arrived (" + std::to_string(c.moved) + " bytes)");
  got += c.moved;
  check(send_some(*p.a, big.payload.size() - got), what + ": the rest is written");
  check(readable_within(*p.b, 2000), what + ": readable once the piece's rest is there");
  for (int i = 0; i < 100 && c.kind != LinkCompletion::kPayload; i++) {
    c = p.b->poll_recv();
    if (c.kind == LinkCompletion::kNone) wait_on(*p.b, false, 10);
  }
  check(c.kind == LinkCompletion::kPayload && dst == big.payload, what + ": the piece lands whole and exact");
  p.a->post_send(post_of(small, 2));
  check(send_some(*p.a, kHb + small.payload.size()), what + ": a small frame is written");
  check(readable_within(*p.b, 2000), what + ": a small frame after it wakes the reader");
}

}  // namespace

// NICs are dealt to I/O threads by the NIC as configured, not by kernel interface: three
// loopback addresses (all on "lo") over two threads land on threads 0, 1, 0.
void test_nic_dealing() {
  auto tp = make_socket_transport(2);
  LinkOptions opt;
  opt.header_bytes = kHb;
  opt.bind_device = false;
  const char* addrs[] = {"127.0.0.1", "127.0.0.2", "127.0.0.3"};
  const char* want[] = {"(I/O thread 0)", "(I/O thread 1)", "(I/O thread 0)"};
  for (int i = 0; i < 3; i++) {
    Nic nic = resolve_nic(addrs[i]);
    auto lis = tp->listen(nic, 0, opt);
    auto link = tp->connect(nic, lis->local_addr(), opt);
    const std::string d = link->describe();
    check(d.find(want[i]) != std::string::npos,
          std::string("NIC ") + addrs[i] + " on interface '" + nic.ifname + "' is served by " + want[i] + ": " + d);
  }
}

int main() {
  test_nic_dealing();
  test_wake_when_piece_whole();
  for (int threads : {0, 1, 3}) {
    const std::string t = std::to_string(threads) + " I/O threads";
    test_exchange(threads, SIZE_MAX, SIZE_MAX, t + ", whole pieces");
    test_exchange(threads, 5000, SIZE_MAX, t + ", 5000-byte pieces");
    test_exchange(threads, SIZE_MAX, 70000, t + ", a 70000-byte budget per poll");
    test_drop_and_move(threads, t);
    test_close(threads, t);
  }
  return checks_passed("test_socket_link");
}
