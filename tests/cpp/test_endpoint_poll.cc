// The engine's test lease (core/engine.h): a caller polling Endpoint::test() in a loop, as an
// NCCL plugin's progress thread does, keeps the engine thread off the sockets and does their
// work itself; the engine thread takes them back once the caller stops. Two endpoints in this
// process over loopback (127.0.0.1 and 127.0.0.2), rank 0 and rank 1:
//  1. round trips of 4 KiB, each request waited for by polling test() only, bit for bit;
//  2. the lease: polling test() takes it; then a receive that no one polls any more (its
//     waiter blocks on the request itself, not through the endpoint) still completes, and the
//     lease is gone soon after the last test(), so the engine thread sleeps on the sockets again;
//  3. a blocking Endpoint::wait right after polling (a 4 MiB receive) completes, bit for bit;
//  4. two threads polling test() on different requests at once while the peer streams (the
//     TSan build runs this file too).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/settings.h"
#include "core/endpoint.h"
#include "check.h"

using namespace r2ccl;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Polls test() until done (bounded): false if it did not finish within `seconds`.
bool poll(Endpoint& ep, const std::shared_ptr<Request>& r, double seconds = 10) {
  const double until = now_s() + seconds;
  while (!ep.test(r))
    if (now_s() > until) return false;
  return true;
}

}  // namespace

int main() {
  Config cfg = config_from_environment();
  cfg.timeout_s = 20;
  cfg.monitor_ms = 0;
  const std::vector<std::string> nics = {"127.0.0.1", "127.0.0.2"};
  auto a = std::make_shared<Endpoint>(cfg, 0, 2, nics, std::string("test-endpoint-poll-secret"));
  auto b = std::make_shared<Endpoint>(cfg, 1, 2, nics, std::string("test-endpoint-poll-secret"));
  a->add_peer(1, b->addresses(), true);
  b->add_peer(0, a->addresses(), true);
  a->wait_ready({1}, 30);
  b->wait_ready({0}, 30);
  uint64_t tag = 0;

  // 1. Polled round trips.
  {
    const size_t n = 4096;
    bool ok = true;
    for (int it = 0; it < 200 && ok; it++) {
      std::vector<uint8_t> ping = pattern(n, static_cast<uint32_t>(it)), got(n, 0), back(n, 0);
      auto rb = b->post_recv(0, tag, got.data(), n, {}, true);
      auto sa = a->post_send(1, tag, ping.data(), n, {}, true);
      ok = poll(*b, rb) && poll(*a, sa) && !rb->failed() && got == ping;
      auto ra = a->post_recv(1, tag + 1, back.data(), n, {}, true);
      auto sb = b->post_send(0, tag + 1, got.data(), n, {}, true);
      ok = ok && poll(*a, ra) && poll(*b, sb) && !ra->failed() && back == ping;
      tag += 2;
    }
    check(ok, "1: a polled 4 KiB round trip failed or differs");
  }

  // 2. The lease lapses: b polls a receive whose message is not sent yet, then stops polling
  //    and waits on the request itself.
  {
    const size_t n = 4096;
    std::vector<uint8_t> msg = pattern(n, 99), got(n, 0);
    auto r = b->post_recv(0, tag, got.data(), n, {}, true);
    bool taken = false;
    for (int i = 0; i < 1000 && !taken; i++) {
      check(!b->test(r), "2: a receive finished before its message was sent");
      taken = b->testing_test_lease_held();   // looked at right away: the lease lasts 1 ms
    }
    check(taken, "2: polling test() did not take the test lease");
    const double t0 = now_s();
    auto s = a->post_send(1, tag, msg.data(), n, {}, true);
    const bool done = r->wait_until(now_ns() + 5'000'000'000LL);
    check(done, "2: a receive no one polls did not complete within 5 s after polling stopped");
    if (done) {
      check(!r->failed() && got == msg, "2: the unpolled receive failed or differs");
      std::printf("2: the unpolled receive completed %.2f ms after its send was posted\n", (now_s() - t0) * 1e3);
    }
    check(poll(*a, s), "2: the send did not finish");
    // b has not polled since: its lease has lapsed (1-2 ms; 200 ms allowed).
    bool lapsed = false;
    for (const double until = now_s() + 0.2; !lapsed && now_s() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      lapsed = !b->testing_test_lease_held();
    }
    check(lapsed, "2: the test lease still held 200 ms after the last test()");
    tag += 1;
  }

  // 3. A blocking wait right after polling.
  {
    const size_t small = 4096, big = 4 << 20;
    std::vector<uint8_t> m1 = pattern(small, 5), g1(small, 0), m2 = pattern(big, 6), g2(big, 0);
    auto r1 = b->post_recv(0, tag, g1.data(), small, {}, true);
    auto s1 = a->post_send(1, tag, m1.data(), small, {}, true);
    check(poll(*b, r1) && g1 == m1, "3: the polled message did not arrive intact");
    auto r2 = b->post_recv(0, tag + 1, g2.data(), big, {}, true);
    auto s2 = a->post_send(1, tag + 1, m2.data(), big, {}, true);
    try {
      b->wait(r2, 10);
      a->wait(s2, 10);
      a->wait(s1, 10);
      check(g2 == m2, "3: the waited-for 4 MiB receive differs");
    } catch (const Error& e) {
      check(false, std::string("3: a blocking wait after polling failed: ") + e.what());
    }
    tag += 2;
  }

  // 4. Two pollers on b at once while a streams to both.
  {
    const int per = 64;
    const size_t n = 64 << 10;
    std::vector<std::vector<uint8_t>> msgs, got(2 * per, std::vector<uint8_t>(n, 0));
    for (int i = 0; i < 2 * per; i++) msgs.push_back(pattern(n, 1000 + static_cast<uint32_t>(i)));
    std::vector<std::shared_ptr<Request>> recvs(2 * per);
    for (int i = 0; i < 2 * per; i++) recvs[i] = b->post_recv(0, tag + static_cast<uint64_t>(i), got[i].data(), n, {}, true);
    std::atomic<int> late{0};
    auto poller = [&](int first) {
      for (int i = first; i < 2 * per; i += 2)
        if (!poll(*b, recvs[i], 20)) late++;
    };
    std::thread t0(poller, 0), t1(poller, 1);
    std::vector<std::shared_ptr<Request>> sends;
    for (int i = 0; i < 2 * per; i++) sends.push_back(a->post_send(1, tag + static_cast<uint64_t>(i), msgs[i].data(), n, {}, true));
    for (auto& s : sends) check(poll(*a, s, 20), "4: a send did not finish");
    t0.join();
    t1.join();
    check(late.load() == 0, "4: " + std::to_string(late.load()) + " polled receives did not finish");
    int wrong = 0;
    for (int i = 0; i < 2 * per; i++) wrong += recvs[i]->finished() && !recvs[i]->failed() && got[i] == msgs[i] ? 0 : 1;
    check(wrong == 0, "4: " + std::to_string(wrong) + " receives failed or differ");
    tag += 2 * per;
  }

  // Both sides' sends are acknowledged before either closes.
  std::vector<uint8_t> one(1);
  auto last = a->post_recv(1, 1u << 30, one.data(), 1, {}, true);
  auto ls = b->post_send(0, 1u << 30, one.data(), 1, {}, true);
  check(poll(*a, last) && poll(*b, ls), "the closing message did not arrive");
  a->close();
  b->close();
  return checks_passed("test_endpoint_poll");
}
