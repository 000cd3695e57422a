// The harness's close and many-thread cases (tests/test_nccl_plugin.py): what NCCL does to a
// plugin besides its steady state. Two ranks.
//
// close_race (--iters N, --seed S): every iteration opens one connection between the ranks and
// both close their ends at points drawn from the seed (both ranks draw the same): the sender
// right after connect returned (before any handshake), right after its sends were reported
// done, with sends still posted, or during a rail fault (R2CCL_TEST_FAULT_FILE); the receiver
// by closing its listen before it ever accepted, right after accept, with receives posted, or
// after every message resolved. Checked: the process never ends, no accept waits past
// --accept-bound (1 s), no request past --bound (3 s), and every send test() reported done is
// delivered bit for bit to a receiver that stayed (its receive completes), while a receive that
// fails names its cause in the plugin's log.
//
// many (--threads T --comms C --rounds R): T threads per rank, each connecting to and
// accepting from each of C communicators' listen comms, shared by the T threads (a proxy
// serving several communicators at once); every accept within --accept-bound, messages that
// name their sender thread and sequence checked bit for bit, so a connection handed to the
// wrong thread or mixed with another is caught; closes from every thread at once.
#include <cinttypes>
#include <map>
#include <random>
#include <set>

#include "harness.h"

namespace harness {

namespace {

double g_bound_s = 3.0;          // --bound: most any request may take to resolve
double g_accept_bound_s = 1.0;   // --accept-bound: most an accept may take to return a comm or fail

// A file fetched with a short poll (iterations are many and short).
std::string fetch_fast(const std::string& name) { return fetch(name, 300); }

void sync_point(const std::string& what) {
  publish("sync." + what + "." + std::to_string(g_rank), "1");
  fetch_fast("sync." + what + "." + std::to_string(1 - g_rank));
}

void fault(const std::string& line) {
  const char* path = std::getenv("R2CCL_TEST_FAULT_FILE");
  if (!path) return;
  std::ofstream f(std::string(path) + ".tmp");
  f << line << "\n";
  f.close();
  check(std::rename((std::string(path) + ".tmp").c_str(), path) == 0, "fault file");
}

enum SenderClose { kAtConnect, kAfterDone, kPosted, kDuringFault, kAfterReceiver, kSenderModes };
enum ReceiverClose { kListenEarly, kAtAccept, kRecvPosted, kAfterAll, kReceiverModes };
const char* const kSenderNames[] = {"at-connect", "after-done", "sends-posted", "during-fault", "after-receiver"};
const char* const kReceiverNames[] = {"listen-before-accept", "at-accept", "receives-posted", "after-all"};

struct Plan {
  int sender = 0;
  SenderClose s = kAfterDone;
  ReceiverClose r = kAfterAll;
  std::vector<size_t> sizes;   // the sender's messages
  int wait_first = 0;          // kPosted / kRecvPosted: how many to wait for before closing
  bool reg = false;            // register the buffers (regMr) first
};

Plan draw(uint64_t seed, int iter) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(iter));
  Plan p;
  p.sender = static_cast<int>(rng() % 2);
  p.s = static_cast<SenderClose>(rng() % kSenderModes);
  p.r = static_cast<ReceiverClose>(rng() % kReceiverModes);
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; i++) {
    const int cls = static_cast<int>(rng() % 3);
    p.sizes.push_back(cls == 0 ? 0 : cls == 1 ? 1 + rng() % (32 << 10) : (32 << 10) + 1 + rng() % (224 << 10));
  }
  p.wait_first = static_cast<int>(rng() % (n + 1));
  p.reg = rng() % 2;
  return p;
}

constexpr size_t kMaxMsg = 256 << 10;

uint8_t msg_byte(int iter, int msg, size_t i) { return pattern(7, static_cast<uint64_t>(iter) * 16 + msg, i); }

// Polls a request until done, an error, or the bound: 1 done, -1 failed (cause logged), dies past it.
int resolve(void* req, const std::string& what, int* size = nullptr) {
  const double until = now_s() + g_bound_s;
  int done = 0, sizes[kTestSizes] = {};
  for (;;) {
    const Result r = net.d().test(req, &done, sizes);
    if (r != kSuccess) return -1;
    if (done) {
      if (size) *size = sizes[0];
      return 1;
    }
    check(now_s() < until, what + ": neither done nor failed within " + std::to_string(g_bound_s) + " s");
    std::this_thread::yield();
  }
}

