// The NCCL net plugin's conformance harness: no NCCL and no GPU. It dlopens the built plugin,
// looks up a table (ncclNetPlugin_v12, _v11 or _v10) and drives it the way NCCL 2.30's proxy
// does (NVIDIA/nccl v2.30.7-1):
//   - init per communicator, devices() then getProperties() into an uninitialised struct
//     (src/plugin/net.cc ncclNetPluginInit, src/graph/topo.cc);
//   - listen() on the receiving side, the handle carried out of band (here: a file in --dir),
//     connect() and accept() called again and again until they return a comm, then
//     closeListen() at once (src/transport/net.cc sendProxyConnect / recvProxyConnect);
//   - regMr() of the connection's buffers, NCCL_PTR_HOST (sendProxyConnect, recvProxyConnect);
//   - the SIMPLE protocol's steps: NCCL_STEPS (8) slots per connection, isend/irecv posted while
//     fewer than 8 are in flight, a NULL request taken as "post again later", test() polled
//     until done, sizes[] from test() (sendProxyProgress / recvProxyProgress);
//   - deregMr() and closeSend()/closeRecv() at the end, finalize() per init.
// Each process is one rank of a ring: it receives from rank-1 and sends to rank+1. Cases
// (--case): properties, p2p (random sizes, receives larger than sends, zero bytes, back-pressure,
// 32 requests outstanding), ring (an all-reduce and an all-gather through the slots, bit for
// bit), threads (connect/accept on a service thread while a progress thread moves data on
// other connections), close (close with requests in flight), reload (finalize, dlclose, dlopen,
// again), faults (the survivable faults through R2CCL_TEST_FAULT_FILE while traffic streams,
// every byte exact), fatal (every NIC held down past R2CCL_TIMEOUT: an error on both sides),
// bandwidth (a stream and a round trip, timed; --idle-conns and --idle-s add idle connections
// and idle time) and loop (the ring and an all-to-all over and over while a test injects
// faults from outside: tests/test_nccl_plugin_testbed.py; --rings N: N rings on devices --dev,
// --dev+1, ... as a process driving several GPUs has them). Prints
// "harness: <case> rank R: ok ..." or "FAIL: ..." and exits 1.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using namespace harness;

