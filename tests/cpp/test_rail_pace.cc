// Tests for csrc/core/rail_pace.{h,cc}: a rail over a simulated link (a FIFO of rate R and a
// fixed base round trip) driven the way the engine drives it (deal while the window has
// room, share_window every 25 ms). Checks that the window finds R x (target + RTT) from
// its small start on slow and fast links, that the link then runs at its rate, that rails
// sharing a NIC get equal windows, that an application-limited rail does not learn a low
// rate from its idle tails, that a heartbeat's round trip (on_rtt) replaces a smallest round
// trip that data chunks only ever saw behind a queue, and that the drain allowance bounds
// black-hole detection.
// Standalone: exits non-zero and names each failing check.
#include "core/rail_pace.h"

#include <cmath>
#include <cstdio>
#include <deque>
#include <string>
#include "check.h"

using r2ccl::RailPace;
using r2ccl::RailPaceLimits;

namespace {

constexpr int64_t kMs = 1000000;

struct SimResult {
  uint64_t window;
  double delivered_rate;   // bytes/s over the last second
  int64_t max_inflight_ns; // the longest any byte waited for its ack in the last second
};

// One rail alone on a link of `rate` bytes/s and `base_rtt_ns`, sender never out of data
// (or, with `burst_bytes` > 0, a message of that size every `period_ns`), for `run_ns`.
SimResult simulate(double rate, int64_t base_rtt_ns, int64_t run_ns, const RailPaceLimits& lim,
                   uint64_t burst_bytes = 0, int64_t period_ns = 0) {
  RailPace pace(lim);
  struct InFlight { int64_t dealt, acked; uint64_t bytes; };
  std::deque<InFlight> q;
  uint64_t inflight = 0, delivered_late = 0, backlog = burst_bytes ? 0 : UINT64_MAX;
  int64_t link_free = 0, next_tick = 25 * kMs, next_burst = 0, max_wait = 0;
  const int64_t step = 50000;   // 50 us
  for (int64_t now = 0; now < run_ns; now += step) {
    if (burst_bytes && now >= next_burst) {
      backlog += burst_bytes;
      next_burst += period_ns;
    }
    while (!q.empty() && q.front().acked <= now) {
      InFlight f = q.front();
      q.pop_front();
      inflight -= f.bytes;
      pace.on_ack(now, f.bytes, f.dealt, inflight);
      if (now > run_ns - 1000 * kMs) {
        delivered_late += f.bytes;
        if (now - f.dealt > max_wait) max_wait = now - f.dealt;
      }
    }
    while (backlog > 0) {
      const uint64_t c = std::min<uint64_t>(pace.chunk(), backlog);
      if (inflight > 0 && inflight + c > pace.window()) break;
      pace.on_deal(now, inflight == 0);
      const int64_t start = std::max(now, link_free);
      link_free = start + static_cast<int64_t>(static_cast<double>(c) * 1e9 / rate);
      q.push_back({now, link_free + base_rtt_ns, c});
      inflight += c;
      if (backlog != UINT64_MAX) backlog -= c;
    }
    if (now >= next_tick) {
      pace.share_window(pace.share_rate(), 1);
      next_tick += 25 * kMs;
    }
  }
  return {pace.window(), static_cast<double>(delivered_late), max_wait};
}

void finds_the_rate(double rate, int64_t rtt_ns, const char* name) {
  RailPaceLimits lim;
  lim.max_window = 64u << 20;
  const SimResult r = simulate(rate, rtt_ns, 3000 * kMs, lim);
  const double want = rate * static_cast<double>(lim.target_ns + rtt_ns) * 1e-9;
  const double w = static_cast<double>(r.window);
  check(w > 0.6 * want && w < 1.8 * want,
        std::string(name) + ": window " + std::to_string(r.window) + " vs rate x (target + rtt) " +
            std::to_string(static_cast<uint64_t>(want)));
  check(r.delivered_rate > 0.97 * rate,
        std::string(name) + ": delivered " + std::to_string(r.delivered_rate) + " B/s of " + std::to_string(rate));
  // The queue stays near the target: no byte waits much longer than target + rtt + a chunk.
  check(r.max_inflight_ns < 3 * (lim.target_ns + rtt_ns),
        std::string(name) + ": a byte waited " + std::to_string(r.max_inflight_ns / kMs) + " ms for its ack");
}

void starts_small() {
  RailPace pace;
  check(pace.window() == RailPace::kInitialWindow, "the first window is the initial one");
  check(pace.window() <= 32u << 10, "the initial window is the smallest (many rails may start on one slow NIC)");
  check(pace.bandwidth() == 0, "no bandwidth before any sample");
}

void shares_equally() {
  RailPaceLimits lim;
  RailPace a(lim), b(lim);
  a.share_window(12e6, 3);
  b.share_window(12e6, 3);
  check(a.window() == b.window(), "rails on one NIC get equal windows");
  const double want = 12e6 * 0.010 / 3;
  check(std::fabs(static_cast<double>(a.window()) - want) < 1024 || a.window() == lim.min_window,
        "a NIC's rate x target is split by its busy rails: " + std::to_string(a.window()));
  RailPace c(lim);
  c.share_window(1e12, 1);
  check(c.window() == lim.max_window, "the window is capped at R2CCL_RAIL_WINDOW_BYTES");
  c.share_window(1.0, 1);
  check(c.window() == lim.min_window, "and floored at the smallest");
  c.share_window(-5.0, 1);
  check(c.window() == lim.min_window, "a non-positive rate changes nothing");
  c.share_window(std::nan(""), 1);
  check(c.window() == lim.min_window, "nor does NaN");
}

// 40 chunks of `bytes`, one every `every_ns`, each acknowledged `rtt_ns` after it was dealt
// (a queue that never empties: no ack sees the path's own round trip).
void acks_behind_a_queue(RailPace& p, int64_t every_ns, int64_t rtt_ns, uint64_t bytes) {
  int64_t now = 0;
  p.on_deal(now, true);
  for (int i = 1; i <= 40; i++) {
    now += every_ns;
    p.on_ack(now + rtt_ns, bytes, now, 1);
  }
}

void a_large_first_rtt_cannot_inflate_the_window() {
  RailPaceLimits lim;
  lim.max_window = 64u << 20;
  RailPace p(lim);
  // First chunks met a full queue: 400 ms round trips at 10 MB/s.
  acks_behind_a_queue(p, 10 * kMs, 400 * kMs, 100000);
  p.share_window(10e6, 1);
  check(static_cast<double>(p.window()) <= 10e6 * 2 * 0.010 * 1.01,
        "the round trip term is capped at the target: window " + std::to_string(p.window()));
}

void app_limited_tails_do_not_lower_the_rate() {
  RailPaceLimits lim;
  lim.max_window = 64u << 20;
  // 64 KiB messages every 20 ms on a 100 MB/s link: each is done in under a millisecond and
  // the rail idles. Samples would read ~3 MB/s if the idle time counted.
  const SimResult r = simulate(100e6, 100000, 2000 * kMs, lim, 64 << 10, 20 * kMs);
  check(r.window >= RailPace::kInitialWindow, "an application-limited rail keeps its window: " +
                                                   std::to_string(r.window));
}

void learns_the_base_round_trip_from_outside_samples() {
  RailPaceLimits lim;
  lim.max_window = 64u << 20;
  RailPace p(lim);
  // Every data chunk met a standing queue (6 ms) on a 12.5 MB/s link whose base round trip
  // is 80 us: data alone would take 6 ms for the round trip and size the window for it.
  acks_behind_a_queue(p, 2 * kMs, 6 * kMs, 25000);
  check(p.min_rtt_ns() == 6 * kMs, "data chunks give the smallest round trip they saw");
  p.on_rtt(80000);   // a heartbeat's echo on the same rail
  check(p.min_rtt_ns() == 80000, "a heartbeat's round trip lowers it: " + std::to_string(p.min_rtt_ns()));
  p.on_rtt(3 * kMs);
  p.on_rtt(0);
  p.on_rtt(-5);
  check(p.min_rtt_ns() == 80000, "a larger, zero or negative sample does not change it");
  p.share_window(12.5e6, 3);
  const double want = 12.5e6 * static_cast<double>(lim.target_ns + 80000) * 1e-9 / 3;
  check(std::fabs(static_cast<double>(p.window()) - want) < 1024,
        "the window holds the target plus the base round trip, not the queue: " + std::to_string(p.window()));
}

void drain_bounds_detection() {
  RailPaceLimits lim;
  RailPace p(lim);
  // Before any sample: the window is taken to drain within the target.
  check(p.drain_ns(p.window()) <= lim.target_ns + 1000, "unsampled drain of one window is the target");
  check(p.drain_ns(p.window(), 300 * kMs) >= 300 * kMs, "the NIC's drain counts when it is longer");
  check(p.drain_ns(0) == 0, "nothing in flight drains at once");
}

}  // namespace

int main() {
  starts_small();
  finds_the_rate(6.25e6, 200000, "50 Mbit/s, 0.2 ms");
  finds_the_rate(62.5e6, 200000, "500 Mbit/s, 0.2 ms");
  finds_the_rate(2.5e9, 20000, "20 Gbit/s, 20 us");
  finds_the_rate(12.5e6, 8 * kMs, "100 Mbit/s, 8 ms");
  shares_equally();
  a_large_first_rtt_cannot_inflate_the_window();
  app_limited_tails_do_not_lower_the_rate();
  learns_the_base_round_trip_from_outside_samples();
  drain_bounds_detection();
  return checks_passed("test_rail_pace");
}