struct Tally {
  uint64_t iters = 0, delivered = 0, bytes = 0, failed_recvs = 0, sends_done = 0;
  double worst_accept_s = 0, worst_close_s = 0;
  std::map<std::string, uint64_t> cells;
};

void sender_side(int iter, const Plan& p, Tally& t) {
  uint8_t handle[kHandleMaxBytes];
  unhex(fetch_fast("cr." + std::to_string(iter) + ".handle"), handle);
  void* sc = nullptr;
  const double until = now_s() + g_bound_s;
  while (!sc) {
    check(net.connect_once(handle, &sc) == kSuccess, "connect failed");
    check(sc || now_s() < until, "connect returned no comm within the bound");
  }
  std::string done_mask(p.sizes.size(), '0');
  std::vector<std::vector<uint8_t>> bufs(p.sizes.size());
  std::vector<void*> mh(p.sizes.size(), nullptr);
  if (p.s != kAtConnect) {
    if (p.s == kDuringFault) fault("close 0");
    std::vector<void*> reqs;
    for (size_t j = 0; j < p.sizes.size(); j++) {
      bufs[j].resize(std::max<size_t>(p.sizes[j], 1));
      for (size_t i = 0; i < p.sizes[j]; i++) bufs[j][i] = msg_byte(iter, static_cast<int>(j), i);
      if (p.reg) check(net.d().reg_mr(sc, bufs[j].data(), bufs[j].size(), kPtrHost, &mh[j]) == kSuccess, "regMr");
      void* req = nullptr;
      const double post_until = now_s() + g_bound_s;
      while (!req) {
        check(net.d().isend(sc, bufs[j].data(), p.sizes[j], 0, mh[j], nullptr, &req) == kSuccess, "isend");
        check(req || now_s() < post_until, "isend back-pressure past the bound");
      }
      reqs.push_back(req);
    }
    const size_t wait = p.s == kPosted ? static_cast<size_t>(p.wait_first) : reqs.size();
    for (size_t j = 0; j < wait; j++) {
      if (resolve(reqs[j], "send " + std::to_string(j) + " of iteration " + std::to_string(iter)) != 1) break;
      done_mask[j] = '1';
      t.sends_done++;
    }
    if (p.s == kDuringFault) fault("heal 0");
  }
  // What test() reported done, published before the close: the receiver holds us to it.
  publish("cr." + std::to_string(iter) + ".done", "m" + done_mask);
  if (p.s == kAfterReceiver) fetch_fast("cr." + std::to_string(iter) + ".received");
  const double t0 = now_s();
  for (void* m : mh)   // NCCL deregisters a connection's buffers, then closes it
    if (m) check(net.d().dereg_mr(sc, m) == kSuccess, "deregMr");
  check(net.d().close_send(sc) == kSuccess, "closeSend");
  t.worst_close_s = std::max(t.worst_close_s, now_s() - t0);
}