namespace {

// ------------------------------------------------------------------ cases

void case_properties() {
  for (int round = 0; round < 2; round++) {   // init twice, finalize twice: the same answers
    net.init();
    net.init();
    const int n = net.devices();
    check(n == g_devices, "devices() = " + std::to_string(n) + ", expected " + std::to_string(g_devices));
    std::vector<uint64_t> guids;
    for (int dev = 0; dev < n; dev++) {
      PropertiesHead h;
      std::memset(&h, 0xa5, sizeof h);   // NCCL's struct is uninitialised: every field must be set
      size_t max_p2p = 0;
      Result r;
      if (net.v12) {
        PropertiesV12 p;
        std::memset(&p, 0xa5, sizeof p);
        r = net.v12->get_properties(dev, &p);
        h = p.head;
        max_p2p = p.max_p2p_bytes;
        check(p.rail_id == kIdUndef && p.plane_id == kIdUndef && p.max_multi_request_size == 1, "v12 fields");
        check(p.vprops.ndevs == 1 && p.vprops.devs[0] == dev, "vProps");
      } else if (net.v11) {
        PropertiesV11 p;
        std::memset(&p, 0xa5, sizeof p);
        r = net.v11->get_properties(dev, &p);
        h = p.head;
        max_p2p = p.max_p2p_bytes;
        check(p.max_multi_request_size == 1, "v11 fields");
      } else {
        PropertiesV10 p;
        std::memset(&p, 0xa5, sizeof p);
        r = net.v10->get_properties(dev, &p);
        h = p.head;
        max_p2p = p.max_p2p_bytes;
      }
      check(r == kSuccess, "getProperties");
      // Fused: "r2ccl"; per NIC: "r2ccl:<interface>", each its own guid.
      check(h.name && (n == 1 ? std::string(h.name) == "r2ccl" : std::string(h.name).rfind("r2ccl:", 0) == 0),
            std::string("name ") + (h.name ? h.name : "(null)"));
      check(std::find(guids.begin(), guids.end(), h.guid) == guids.end(), "two devices with one guid");
      guids.push_back(h.guid);
      check(h.ptr_support == kPtrHost && h.max_recvs == 1 && h.device_type == kDeviceHost && h.reg_is_global == 0 &&
                h.force_flush == 0 && h.speed_mbps > 0 && h.max_comms > 0 && h.latency_us == 0.0f,
            "the device's properties");
      check(max_p2p > 0 && max_p2p <= kMaxNetSizeBytes, "maxP2pBytes in NCCL's bounds");
      check(h.pci_path == nullptr || std::strncmp(h.pci_path, "/sys/", 5) == 0, "pciPath is a sysfs path or NULL");
    }
    check(std::string(net.name()) == "r2ccl", "the table's name");
    {   // a device past the last: an error, no listen comm
      uint8_t handle[kHandleMaxBytes];
      void* lc = nullptr;
      void* ctx = net.ctxs.back();
      Result r = net.v12 ? net.v12->listen(ctx, n, handle, &lc) : net.v11 ? net.v11->listen(ctx, n, handle, &lc)
                                                                     : net.v10->listen(n, handle, &lc);
      check(r != kSuccess && lc == nullptr, "listen on device " + std::to_string(n) + " of " + std::to_string(n) + " succeeded");
    }
    net.finalize();
    net.finalize();
  }
  std::printf("harness: properties rank %d: ok (table v%d)\n", g_rank, g_table);
}

// NCCL's SIMPLE protocol on one connection pair: `steps` messages each way through 8 slots.
// sizes[i] is message i's size (the receiver posts its slot's full size: receives larger than
// sends); returns the bytes checked.
uint64_t run_steps(Conn& c, const std::vector<size_t>& sizes, size_t slot_bytes, int slots, int tag_base) {
  std::vector<std::vector<uint8_t>> sbuf(slots, std::vector<uint8_t>(slot_bytes)), rbuf(slots, std::vector<uint8_t>(slot_bytes));
  std::vector<void*> smh(slots), rmh(slots);
  for (int s = 0; s < slots; s++) {
    check(net.d().reg_mr(c.send, sbuf[s].data(), slot_bytes, kPtrHost, &smh[s]) == kSuccess, "regMr send");
    check(net.d().reg_mr(c.recv, rbuf[s].data(), slot_bytes, kPtrHost, &rmh[s]) == kSuccess, "regMr recv");
  }
  const size_t n = sizes.size();
  std::vector<void*> sreq(slots, nullptr), rreq(slots, nullptr);
  size_t sent = 0, sdone = 0, rposted = 0, rdone = 0;
  uint64_t checked = 0;
  const int prev = (g_rank + g_world - 1) % g_world;
  const double until = now_s() + g_timeout_s;
  int backpressure = 0;
  while (sdone < n || rdone < n) {
    check(now_s() < until, "steps not done within the timeout (sent " + std::to_string(sdone) + ", received " +
                               std::to_string(rdone) + " of " + std::to_string(n) + ")");
    // Post: a slot is free when its previous request is done.
    if (sent < n && sent - sdone < static_cast<size_t>(slots)) {
      const int s = static_cast<int>(sent % slots);
      for (size_t i = 0; i < sizes[sent]; i++) sbuf[s][i] = pattern(g_rank, sent + tag_base, i);
      void* req = nullptr;
      check(net.d().isend(c.send, sizes[sent] ? sbuf[s].data() : nullptr, sizes[sent], g_rank, smh[s], nullptr, &req) == kSuccess,
            "isend");
      if (req) {
        sreq[s] = req;
        sent++;
      } else {
        backpressure++;
      }
    }
    if (rposted < n && rposted - rdone < static_cast<size_t>(slots)) {
      const int s = static_cast<int>(rposted % slots);
      std::memset(rbuf[s].data(), 0xee, slot_bytes);
      void* data = rbuf[s].data();
      size_t size = slot_bytes;
      int tag = prev;
      void* req = reinterpret_cast<void*>(kOptionalRecvCompletion);   // NCCL's LL hint: must be overwritten
      check(net.d().irecv(c.recv, 1, &data, &size, &tag, &rmh[s], nullptr, &req) == kSuccess, "irecv");
      check(req != reinterpret_cast<void*>(kOptionalRecvCompletion), "irecv left NCCL's hint in *request");
      if (req) {
        rreq[s] = req;
        rposted++;
      }
    }
    // Progress: test the oldest of each side.
    if (sdone < sent) {
      const int s = static_cast<int>(sdone % slots);
      int done = 0, size = -1;
      check(net.d().test(sreq[s], &done, &size) == kSuccess, "test(send)");
      if (done) {
        check(size == static_cast<int>(sizes[sdone]), "test(send) reported " + std::to_string(size) + " bytes of " +
                                                         std::to_string(sizes[sdone]));
        sdone++;
      }
    }
    if (rdone < rposted) {
      const int s = static_cast<int>(rdone % slots);
      int done = 0;
      int got[kTestSizes] = {};
      check(net.d().test(rreq[s], &done, got) == kSuccess, "test(recv)");
      if (done) {
        // The sender on the other side used the same sizes (same seed).
        const size_t want = sizes[rdone];
        check(got[0] == static_cast<int>(want), "received " + std::to_string(got[0]) + " bytes, sent " + std::to_string(want));
        for (size_t i = 0; i < want; i++)
          if (rbuf[s][i] != pattern(prev, rdone + tag_base, i))
            die("message " + std::to_string(rdone) + " byte " + std::to_string(i) + " differs");
        for (size_t i = want; i < slot_bytes; i++)
          if (rbuf[s][i] != 0xee) die("message " + std::to_string(rdone) + ": written past its size at " + std::to_string(i));
        checked += want;
        rdone++;
      }
    }
  }
  for (int s = 0; s < slots; s++) {
    check(net.d().dereg_mr(c.send, smh[s]) == kSuccess, "deregMr");
    check(net.d().dereg_mr(c.recv, rmh[s]) == kSuccess, "deregMr");
  }
  (void)backpressure;
  return checked;
}

std::vector<size_t> random_sizes(uint64_t seed, size_t n, size_t max) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> out(n);
  for (size_t i = 0; i < n; i++) {
    const uint64_t pick = rng() % 100;
    out[i] = pick < 5 ? 0 : pick < 40 ? rng() % 4096 : pick < 80 ? rng() % (max / 4) : rng() % (max + 1);
  }
  return out;
}

void case_p2p(uint64_t seed) {
  net.init();
  Conn c = connect_ring("p2p");
  const size_t slot = 1 << 20;
  uint64_t bytes = run_steps(c, random_sizes(seed, 400, slot), slot, 8, 0);
  // 32 requests outstanding per comm, then a NULL request (back-pressure), then all complete.
  std::vector<std::vector<uint8_t>> bufs(40, std::vector<uint8_t>(4096));
  std::vector<void*> mh(40);
  for (int i = 0; i < 40; i++) {
    check(net.d().reg_mr(c.send, bufs[i].data(), 4096, kPtrHost, &mh[i]) == kSuccess, "regMr");
    for (size_t k = 0; k < 4096; k++) bufs[i][k] = pattern(g_rank, 100000 + i, k);
  }
  std::vector<void*> reqs;
  void* req = nullptr;
  int posted = 0;
  for (; posted < 40; posted++) {
    check(net.d().isend(c.send, bufs[posted].data(), 4096, g_rank, mh[posted], nullptr, &req) == kSuccess, "isend");
    if (!req) break;
    reqs.push_back(req);
  }
  check(posted == kMaxRequests, "isend accepted " + std::to_string(posted) + " outstanding requests, NCCL allows " +
                                    std::to_string(kMaxRequests) + " and takes a NULL request as back-pressure");
  std::vector<std::vector<uint8_t>> rb(posted, std::vector<uint8_t>(8192, 0xee));
  std::vector<void*> rreqs;
  for (int i = 0; i < posted; i++) {
    void* data = rb[i].data();
    size_t size = 8192;
    int tag = 0;
    void* rr = nullptr;
    check(net.d().irecv(c.recv, 1, &data, &size, &tag, &mh[0], nullptr, &rr) == kSuccess && rr, "irecv");
    rreqs.push_back(rr);
  }
  for (void* r : reqs) check(wait_req(r, "send") == 4096, "send size");
  const int prev = (g_rank + g_world - 1) % g_world;
  for (int i = 0; i < posted; i++) {
    check(wait_req(rreqs[i], "recv") == 4096, "recv size");
    for (size_t k = 0; k < 4096; k++)
      if (rb[i][k] != pattern(prev, 100000 + i, k)) die("outstanding message " + std::to_string(i) + " differs");
    bytes += 4096;
  }
  for (int i = 0; i < 40; i++) net.d().dereg_mr(c.send, mh[i]);
  barrier("p2p-done");
  close_conn(c);
  net.finalize();
  std::printf("harness: p2p rank %d: ok (%" PRIu64 " bytes checked, table v%d)\n", g_rank, bytes, g_table);
}

