// The baseline of the NCCL plugin's round trip: a small message's round trip through the
// core's Endpoint from C++, timed the way the plugin harness's bandwidth case times one
// through the plugin's table (tests/nccl/plugin_harness.cc): rank 0 posts its receive, sends
// --bytes (4 KiB), polls test() on both; rank 1 polls its receive, then sends the same bytes
// back; 30 untimed, then --iters (300) timed. Both endpoints read the R2CCL_* environment
// (R2CCL_NICS names the rails) and, like the plugin, run the health monitor
// (R2CCL_MONITOR_MS). Addresses meet in files in --dir. Prints
// "endpoint_rtt rank R: ok RTT <median us> (...)" and exits 0, or "FAIL: ..." and exits 1.
//   endpoint_rtt --rank 0|1 --dir D [--iters N] [--bytes B]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/settings.h"
#include "core/endpoint.h"
#include "monitor/monitor.h"
#include "net/transport.h"

using namespace r2ccl;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  std::exit(1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, iters = 300;
  size_t bytes = 4096, slot = 512 << 10;
  uint64_t stream = 0;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--rank") rank = std::atoi(v.c_str());
    else if (a == "--dir") dir = v;
    else if (a == "--iters") iters = std::atoi(v.c_str());
    else if (a == "--bytes") bytes = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--stream") stream = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--slot") slot = std::strtoull(v.c_str(), nullptr, 10);
    else die("unknown argument " + a);
  }
  if ((rank != 0 && rank != 1) || dir.empty() || iters < 1) die("usage: endpoint_rtt --rank 0|1 --dir D [--iters N] [--bytes B]");
  try {
    Config cfg = config_from_environment();
    const std::vector<std::string> nics = cfg.nics.empty() ? default_nics() : split(cfg.nics, ',');
    auto ep = std::make_shared<Endpoint>(cfg, rank, 2, nics, std::string("endpoint-rtt-baseline-secret"));
    // The health monitor, as the plugin runs one (R2CCL_MONITOR_MS > 0): the same work beside the traffic.
    std::shared_ptr<monitor::Monitor> mon;
    if (cfg.monitor_ms > 0) mon = std::make_shared<monitor::Monitor>(ep, cfg);
    {
      std::ofstream f(dir + "/addr." + std::to_string(rank) + ".tmp");
      for (const std::string& a : ep->addresses()) f << a << "\n";
    }
    std::rename((dir + "/addr." + std::to_string(rank) + ".tmp").c_str(), (dir + "/addr." + std::to_string(rank)).c_str());
    std::vector<std::string> theirs;
    for (const double until = now_s() + 60; theirs.empty(); std::this_thread::sleep_for(std::chrono::milliseconds(5))) {
      if (now_s() > until) die("no address of the other rank within 60 s");
      std::ifstream f(dir + "/addr." + std::to_string(1 - rank));
      for (std::string line; std::getline(f, line);)
        if (!line.empty()) theirs.push_back(line);
    }
    const int peer = 1 - rank;
    ep->add_peer(peer, theirs, true);
    ep->wait_ready({peer}, 60);
    if (stream > 0) {
      // The plugin harness's bandwidth case through the Endpoint: --stream bytes in --slot
      // pieces, 8 in flight, rank 0 to rank 1, every piece checked, after 32 MiB the same
      // way untimed (as the harness does).
      const int slots = 8;
      std::vector<std::vector<uint8_t>> buf(slots, std::vector<uint8_t>(slot)), ref(slots, std::vector<uint8_t>(slot));
      for (int s = 0; s < slots; s++)
        for (size_t i = 0; i < slot; i++) buf[s][i] = ref[s][i] = static_cast<uint8_t>(s * 31 + i * 7 + (i >> 8));
      uint64_t tag0 = 0;
      auto run = [&](uint64_t bytes) {
        const uint64_t pieces = (bytes + slot - 1) / slot;
        std::vector<std::shared_ptr<Request>> req(slots);
        uint64_t posted = 0, done = 0, wrong = 0;
        const double until = now_s() + 120;
        while (done < pieces) {
          if (posted < pieces && posted - done < static_cast<uint64_t>(slots)) {
            const int s = static_cast<int>(posted % slots);
            const size_t n = static_cast<size_t>(std::min<uint64_t>(slot, bytes - posted * slot));
            req[s] = rank == 0 ? ep->post_send(peer, tag0 + posted, buf[s].data(), n, {}, true)
                               : ep->post_recv(peer, tag0 + posted, buf[s].data(), n, {}, true);
            posted++;
          }
          if (done < posted) {
            const int s = static_cast<int>(done % slots);
            if (ep->test(req[s])) {
              if (req[s]->failed()) die("a piece failed: " + req[s]->error_message());
              const size_t n = static_cast<size_t>(std::min<uint64_t>(slot, bytes - done * slot));
              if (rank == 1) {
                if (std::memcmp(buf[s].data(), ref[s].data(), n) != 0) wrong++;
                std::memset(buf[s].data(), 0, n);
              }
              done++;
            }
          }
          if (now_s() > until) die("the stream not done within 120 s");
        }
        if (wrong) die(std::to_string(wrong) + " wrong pieces");
        tag0 += pieces;
      };
      run(32ull << 20);
      const double t0 = now_s();
      run(stream);
      const double secs = now_s() - t0;
      std::vector<uint8_t> one(1);
      auto last = ep->post_recv(peer, 1u << 30, one.data(), 1, {}, true);
      auto mine = ep->post_send(peer, 1u << 30, one.data(), 1, {}, true);
      while (!ep->test(mine) || !ep->test(last)) {
      }
      std::printf("endpoint_rtt rank %d: ok BW %.1f MB/s (%llu bytes in %zu-byte pieces, 8 in flight, through the core's Endpoint)\n",
                  rank, static_cast<double>(stream) / secs / 1e6, static_cast<unsigned long long>(stream), slot);
      std::fflush(stdout);
      if (mon) mon->close();   // before the endpoint (monitor.h)
      ep->close();
      return 0;
    }
    std::vector<uint8_t> out(bytes, 7), in(bytes);
    auto poll = [&](const std::shared_ptr<Request>& r) {
      const double until = now_s() + 60;
      while (!ep->test(r))
        if (now_s() > until) die("a request not done within 60 s");
      if (r->failed()) die("a request failed: " + r->error_message());
    };
    std::vector<double> rtt;
    for (int it = 0; it < iters + 30; it++) {
      const double a = now_s();
      if (rank == 0) {
        auto rr = ep->post_recv(peer, static_cast<uint64_t>(it), in.data(), bytes, {}, true);
        poll(ep->post_send(peer, static_cast<uint64_t>(it), out.data(), bytes, {}, true));
        poll(rr);
      } else {
        poll(ep->post_recv(peer, static_cast<uint64_t>(it), in.data(), bytes, {}, true));
        poll(ep->post_send(peer, static_cast<uint64_t>(it), out.data(), bytes, {}, true));
      }
      if (std::memcmp(in.data(), out.data(), bytes) != 0) die("the message differs");
      std::fill(in.begin(), in.end(), 0);
      if (it >= 30) rtt.push_back((now_s() - a) * 1e6);
    }
    std::sort(rtt.begin(), rtt.end());
    // Both ranks' last sends are acknowledged before either closes (a close may drop an eager send).
    std::vector<uint8_t> one(1);
    auto last = ep->post_recv(peer, 1u << 30, one.data(), 1, {}, true);
    poll(ep->post_send(peer, 1u << 30, one.data(), 1, {}, true));
    poll(last);
    std::printf("endpoint_rtt rank %d: ok RTT %.1f us (%zu-byte isend->test round trip through the core's Endpoint, median of %d)\n",
                rank, rtt[rtt.size() / 2], bytes, iters);
    std::fflush(stdout);
    if (mon) mon->close();
    ep->close();
  } catch (const std::exception& e) {
    die(e.what());
  }
  return 0;
}