void receiver_side(int iter, const Plan& p, Tally& t) {
  uint8_t handle[kHandleMaxBytes];
  std::memset(handle, 0xcc, sizeof handle);
  void* lc = nullptr;
  net.listen(handle, &lc);
  publish("cr." + std::to_string(iter) + ".handle", hex(handle, sizeof handle));
  if (p.r == kListenEarly) {
    check(net.d().close_listen(lc) == kSuccess, "closeListen");
    publish("cr." + std::to_string(iter) + ".received", "x");
    return;
  }
  void* rc = nullptr;
  const double a0 = now_s();
  for (;;) {
    DeviceHandle* dh = nullptr;
    const Result r = net.d().accept(lc, &rc, &dh);
    if (r != kSuccess || rc) break;
    check(now_s() - a0 < g_accept_bound_s, "accept neither returned a comm nor failed within " +
                                               std::to_string(g_accept_bound_s) + " s (sender closes " +
                                               kSenderNames[p.s] + ")");
    std::this_thread::yield();
  }
  t.worst_accept_s = std::max(t.worst_accept_s, now_s() - a0);
  check(net.d().close_listen(lc) == kSuccess, "closeListen");
  if (!rc) {   // accept failed: its cause was logged
    publish("cr." + std::to_string(iter) + ".received", "x");
    return;
  }
  std::vector<std::vector<uint8_t>> bufs(p.sizes.size(), std::vector<uint8_t>(kMaxMsg));
  std::vector<void*> mh(p.sizes.size(), nullptr), reqs;
  if (p.r != kAtAccept) {
    for (size_t j = 0; j < p.sizes.size(); j++) {
      if (p.reg) check(net.d().reg_mr(rc, bufs[j].data(), kMaxMsg, kPtrHost, &mh[j]) == kSuccess, "regMr");
      void* d = bufs[j].data();
      size_t size = kMaxMsg;
      int tag = 0;
      void* req = nullptr;
      const double post_until = now_s() + g_bound_s;
      while (!req) {
        check(net.d().irecv(rc, 1, &d, &size, &tag, &mh[j], nullptr, &req) == kSuccess, "irecv");
        check(req || now_s() < post_until, "irecv back-pressure past the bound");
      }
      reqs.push_back(req);
    }
  }
  std::string got(p.sizes.size(), '0');
  const size_t wait = p.r == kRecvPosted ? static_cast<size_t>(p.wait_first) : reqs.size();
  bool failed = false;
  for (size_t j = 0; j < wait && !failed; j++) {
    int size = -1;
    const int r = resolve(reqs[j], "receive " + std::to_string(j) + " of iteration " + std::to_string(iter) +
                                       " (sender closes " + kSenderNames[p.s] + ")", &size);
    if (r != 1) {
      failed = true;
      t.failed_recvs++;
      const std::string why = last_failure();
      check(why.find("closed") != std::string::npos || why.find("goodbye") != std::string::npos ||
                why.find("cancelled") != std::string::npos || why.find("R2CCL_TIMEOUT") != std::string::npos,
            "a failed receive of iteration " + std::to_string(iter) + " logged no clear cause: '" + why + "'");
      break;
    }
    check(size == static_cast<int>(p.sizes[j]), "iteration " + std::to_string(iter) + " message " +
                                                    std::to_string(j) + ": " + std::to_string(size) + " bytes, sent " +
                                                    std::to_string(p.sizes[j]));
    for (size_t i = 0; i < p.sizes[j]; i++)
      if (bufs[j][i] != msg_byte(iter, static_cast<int>(j), i))
        die("iteration " + std::to_string(iter) + " message " + std::to_string(j) + ": byte " + std::to_string(i) +
            " differs");
    got[j] = '1';
    t.delivered++;
    t.bytes += p.sizes[j];
  }
  publish("cr." + std::to_string(iter) + ".received", "x");
  // A receiver that stayed for every message: every send reported done reached it.
  if (p.r == kAfterAll) {
    const std::string mask = fetch_fast("cr." + std::to_string(iter) + ".done").substr(1);
    for (size_t j = 0; j < mask.size(); j++)
      check(mask[j] != '1' || got[j] == '1',
            "LOST: iteration " + std::to_string(iter) + ": send " + std::to_string(j) + " (" +
                std::to_string(p.sizes[j]) + " bytes) was reported done but never arrived (sender closed " +
                kSenderNames[p.s] + "; last failure logged: " + last_failure() + ")");
  }
  const double t0 = now_s();
  for (void* m : mh)
    if (m) check(net.d().dereg_mr(rc, m) == kSuccess, "deregMr");
  check(net.d().close_recv(rc) == kSuccess, "closeRecv");
  t.worst_close_s = std::max(t.worst_close_s, now_s() - t0);
}

// One patterned message each way over `c` (this rank's bytes keyed by `key`), checked bit for bit.
void exchange_one(Conn& c, size_t len, uint64_t key, const std::string& what) {
  std::vector<uint8_t> out(len), in(len);
  for (size_t k = 0; k < len; k++) out[k] = pattern(g_rank, key, k);
  void *sreq = nullptr, *rreq = nullptr, *d = in.data();
  size_t size = in.size();
  int tag = 0;
  check(net.d().irecv(c.recv, 1, &d, &size, &tag, nullptr, nullptr, &rreq) == kSuccess && rreq, what + ": irecv");
  check(net.d().isend(c.send, out.data(), out.size(), 0, nullptr, nullptr, &sreq) == kSuccess && sreq, what + ": isend");
  check(resolve(sreq, what + ": send") == 1 && resolve(rreq, what + ": receive") == 1, what + ": failed");
  for (size_t k = 0; k < len; k++) check(in[k] == pattern(1 - g_rank, key, k), what + ": bytes differ");
}

}  // namespace