// A ring all-reduce (reduce-scatter, then all-gather) and an all-gather of `count` uint32 per
// rank, moved the way NCCL's SIMPLE protocol moves them: every step through one of 8
// registered slots of `slot_bytes`. uint32 sums wrap, so the result is exact in any order.
struct Ring {
  static constexpr size_t kSlotBytes = 256 << 10, kSlotElems = kSlotBytes / 4;
  static constexpr int kSlots = 8;
  Conn c;
  size_t count;
  bool gather = true;   // run() does the all-gather after the all-reduce
  double ar_s = 0;      // the last all-reduce's time on the wire (its steps, not making or checking data)
  std::vector<std::vector<uint32_t>> sbuf, rbuf;
  std::vector<void*> smh, rmh;
  uint64_t step_no = 0;

  Ring(Conn conn, size_t n)
      : c(conn), count(n), sbuf(kSlots, std::vector<uint32_t>(kSlotElems)), rbuf(kSlots, std::vector<uint32_t>(kSlotElems)),
        smh(kSlots), rmh(kSlots) {
    for (int s = 0; s < kSlots; s++) {
      ok(net.d().reg_mr(c.send, sbuf[s].data(), kSlotBytes, kPtrHost, &smh[s]), "regMr");
      ok(net.d().reg_mr(c.recv, rbuf[s].data(), kSlotBytes, kPtrHost, &rmh[s]), "regMr");
    }
  }
  void release() {
    for (int s = 0; s < kSlots; s++) {
      net.d().dereg_mr(c.send, smh[s]);
      net.d().dereg_mr(c.recv, rmh[s]);
    }
  }

  // One ring step: send [send_lo, send_hi) of vec, receive [recv_lo, recv_hi) and apply.
  void step(size_t send_lo, size_t send_hi, size_t recv_lo, size_t recv_hi, bool reduce, std::vector<uint32_t>& vec) {
    const size_t sn = send_hi - send_lo, rn = recv_hi - recv_lo;
    const size_t spieces = (sn + kSlotElems - 1) / kSlotElems, rpieces = (rn + kSlotElems - 1) / kSlotElems;
    size_t sp = 0, sd = 0, rp = 0, rd = 0;
    std::vector<void*> sreq(kSlots), rreq(kSlots);
    const double until = now_s() + g_timeout_s;
    while (sd < spieces || rd < rpieces) {
      check(now_s() < until, "ring step " + std::to_string(step_no) + " not done within the timeout");
      if (sp < spieces && sp - sd < static_cast<size_t>(kSlots)) {
        const int s = static_cast<int>((step_no * 64 + sp) % kSlots);
        const size_t a = send_lo + sp * kSlotElems, b = std::min(send_hi, a + kSlotElems);
        std::memcpy(sbuf[s].data(), vec.data() + a, (b - a) * 4);
        void* req = nullptr;
        ok(net.d().isend(c.send, sbuf[s].data(), (b - a) * 4, g_rank, smh[s], nullptr, &req), "isend");
        if (req) sreq[s] = req, sp++;
      }
      if (rp < rpieces && rp - rd < static_cast<size_t>(kSlots)) {
        const int s = static_cast<int>((step_no * 64 + rp) % kSlots);
        void* d = rbuf[s].data();
        size_t size = kSlotBytes;
        int tag = 0;
        void* req = nullptr;
        ok(net.d().irecv(c.recv, 1, &d, &size, &tag, &rmh[s], nullptr, &req), "irecv");
        if (req) rreq[s] = req, rp++;
      }
      if (sd < sp) {
        int done = 0, size = 0;
        const int s = static_cast<int>((step_no * 64 + sd) % kSlots);
        ok(net.d().test(sreq[s], &done, &size), "test(send)");
        if (done) sd++;
      }
      if (rd < rp) {
        int done = 0;
        int got[kTestSizes] = {};
        const int s = static_cast<int>((step_no * 64 + rd) % kSlots);
        ok(net.d().test(rreq[s], &done, got), "test(recv)");
        if (done) {
          const size_t a = recv_lo + rd * kSlotElems, b = std::min(recv_hi, a + kSlotElems);
          check(got[0] == static_cast<int>((b - a) * 4), "a ring piece of the wrong size");
          for (size_t i = a; i < b; i++) vec[i] = reduce ? vec[i] + rbuf[s][i - a] : rbuf[s][i - a];
          rd++;
        }
      }
    }
    step_no++;
  }

  static uint32_t value(uint64_t seed, int rank, size_t i) {
    return static_cast<uint32_t>(seed * 2654435761u + rank * 40503u + i * 2246822519u);
  }

  // The all-reduce and the all-gather of this seed's data, each checked element by element
  // against the sums and values every rank can compute; returns the bytes checked.
  uint64_t run(uint64_t seed) {
    const int P = g_world;
    std::vector<uint32_t> data(count);
    for (size_t i = 0; i < count; i++) data[i] = value(seed, g_rank, i);
    const size_t chunk = (count + P - 1) / P;
    auto lo = [&](int k) { return std::min(count, static_cast<size_t>(k) * chunk); };
    auto hi = [&](int k) { return std::min(count, static_cast<size_t>(k + 1) * chunk); };
    // All-reduce: P-1 reduce-scatter steps, P-1 all-gather steps.
    std::vector<uint32_t> ar = data;
    const double t0 = now_s();
    for (int k = 0; k < P - 1; k++) {
      const int sc = (g_rank - k + P) % P, rc = (g_rank - k - 1 + P) % P;
      step(lo(sc), hi(sc), lo(rc), hi(rc), true, ar);
    }
    for (int k = 0; k < P - 1; k++) {
      const int sc = (g_rank + 1 - k + P) % P, rc = (g_rank - k + P) % P;
      step(lo(sc), hi(sc), lo(rc), hi(rc), false, ar);
    }
    ar_s = now_s() - t0;
    for (size_t i = 0; i < count; i++) {
      uint32_t want = 0;
      for (int r = 0; r < P; r++) want += value(seed, r, i);
      if (ar[i] != want) die("all-reduce (seed " + std::to_string(seed) + ") element " + std::to_string(i) + " differs");
    }
    if (!gather) return 4 * count;
    // All-gather: each rank's first `chunk` elements end up everywhere, in rank order.
    std::vector<uint32_t> ag(chunk * P);
    for (size_t i = 0; i < chunk; i++) ag[g_rank * chunk + i] = data[i];
    for (int k = 0; k < P - 1; k++) {
      const int sc = (g_rank - k + P) % P, rc = (g_rank - k - 1 + P) % P;
      step(sc * chunk, (sc + 1) * chunk, rc * chunk, (rc + 1) * chunk, false, ag);
    }
    for (int r = 0; r < P; r++)
      for (size_t i = 0; i < chunk; i++)
        if (ag[r * chunk + i] != value(seed, r, i))
          die("all-gather (seed " + std::to_string(seed) + ") element " + std::to_string(r) + ":" + std::to_string(i) +
              " differs");
    return 4 * (count + chunk * P);
  }
};


// An all-to-all of `bytes` per pair over connect_mesh's connections: every rank posts its
// sends to and receives from every peer at once (so every rank always waits on every peer,
// the dead one included), 4 slots of 256 KiB per direction and peer, each piece checked.
struct Mesh {
  static constexpr size_t kSlotBytes = 256 << 10;
  static constexpr int kSlots = 4;
  std::vector<Conn> c;
  size_t bytes;
  std::vector<std::vector<std::vector<uint8_t>>> sbuf, rbuf;   // [peer][slot]
  std::vector<std::vector<void*>> smh, rmh;

  Mesh(std::vector<Conn> conns, size_t n) : c(std::move(conns)), bytes(n), sbuf(g_world), rbuf(g_world), smh(g_world), rmh(g_world) {
    for (int p = 0; p < g_world; p++) {
      if (p == g_rank) continue;
      sbuf[p].assign(kSlots, std::vector<uint8_t>(kSlotBytes));
      rbuf[p].assign(kSlots, std::vector<uint8_t>(kSlotBytes));
      smh[p].resize(kSlots);
      rmh[p].resize(kSlots);
      for (int s = 0; s < kSlots; s++) {
        ok(net.d().reg_mr(c[p].send, sbuf[p][s].data(), kSlotBytes, kPtrHost, &smh[p][s]), "regMr");
        ok(net.d().reg_mr(c[p].recv, rbuf[p][s].data(), kSlotBytes, kPtrHost, &rmh[p][s]), "regMr");
      }
    }
  }
  void release() {
    for (int p = 0; p < g_world; p++)
      for (size_t s = 0; s < smh[p].size(); s++) {
        net.d().dereg_mr(c[p].send, smh[p][s]);
        net.d().dereg_mr(c[p].recv, rmh[p][s]);
      }
  }
  void close() {
    for (int p = 0; p < g_world; p++)
      if (p != g_rank) close_conn(c[p]);
  }
  // Piece k from `from` to `to` in iteration `it`.
  static uint64_t msg(uint64_t it, int from, int to, uint64_t k) { return ((it * 64 + from) * 64 + to) * 4096 + k; }

  uint64_t run(uint64_t it) {
    const uint64_t pieces = (bytes + kSlotBytes - 1) / kSlotBytes;
    auto len = [&](uint64_t k) { return static_cast<size_t>(std::min<uint64_t>(kSlotBytes, bytes - k * kSlotBytes)); };
    struct Side {
      uint64_t posted = 0, done = 0;
      std::vector<void*> req = std::vector<void*>(kSlots);
    };
    std::vector<Side> snd(g_world), rcv(g_world);
    uint64_t checked = 0;
    const double until = now_s() + g_timeout_s;
    for (bool all = false; !all;) {
      check(now_s() < until, "all-to-all " + std::to_string(it) + " not done within the timeout");
      all = true;
      for (int p = 0; p < g_world; p++) {
        if (p == g_rank) continue;
        Side& S = snd[p];
        Side& R = rcv[p];
        if (S.posted < pieces && S.posted - S.done < static_cast<uint64_t>(kSlots)) {
          const int s = static_cast<int>(S.posted % kSlots);
          const size_t n = len(S.posted);
          const uint64_t m = msg(it, g_rank, p, S.posted);
          for (size_t i = 0; i < n; i++) sbuf[p][s][i] = pattern(g_rank, m, i);
          void* r = nullptr;
          ok(net.d().isend(c[p].send, sbuf[p][s].data(), n, g_rank, smh[p][s], nullptr, &r), "isend");
          if (r) S.req[s] = r, S.posted++;
        }
        if (R.posted < pieces && R.posted - R.done < static_cast<uint64_t>(kSlots)) {
          const int s = static_cast<int>(R.posted % kSlots);
          void* d = rbuf[p][s].data();
          size_t size = kSlotBytes;
          int tag = 0;
          void* r = nullptr;
          ok(net.d().irecv(c[p].recv, 1, &d, &size, &tag, &rmh[p][s], nullptr, &r), "irecv");
          if (r) R.req[s] = r, R.posted++;
        }
        if (S.done < S.posted) {
          int done = 0, size = 0;
          ok(net.d().test(S.req[S.done % kSlots], &done, &size), "test(send)");
          if (done) S.done++;
        }
        if (R.done < R.posted) {
          int done = 0;
          int got[kTestSizes] = {};
          const int s = static_cast<int>(R.done % kSlots);
          ok(net.d().test(R.req[s], &done, got), "test(recv)");
          if (done) {
            const size_t n = len(R.done);
            const uint64_t m = msg(it, p, g_rank, R.done);
            check(got[0] == static_cast<int>(n), "an all-to-all piece of the wrong size");
            for (size_t i = 0; i < n; i++)
              if (rbuf[p][s][i] != pattern(p, m, i))
                die("all-to-all " + std::to_string(it) + ": piece " + std::to_string(R.done) + " from rank " +
                    std::to_string(p) + " byte " + std::to_string(i) + " differs");
            checked += n;
            R.done++;
          }
        }
        all = all && S.done == pieces && R.done == pieces;
      }
    }
    return checked;
  }
};