void case_close_race(uint64_t seed, int iters, double bound_s, double accept_bound_s) {
  check(g_world == 2, "close_race runs on 2 ranks");
  g_bound_s = bound_s;
  g_accept_bound_s = accept_bound_s;
  net.init();
  Tally t;
  const double t0 = now_s();
  for (int iter = 0; iter < iters; iter++) {
    const Plan p = draw(seed, iter);
    if (g_rank == p.sender) sender_side(iter, p, t);
    else receiver_side(iter, p, t);
    t.iters++;
    t.cells[std::string(kSenderNames[p.s]) + "/" + kReceiverNames[p.r]]++;
    // Each iteration's files go before the next (tens of thousands would slow the directory).
    sync_point(std::to_string(iter));
    if (g_rank == 0)
      for (const char* f : {"handle", "done", "received"}) std::remove((g_dir + "/cr." + std::to_string(iter) + "." + f).c_str());
    if (iter > 0)
      std::remove((g_dir + "/sync." + std::to_string(iter - 1) + "." + std::to_string(g_rank)).c_str());
  }
  sync_point("close-race-end");
  net.finalize();
  std::printf("harness: close_race rank %d: ok (%" PRIu64 " iterations in %.1f s over %zu cells; %" PRIu64
              " messages delivered exactly (%" PRIu64 " bytes), %" PRIu64 " sends reported done, %" PRIu64
              " receives failed with a cause; slowest accept %.3f s, slowest close %.3f s)\n",
              g_rank, t.iters, now_s() - t0, t.cells.size(), t.delivered, t.bytes, t.sends_done, t.failed_recvs,
              t.worst_accept_s, t.worst_close_s);
}

// ------------------------------------------------------------------ a throw on the engine thread