void case_ring(uint64_t seed) {
  net.init();
  Ring ring(connect_ring("ring"), 1 << 20);   // 4 MiB per rank
  ring.run(seed);
  ring.release();
  barrier("ring-done");
  close_conn(ring.c);
  net.finalize();
  std::printf("harness: ring rank %d: ok (all-reduce and all-gather of %zu uint32 per rank over %d ranks, bit-exact)\n",
              g_rank, ring.count, g_world);
}

// The plugin's health snapshot (r2ccl_nccl_plugin_health_v1: its rails, their bytes and the
// bytes their transport copied) as one line, once the health monitor has sampled the rails
// after the traffic (R2CCL_MONITOR_MS; nothing without a monitor).
void print_health() {
  using Health = size_t (*)(char*, size_t);
  auto fn = reinterpret_cast<Health>(dlsym(net.lib, "r2ccl_nccl_plugin_health_v1"));
  const char* ms = std::getenv("R2CCL_MONITOR_MS");
  if (!fn || !ms || std::atoi(ms) <= 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * std::atoi(ms)));
  std::string j;
  for (size_t need = fn(nullptr, 0) + 4096;;) {   // (it may grow between the calls: a rail's new error)
    j.assign(need, '\0');
    const size_t n = fn(j.data(), j.size());
    if (n < j.size()) {
      j.resize(n);
      break;
    }
    need = n + 4096;
  }
  std::printf("harness: health %s\n", j.c_str());
}

// --case loop: the ring's all-reduce and all-gather (--collective ring; allreduce: the
// all-reduce alone, whose median time bench/testbed_nccl.sh sets beside its ring bound), an all-to-all over
// connections to every rank (alltoall) or both, over and over for --seconds, every iteration
// checked bit for bit; rank 0 decides after each iteration whether another follows, so all
// stop together. Publishes its pid (pid.R) and, on rank 0, when the loop starts
// (loop-started: the wall clock), for a test that injects faults from outside (the test bed's
// NICs, a signal). Prints the iterations, the median and the worst iteration time.
// --expect-error (the fatal cells; all-to-all only, so that every rank always has a request
// on the victim's connections): the loop runs until a plugin call returns an error, prints
// the wall clock of that moment, closes every connection (timed: close after an error must
// not hang) and passes; no error by --seconds fails.
void case_loop(uint64_t seed, double seconds, const std::string& coll, bool expect_error, uint64_t bytes, int nrings) {
  check(coll == "ring" || coll == "allreduce" || coll == "alltoall" || coll == "both",
        "--collective ring, allreduce, alltoall or both");
  check(!expect_error || coll == "alltoall", "--expect-error runs the all-to-all only");
  publish("pid." + std::to_string(g_rank), std::to_string(getpid()));
  net.init();
  // --rings N: N rings, ring j on device (--dev + j) mod devices() (one per GPU of a process
  // that drives several, as JAX's one process per host does), run one after another.
  std::vector<std::unique_ptr<Ring>> rings;
  std::unique_ptr<Mesh> mesh;
  const int ndev = nrings > 1 ? net.devices() : 1;
  if (coll != "alltoall")
    for (int j = 0; j < nrings; j++) {
      rings.push_back(std::make_unique<Ring>(connect_ring("loop" + std::to_string(j), nrings > 1 ? (g_dev + j) % ndev : g_dev),
                                             bytes / 4));
      rings.back()->gather = coll != "allreduce";
    }
  if (coll == "alltoall" || coll == "both") mesh = std::make_unique<Mesh>(connect_mesh("loop-a2a"), bytes / g_world);
  barrier("loop-ready");
  g_errors_expected = expect_error;
  if (g_rank == 0) publish("loop-started", std::to_string(wall_s()));
  const double start = now_s();
  std::vector<double> times, ar_times;
  uint64_t checked = 0;
  for (int it = 0;; it++) {
    const double a = now_s();
    try {
      for (auto& ring : rings) checked += ring->run(seed + it);
      if (mesh) checked += mesh->run(seed + it);
    } catch (const NetFailure& f) {
      const double at = wall_s();
      g_errors_expected = false;
      for (auto& ring : rings) ring->release();
      if (mesh) mesh->release();
      const double c0 = now_s();
      for (auto& ring : rings) close_conn(ring->c);
      if (mesh) mesh->close();
      const double closed = now_s() - c0;
      net.finalize();
      std::printf("harness: loop rank %d: ok (the expected error: %s returned %d in iteration %d at wall %.3f; "
                  "%d exact iterations before it, %" PRIu64 " bytes; closed in %.3f s)\n",
                  g_rank, f.what.c_str(), static_cast<int>(f.r), it, at, it, checked, closed);
      return;
    }
    times.push_back(now_s() - a);
    if (!rings.empty()) ar_times.push_back(rings[0]->ar_s);
    if (expect_error) {
      check(now_s() - start < seconds, "no error within " + std::to_string(seconds) + " s (" + std::to_string(it + 1) +
                                           " exact iterations)");
      continue;
    }
    if (g_rank == 0) publish("continue." + std::to_string(it), now_s() - start < seconds ? "1" : "0");
    if (fetch("continue." + std::to_string(it)) == "0") break;
  }
  const double ran = now_s() - start;
  print_health();
  for (auto& ring : rings) ring->release();
  if (mesh) mesh->release();
  barrier("loop-done");
  for (auto& ring : rings) close_conn(ring->c);
  if (mesh) mesh->close();
  net.finalize();
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  std::sort(ar_times.begin(), ar_times.end());
  char ar[96] = "";
  if (!ar_times.empty())
    std::snprintf(ar, sizeof ar, "; all-reduce on the wire: median %.1f ms", ar_times[ar_times.size() / 2] * 1e3);
  std::printf("harness: loop rank %d: ok (%zu iterations of %s in %.2f s, every one bit-exact, %" PRIu64
              " bytes; median %.1f ms, worst %.1f ms%s)\n",
              g_rank, times.size(), coll.c_str(), ran, checked, sorted[sorted.size() / 2] * 1e3, sorted.back() * 1e3, ar);
}

// connect/accept of new connections on a service thread while a progress thread moves data on
// an established one (NCCL's proxy service and progress threads), for several comms at once.
void case_threads(uint64_t seed) {
  net.init();
  net.init();   // two communicators
  Conn first = connect_ring("t0");
  std::atomic<bool> ok{false};
  uint64_t bytes = 0;
  std::thread progress([&] {
    bytes = run_steps(first, random_sizes(seed, 300, 256 << 10), 256 << 10, 8, 0);
    ok = true;
  });
  std::vector<Conn> more;
  for (int i = 0; i < 4; i++) more.push_back(connect_ring("t" + std::to_string(i + 1)));
  progress.join();
  check(ok, "the progress thread");
  for (size_t i = 0; i < more.size(); i++) bytes += run_steps(more[i], random_sizes(seed + i, 50, 64 << 10), 64 << 10, 8, 1000);
  barrier("threads-done");
  close_conn(first);
  for (auto& c : more) close_conn(c);
  net.finalize();
  net.finalize();
  std::printf("harness: threads rank %d: ok (%" PRIu64 " bytes checked over 5 connections)\n", g_rank, bytes);
}

// Close with requests in flight: receives posted that no send will match, and sends the peer
// never receives, then closeSend/closeRecv; the plugin must neither crash nor hang, and a new
// connection afterwards works.
void case_close(uint64_t seed) {
  net.init();
  Conn c = connect_ring("close");
  std::vector<uint8_t> buf(1 << 16);
  void* mh = nullptr;
  check(net.d().reg_mr(c.recv, buf.data(), buf.size(), kPtrHost, &mh) == kSuccess, "regMr");
  {
    // regMrDmaBuf over sockets: refused (they take no dma-buf), no handle, and the connection
    // goes on (the cases below use it). A memfd stands in for the buffer's fd.
    const int fd = memfd_create("r2ccl-harness", MFD_CLOEXEC);
    check(fd >= 0 && ftruncate(fd, static_cast<off_t>(buf.size())) == 0, "memfd");
    void* dh = &buf;
    check(net.d().reg_mr_dmabuf(c.recv, buf.data(), buf.size(), kPtrHost, 0, fd, &dh) == kInvalidArgument && !dh,
          "regMrDmaBuf over sockets is refused");
    dh = &buf;
    check(net.d().reg_mr_dmabuf(c.recv, buf.data(), buf.size(), kPtrCuda, 0, fd, &dh) == kInvalidArgument && !dh,
          "regMrDmaBuf of GPU memory is refused");
    close(fd);
  }
  for (int i = 0; i < 4; i++) {
    void* d = buf.data();
    size_t size = buf.size();
    int tag = 0;
    void* req = nullptr;
    check(net.d().irecv(c.recv, 1, &d, &size, &tag, &mh, nullptr, &req) == kSuccess && req, "irecv");
  }
  std::vector<uint8_t> big(8 << 20, 0x5a);
  void* smh = nullptr;
  check(net.d().reg_mr(c.send, big.data(), big.size(), kPtrHost, &smh) == kSuccess, "regMr");
  void* sreq = nullptr;
  check(net.d().isend(c.send, big.data(), big.size(), g_rank, smh, nullptr, &sreq) == kSuccess && sreq, "isend");
  barrier("close-posted");
  net.d().dereg_mr(c.recv, mh);
  net.d().dereg_mr(c.send, smh);
  const double t0 = now_s();
  close_conn(c);
  const double took = now_s() - t0;
  barrier("close-closed");
  Conn again = connect_ring("close-again");
  const uint64_t bytes = run_steps(again, random_sizes(seed, 40, 64 << 10), 64 << 10, 8, 0);
  barrier("close-again-done");
  close_conn(again);
  net.finalize();
  std::printf("harness: close rank %d: ok (closed with 5 requests in flight in %.3f s; then %" PRIu64 " bytes exact)\n",
              g_rank, took, bytes);
}

// finalize, dlclose and dlopen again: the plugin comes back (NCCL unloads it after the last
// communicator and loads it again for the next).
void case_reload(uint64_t seed) {
  uint64_t bytes = 0;
  for (int round = 0; round < 3; round++) {
    if (round > 0) net.open();
    net.init();
    Conn c = connect_ring("reload" + std::to_string(round));
    bytes += run_steps(c, random_sizes(seed + round, 60, 128 << 10), 128 << 10, 8, 0);
    barrier("reload-done" + std::to_string(round));
    close_conn(c);
    net.finalize();
    net.close();
  }
  net.open();   // (main's final close)
  std::printf("harness: reload rank %d: ok (3 rounds of init, traffic, finalize, dlclose; %" PRIu64 " bytes exact)\n",
              g_rank, bytes);
}

// Writes one line to this process's fault file (R2CCL_TEST_FAULT_FILE): the plugin applies it.
void inject(const std::string& line) {
  const char* path = std::getenv("R2CCL_TEST_FAULT_FILE");
  check(path != nullptr, "the faults cases need R2CCL_TEST_FAULT_FILE");
  const std::string tmp = std::string(path) + ".tmp";
  {
    std::ofstream f(tmp);
    f << line << "\n";
  }
  check(std::rename(tmp.c_str(), path) == 0, "write the fault file");
}

// The survivable faults while traffic streams both ways: rank 0 closes rail 1 of every
// connection, heals it, black-holes rail 0 (stall: its bytes vanish, detected by the stall
// timer), heals it, declares NIC 1 down (all NICs but one), up again. Traffic runs in phases,
// rank 0 deciding after each whether another follows, until the schedule is done; test()
// never returns an error and every byte is checked (run_steps).
void case_faults(uint64_t seed) {
  net.init();
  Conn c = connect_ring("faults");
  std::atomic<bool> schedule_done{false};
  const std::vector<std::pair<int, std::string>> schedule = {
      {100, "close 1"}, {400, "heal 1"}, {300, "stall 0"}, {600, "heal 0"}, {300, "nic_down 1"}, {600, "nic_up 1"}};
  std::thread faults;
  if (g_rank == 0)
    faults = std::thread([&] {
      for (const auto& [ms, line] : schedule) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        inject(line);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      schedule_done = true;
    });
  uint64_t bytes = 0;
  int phase = 0;
  for (;; phase++) {
    bytes += run_steps(c, random_sizes(seed + phase, 60, 256 << 10), 256 << 10, 8, phase * 100);
    if (g_rank == 0) publish("continue." + std::to_string(phase), schedule_done ? "0" : "1");
    if (fetch("continue." + std::to_string(phase)) == "0") break;
    check(phase < 10000, "the fault schedule never ended");
  }
  if (faults.joinable()) faults.join();
  if (g_rank == 0)
    check(g_faults_logged.load() == static_cast<int>(schedule.size()),
          "the plugin applied " + std::to_string(g_faults_logged.load()) + " of " + std::to_string(schedule.size()) +
              " faults");
  barrier("faults-done");
  close_conn(c);
  net.finalize();
  std::printf("harness: faults rank %d: ok (%zu faults, %d phases, %" PRIu64 " bytes exact, no error)\n", g_rank,
              g_rank == 0 ? schedule.size() : 0, phase + 1, bytes);
}