// Rank 0's plugin throws on its engine thread while handling connection A (the fault file's
// "throw"): A's requests fail there with an error naming an internal error, and the process,
// its engine and a later connection B go on (B moves exact bytes both ways).
void case_contain(uint64_t seed) {
  check(g_world == 2, "contain runs on 2 ranks");
  net.init();
  Conn a = connect_ring("contain-a");
  std::vector<uint8_t> buf(4096, 0x11);
  if (g_rank == 0) {
    const int before = g_faults_logged.load();
    fault("throw");
    const double until = now_s() + g_timeout_s;
    while (g_faults_logged.load() == before) {
      check(now_s() < until, "the plugin did not apply the fault 'throw'");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // A request on A fails (after the engine's next tick) with the cause in the log.
    bool failed = false;
    for (int attempt = 0; attempt < 2000 && !failed; attempt++) {
      void* req = nullptr;
      check(net.d().isend(a.send, buf.data(), buf.size(), 0, nullptr, nullptr, &req) == kSuccess && req, "isend on A");
      failed = resolve(req, "a send on the failed connection") != 1;
      if (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    check(failed, "connection A still works after the engine thread threw on it");
    check(last_failure().find("internal error on the progress engine") != std::string::npos,
          "A's failure logged no cause naming the internal error: '" + last_failure() + "'");
  }
  barrier("contain-failed");
  Conn b = connect_ring("contain-b");
  for (int m = 0; m < 20; m++) exchange_one(b, 4096, seed + m, "connection B");
  barrier("contain-done");
  close_conn(b);
  close_conn(a);
  net.finalize();
  std::printf("harness: contain rank %d: ok (%s; a later connection moved 20 messages exactly)\n", g_rank,
              g_rank == 0 ? "the connection the engine threw on failed with its cause" : "the peer's throw ended its connection only");
}

// ------------------------------------------------------------------ a progress thread that never rests

// NCCL's progress thread calls test() in a tight loop while its proxy thread connects: here a
// thread polls a receive that nothing will match for the whole case, on each rank, while the
// main thread opens 20 connection pairs one after another and moves a message over each.
// Every connect + accept within --accept-bound: the spinning caller never keeps the engine
// thread (commands, timers, heartbeats) from its turn.
void case_spin(uint64_t seed, double accept_bound_s) {
  check(g_world == 2, "spin runs on 2 ranks");
  net.init();
  Conn idle = connect_ring("spin-idle");
  std::atomic<bool> stop{false};
  std::vector<uint8_t> sink(4096);
  std::thread spinner([&] {
    void *d = sink.data(), *req = nullptr;
    size_t size = sink.size();
    int tag = 0;
    check(net.d().irecv(idle.recv, 1, &d, &size, &tag, nullptr, nullptr, &req) == kSuccess && req, "irecv");
    int done = 0, sizes[kTestSizes] = {};
    while (!stop.load() && !done) check(net.d().test(req, &done, sizes) == kSuccess, "test on the idle connection");
    check(!done, "the idle receive completed: nothing was sent to it");
  });
  double worst = 0;
  for (int i = 0; i < 20; i++) {
    const double t0 = now_s();
    Conn c = connect_ring("spin-" + std::to_string(i));
    exchange_one(c, 1024, seed + i, "spin " + std::to_string(i));
    const double took = now_s() - t0;
    worst = std::max(worst, took);
    check(took < accept_bound_s, "connection " + std::to_string(i) + " took " + std::to_string(took) +
                                     " s to connect, accept and move a message while a thread spins on test()");
    barrier("spin-" + std::to_string(i));
    close_conn(c);
  }
  stop = true;
  spinner.join();
  barrier("spin-done");
  close_conn(idle);
  net.finalize();
  std::printf("harness: spin rank %d: ok (20 connections opened beside a thread spinning on test(); slowest %.3f s)\n",
              g_rank, worst);
}

// ------------------------------------------------------------------ many threads, many comms

namespace {

// A message's first 16 bytes name it: round, comm, sender rank and thread, sequence.
struct Stamp {
  uint32_t round, comm, who, seq;
};

void stamp_fill(std::vector<uint8_t>& b, size_t n, const Stamp& s) {
  std::memcpy(b.data(), &s, sizeof s);
  const uint64_t key = (static_cast<uint64_t>(s.round) << 40) ^ (static_cast<uint64_t>(s.comm) << 28) ^
                       (static_cast<uint64_t>(s.who) << 12) ^ s.seq;
  for (size_t i = sizeof s; i < n; i++) b[i] = pattern(3, key, i);
}

bool stamp_check(const std::vector<uint8_t>& b, size_t n, Stamp* s) {
  if (n < sizeof(Stamp)) return false;
  std::memcpy(s, b.data(), sizeof *s);
  const uint64_t key = (static_cast<uint64_t>(s->round) << 40) ^ (static_cast<uint64_t>(s->comm) << 28) ^
                       (static_cast<uint64_t>(s->who) << 12) ^ s->seq;
  for (size_t i = sizeof *s; i < n; i++)
    if (b[i] != pattern(3, key, i)) return false;
  return true;
}

}  // namespace

void case_many(uint64_t seed, int threads, int comms, int rounds, double accept_bound_s) {
  check(g_world == 2, "many runs on 2 ranks");
  for (int c = 0; c < comms; c++) net.init();   // one init per communicator, as NCCL does
  const int peer = 1 - g_rank;
  std::atomic<double> worst_accept{0};
  std::atomic<uint64_t> bytes{0};
  const double t0 = now_s();
  for (int round = 0; round < rounds; round++) {
    std::vector<void*> lcs(comms, nullptr);
    std::vector<std::vector<uint8_t>> theirs(comms, std::vector<uint8_t>(kHandleMaxBytes));
    for (int c = 0; c < comms; c++) {
      uint8_t h[kHandleMaxBytes];
      std::memset(h, 0xcc, sizeof h);
      net.listen(h, &lcs[c]);
      publish("many." + std::to_string(round) + "." + std::to_string(c) + "." + std::to_string(g_rank), hex(h, sizeof h));
    }
    for (int c = 0; c < comms; c++)
      unhex(fetch_fast("many." + std::to_string(round) + "." + std::to_string(c) + "." + std::to_string(peer)),
            theirs[c].data());
    // from[c]: which of the peer's threads each accepted connection of communicator c carried.
    std::mutex from_mu;
    std::vector<std::set<uint32_t>> from(comms);
    std::vector<std::thread> ts;
    for (int th = 0; th < threads; th++) {
      ts.emplace_back([&, th] {
        std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(round) * 131 + static_cast<uint64_t>(th) * 17 + g_rank);
        for (int c = 0; c < comms; c++) {
          void *sc = nullptr, *rc = nullptr;
          const double a0 = now_s();
          while (!sc || !rc) {
            if (!sc) check(net.connect_once(theirs[c].data(), &sc) == kSuccess, "connect failed");
            if (!rc) {
              DeviceHandle* dh = nullptr;
              check(net.d().accept(lcs[c], &rc, &dh) == kSuccess, "accept failed");
            }
            const double took = now_s() - a0;
            check(took < accept_bound_s, "round " + std::to_string(round) + " comm " + std::to_string(c) + " thread " +
                                             std::to_string(th) + ": connect/accept not done within " +
                                             std::to_string(accept_bound_s) + " s");
            if (!sc || !rc) std::this_thread::sleep_for(std::chrono::microseconds(100));
          }
          const double took = now_s() - a0;
          for (double w = worst_accept.load(); took > w && !worst_accept.compare_exchange_weak(w, took);) {
          }
          const int n = 4;
          std::vector<std::vector<uint8_t>> out(n), in(n, std::vector<uint8_t>(64 << 10));
          std::vector<void*> sreq(n), rreq(n);
          const uint32_t who = static_cast<uint32_t>(g_rank * 1000 + th);
          for (int m = 0; m < n; m++) {
            const size_t len = sizeof(Stamp) + rng() % ((64 << 10) - sizeof(Stamp));
            out[m].resize(len);
            stamp_fill(out[m], len, Stamp{static_cast<uint32_t>(round), static_cast<uint32_t>(c), who, static_cast<uint32_t>(m)});
            void* d = in[m].data();
            size_t sz = in[m].size();
            int tag = 0;
            sreq[m] = rreq[m] = nullptr;
            while (!rreq[m]) check(net.d().irecv(rc, 1, &d, &sz, &tag, nullptr, nullptr, &rreq[m]) == kSuccess, "irecv");
            while (!sreq[m]) check(net.d().isend(sc, out[m].data(), len, 0, nullptr, nullptr, &sreq[m]) == kSuccess, "isend");
          }
          uint32_t sender = UINT32_MAX;
          for (int m = 0; m < n; m++) {
            wait_req(sreq[m], "many: send");
            const int size = wait_req(rreq[m], "many: receive");
            Stamp s{};
            check(stamp_check(in[m], static_cast<size_t>(size), &s), "many: a message's bytes differ (cross-talk?)");
            check(s.round == static_cast<uint32_t>(round) && s.comm == static_cast<uint32_t>(c) && s.seq == static_cast<uint32_t>(m) &&
                      s.who / 1000 == static_cast<uint32_t>(peer),
                  "many: round " + std::to_string(round) + " comm " + std::to_string(c) + " message " + std::to_string(m) +
                      " came stamped round " + std::to_string(s.round) + " comm " + std::to_string(s.comm) + " seq " +
                      std::to_string(s.seq) + " from " + std::to_string(s.who) + " (cross-talk)");
            check(sender == UINT32_MAX || sender == s.who, "many: one connection carried two threads' messages");
            sender = s.who;
            bytes += static_cast<uint64_t>(size);
          }
          {
            std::lock_guard<std::mutex> g(from_mu);
            check(from[c].insert(sender).second, "many: two connections of one communicator carried one thread's messages");
          }
          check(net.d().close_send(sc) == kSuccess, "closeSend");
          check(net.d().close_recv(rc) == kSuccess, "closeRecv");
        }
      });
    }
    for (auto& t : ts) t.join();
    for (int c = 0; c < comms; c++) {
      check(from[c].size() == static_cast<size_t>(threads), "many: not every thread of the peer was heard on a communicator");
      check(net.d().close_listen(lcs[c]) == kSuccess, "closeListen");
    }
    sync_point("many-" + std::to_string(round));
  }
  for (int c = 0; c < comms; c++) net.finalize();
  std::printf("harness: many rank %d: ok (%d threads x %d communicators x %d rounds in %.1f s; slowest connect+accept "
              "%.3f s; %" PRIu64 " bytes exact)\n",
              g_rank, threads, comms, rounds, now_s() - t0, worst_accept.load(), bytes.load());
}

}  // namespace harness