// A fatal fault: rank 0 holds every NIC down past R2CCL_TIMEOUT. Each rank's pending send and
// receive must fail (test() returns an error, the logger names the cause) within
// R2CCL_TIMEOUT + 2 s of the cut, and nothing hangs.
void case_fatal(uint64_t seed) {
  const char* t = std::getenv("R2CCL_TIMEOUT");
  const double timeout_s = t ? std::atof(t) : 30.0;
  net.init();
  Conn c = connect_ring("fatal");
  run_steps(c, random_sizes(seed, 20, 64 << 10), 64 << 10, 8, 0);
  barrier("fatal-ready");
  if (g_rank == 0) inject("nic_down 0\nnic_down 1");
  const double t0 = now_s();
  std::vector<uint8_t> sb(1 << 16, 1), rb(1 << 16);
  void *smh = nullptr, *rmh = nullptr, *sreq = nullptr, *rreq = nullptr;
  check(net.d().reg_mr(c.send, sb.data(), sb.size(), kPtrHost, &smh) == kSuccess, "regMr");
  check(net.d().reg_mr(c.recv, rb.data(), rb.size(), kPtrHost, &rmh) == kSuccess, "regMr");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));   // the cut lands first
  check(net.d().isend(c.send, sb.data(), sb.size(), g_rank, smh, nullptr, &sreq) == kSuccess && sreq, "isend");
  void* d = rb.data();
  size_t size = rb.size();
  int tag = 0;
  check(net.d().irecv(c.recv, 1, &d, &size, &tag, &rmh, nullptr, &rreq) == kSuccess && rreq, "irecv");
  Result sr = kSuccess, rr = kSuccess;
  bool sdone = false, rdone = false;
  while (!(sdone && rdone)) {
    check(now_s() - t0 < timeout_s + 2.0 + 5.0, "no error within R2CCL_TIMEOUT + 7 s: the plugin hangs");
    int done = 0, sizes[kTestSizes] = {};
    if (!sdone && (sr = net.d().test(sreq, &done, sizes)) != kSuccess) sdone = true;
    else if (!sdone && done) die("the send succeeded with every NIC of rank 0 held down");
    done = 0;
    if (!rdone && (rr = net.d().test(rreq, &done, sizes)) != kSuccess) rdone = true;
    else if (!rdone && done) die("the receive succeeded with every NIC of rank 0 held down");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double took = now_s() - t0;
  check(took <= timeout_s + 2.0, "the error took " + std::to_string(took) + " s, past R2CCL_TIMEOUT + 2 s");
  check(sr == kRemoteError && rr == kRemoteError, "the errors are ncclRemoteError");
  std::printf("harness: fatal rank %d: ok (send and receive failed after %.2f s, R2CCL_TIMEOUT %.1f s)\n", g_rank,
              took, timeout_s);
  close_conn(c);
  net.finalize();
}

// Speed, the way NCCL's proxy moves a large message between two hosts: rank 0 streams
// --bytes (256 MiB) to rank 1 in --slot pieces (512 KiB: NCCL's SIMPLE step of a 4 MiB buffer)
// with 8 in flight, every byte checked, after --warmup-bytes (32 MiB) the same way untimed;
// then a 4 KiB isend -> test round trip, 300 times after 30 untimed (rank 1 echoes). Prints
// "BW <MB/s>" and "RTT <median us>".
void case_bandwidth(uint64_t total, size_t slot, uint64_t warmup, int idle_conns, double idle_s) {
  check(g_world == 2, "bandwidth runs on 2 processes");
  net.init();
  // --idle-conns: that many more connection pairs open and idle meanwhile (their rails
  // heartbeat, the monitor samples them), as a job's other channels and peers would be.
  std::vector<Conn> idle;
  for (int k = 0; k < idle_conns; k++) idle.push_back(connect_ring("idle" + std::to_string(k)));
  Conn c = connect_ring("bw");
  // --idle-s: everything connected and idle this long first (a job between its steps).
  if (idle_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
  const int slots = 8;
  std::vector<std::vector<uint8_t>> buf(slots, std::vector<uint8_t>(slot));
  std::vector<void*> mh(slots);
  void* comm = g_rank == 0 ? c.send : c.recv;
  for (int s = 0; s < slots; s++) check(net.d().reg_mr(comm, buf[s].data(), slot, kPtrHost, &mh[s]) == kSuccess, "regMr");
  std::vector<std::vector<uint8_t>> ref(slots, std::vector<uint8_t>(slot));
  for (int s = 0; s < slots; s++)
    for (size_t i = 0; i < slot; i++) buf[s][i] = ref[s][i] = pattern(0, s, i);
  // `bytes` in `slot` pieces, 8 in flight, every piece checked on rank 1.
  auto stream = [&](uint64_t bytes) {
    const uint64_t pieces = (bytes + slot - 1) / slot;
    auto piece_len = [&](uint64_t k) { return static_cast<size_t>(std::min<uint64_t>(slot, bytes - k * slot)); };
    std::vector<void*> req(slots);
    uint64_t posted = 0, done = 0, wrong = 0;
    const double until = now_s() + g_timeout_s;
    while (done < pieces) {
      check(now_s() < until, "the stream did not finish within the timeout");
      if (posted < pieces && posted - done < static_cast<uint64_t>(slots)) {
        const int s = static_cast<int>(posted % slots);
        void* r = nullptr;
        if (g_rank == 0) {
          check(net.d().isend(c.send, buf[s].data(), piece_len(posted), 0, mh[s], nullptr, &r) == kSuccess, "isend");
        } else {
          void* d = buf[s].data();
          size_t size = slot;
          int tag = 0;
          check(net.d().irecv(c.recv, 1, &d, &size, &tag, &mh[s], nullptr, &r) == kSuccess, "irecv");
        }
        if (r) req[s] = r, posted++;
      }
      if (done < posted) {
        const int s = static_cast<int>(done % slots);
        int d = 0, sizes[kTestSizes] = {};
        check(net.d().test(req[s], &d, sizes) == kSuccess, "test");
        if (d) {
          if (g_rank == 1) {   // the sender's slot s always holds pattern(0, s, .)
            const size_t n = piece_len(done);
            if (sizes[0] != static_cast<int>(n) || std::memcmp(buf[s].data(), ref[s].data(), n) != 0) wrong++;
            std::memset(buf[s].data(), 0, n);   // the next piece in this slot must bring its own bytes
          }
          done++;
        }
      }
    }
    check(wrong == 0, std::to_string(wrong) + " wrong pieces");
  };
  // Untimed first: the connection's rails come up as its first messages wait (connect never
  // blocks), and an NCCL job's steady state is what the speed table compares. The timed part
  // follows at once, with no barrier between, as in the endpoint's baseline (endpoint_rtt.cc).
  barrier("bw-start");
  stream(warmup);
  const double t0 = now_s();
  stream(total);
  const double secs = now_s() - t0;
  barrier("bw-done");
  // 4 KiB round trips: rank 0 sends, rank 1 echoes.
  std::vector<uint8_t> small(4096, 7), back(4096);
  void *smh = nullptr, *rmh = nullptr;
  check(net.d().reg_mr(c.send, small.data(), 4096, kPtrHost, &smh) == kSuccess, "regMr");
  check(net.d().reg_mr(c.recv, back.data(), 4096, kPtrHost, &rmh) == kSuccess, "regMr");
  std::vector<double> rtt;
  for (int it = 0; it < 330; it++) {
    const double a = now_s();
    auto send_one = [&] {
      void* r = nullptr;
      while (!r) check(net.d().isend(c.send, small.data(), 4096, g_rank, smh, nullptr, &r) == kSuccess, "isend");
      return r;
    };
    auto recv_one = [&] {
      void* r = nullptr;
      void* d = back.data();
      size_t size = 4096;
      int tag = 0;
      while (!r) check(net.d().irecv(c.recv, 1, &d, &size, &tag, &rmh, nullptr, &r) == kSuccess, "irecv");
      return r;
    };
    if (g_rank == 0) {
      void* rr = recv_one();
      wait_req(send_one(), "ping");
      wait_req(rr, "pong");
    } else {
      wait_req(recv_one(), "ping");
      wait_req(send_one(), "pong");
    }
    if (it >= 30) rtt.push_back((now_s() - a) * 1e6);
  }
  std::sort(rtt.begin(), rtt.end());
  barrier("bw-rtt-done");
  net.d().dereg_mr(c.send, smh);
  net.d().dereg_mr(c.recv, rmh);
  for (int s = 0; s < slots; s++) net.d().dereg_mr(comm, mh[s]);
  close_conn(c);
  for (auto& i : idle) close_conn(i);
  net.finalize();
  std::printf("harness: bandwidth rank %d: ok BW %.1f MB/s (%" PRIu64 " bytes in %zu-byte pieces, 8 in flight, %.3f s) "
              "RTT %.1f us (4 KiB isend->test round trip, median of 300; %d idle connection pairs)\n",
              g_rank, static_cast<double>(total) / secs / 1e6, total, slot, secs, rtt[rtt.size() / 2], idle_conns);
}

}  // namespace

int main(int argc, char** argv) {
  std::string which;
  uint64_t seed = 1, bytes = 256ull << 20;
  size_t slot = 512 << 10;
  uint64_t warmup_bytes = 32ull << 20;
  int idle_conns = 0;
  int rings = 1;
  double idle_s = 0;
  double seconds = 3;
  std::string collective = "both";
  bool expect_error = false;
  uint64_t loop_bytes = 4 << 20;
  int iters = 200, threads = 8, comms = 4, rounds = 10;
  double bound = 3.0, accept_bound = 1.0;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      check(i + 1 < argc, a + " needs a value");
      return argv[++i];
    };
    if (a == "--plugin") g_plugin = next();
    else if (a == "--rank") g_rank = std::stoi(next());
    else if (a == "--world") g_world = std::stoi(next());
    else if (a == "--dir") g_dir = next();
    else if (a == "--case") which = next();
    else if (a == "--table") g_table = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--timeout") g_timeout_s = std::stod(next());
    else if (a == "--bytes") bytes = std::stoull(next());
    else if (a == "--slot") slot = std::stoull(next());
    else if (a == "--warmup-bytes") warmup_bytes = std::stoull(next());
    else if (a == "--idle-conns") idle_conns = std::stoi(next());
    else if (a == "--idle-s") idle_s = std::stod(next());
    else if (a == "--seconds") seconds = std::stod(next());
    else if (a == "--dev") g_dev = std::stoi(next());
    else if (a == "--devices") g_devices = std::stoi(next());
    else if (a == "--collective") collective = next();
    else if (a == "--expect-error") expect_error = true;
    else if (a == "--loop-bytes") loop_bytes = std::stoull(next());
    else if (a == "--rings") rings = std::stoi(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--bound") bound = std::stod(next());
    else if (a == "--accept-bound") accept_bound = std::stod(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--comms") comms = std::stoi(next());
    else if (a == "--rounds") rounds = std::stoi(next());
    else die("unknown argument " + a);
  }
  check(!g_plugin.empty() && !g_dir.empty() && g_world >= 2 && g_rank >= 0 && g_rank < g_world, "usage: --plugin SO --dir D --rank R --world W --case C");
  check(g_table >= 10 && g_table <= 12, "--table 10, 11 or 12");
  net.open();
  if (which == "properties") case_properties();
  else if (which == "p2p") case_p2p(seed);
  else if (which == "ring") case_ring(seed);
  else if (which == "threads") case_threads(seed);
  else if (which == "close") case_close(seed);
  else if (which == "reload") case_reload(seed);
  else if (which == "faults") case_faults(seed);
  else if (which == "fatal") case_fatal(seed);
  else if (which == "bandwidth") case_bandwidth(bytes, slot, warmup_bytes, idle_conns, idle_s);
  else if (which == "loop") case_loop(seed, seconds, collective, expect_error, loop_bytes, rings);
  else if (which == "close_race") case_close_race(seed, iters, bound, accept_bound);
  else if (which == "many") case_many(seed, threads, comms, rounds, accept_bound);
  else if (which == "contain") case_contain(seed);
  else if (which == "spin") case_spin(seed, accept_bound);
  else die("unknown case " + which);
  net.close();
  std::fflush(stdout);
  return 0;
}
