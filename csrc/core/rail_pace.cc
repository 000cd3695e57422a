// RailPace: the delivered rate, the round trips, the window and the drain allowance of one rail.
#include "core/rail_pace.h"

#include <algorithm>

namespace r2ccl {

RailPace::RailPace(const Limits& lim) : lim_(lim) {
  lim_.min_window = std::min(lim_.min_window, lim_.max_window);
  lim_.min_chunk = std::min(lim_.min_chunk, lim_.max_chunk);
  window_ = std::clamp(kInitialWindow, lim_.min_window, lim_.max_window);
}

void RailPace::on_deal(int64_t now, bool was_idle) {
  last_busy_ns_ = now;
  // A sample measures delivery while the rail has work: the time it sat idle (nothing in
  // flight) is left out of the sample's span.
  if (sample_start_ == 0) {
    sample_start_ = now;
    sample_bytes_ = 0;
    sample_chunks_ = 0;
  } else if (was_idle && idle_since_ > 0 && now > idle_since_) {
    sample_start_ += now - idle_since_;
  }
  idle_since_ = 0;
}

void RailPace::on_ack(int64_t now, uint64_t bytes, int64_t dealt_ns, uint64_t inflight_after) {
  if (dealt_ns > 0 && now > dealt_ns) {
    const int64_t rtt = now - dealt_ns;
    if (min_rtt_ns_ == 0 || rtt < min_rtt_ns_) min_rtt_ns_ = rtt;
    srtt_ns_ = srtt_ns_ == 0 ? rtt : srtt_ns_ + (rtt - srtt_ns_) / 8;
  }
  last_busy_ns_ = now;
  if (sample_start_ == 0) return;
  sample_bytes_ += bytes;
  sample_chunks_++;
  const int64_t span = now - sample_start_;
  if (span >= kSampleNs && sample_chunks_ >= kSampleChunks) {
    const double sample = static_cast<double>(sample_bytes_) * 1e9 / static_cast<double>(span);
    bw_ = bw_ == 0 ? sample : 0.75 * bw_ + 0.25 * sample;
    sample_start_ = now;
    sample_bytes_ = 0;
    sample_chunks_ = 0;
  }
  if (inflight_after == 0) idle_since_ = now;
}

void RailPace::on_rtt(int64_t rtt_ns) {
  if (rtt_ns > 0 && (min_rtt_ns_ == 0 || rtt_ns < min_rtt_ns_)) min_rtt_ns_ = rtt_ns;
}

void RailPace::on_idle() {
  sample_start_ = 0;
  idle_since_ = 0;
}

double RailPace::share_rate() const {
  return bw_ > 0 ? bw_ : static_cast<double>(window_) * 1e9 / static_cast<double>(lim_.target_ns);
}

void RailPace::share_window(double nic_rate, int busy_rails) {
  if (busy_rails < 1 || !(nic_rate > 0)) return;
  // The round trip covers a long path; capped at the target, so that a rail whose first
  // chunks met a full queue (its smallest round trip is large) cannot inflate its window.
  const double target_s = static_cast<double>(lim_.target_ns + std::min(min_rtt_ns_, lim_.target_ns)) * 1e-9;
  const double w = nic_rate * target_s / busy_rails;
  window_ = std::clamp(static_cast<uint64_t>(std::min(w, 1e18)), lim_.min_window, lim_.max_window);
}

uint64_t RailPace::chunk() const { return std::clamp(window() / 4, lim_.min_chunk, lim_.max_chunk); }

int64_t RailPace::drain_ns(uint64_t inflight, int64_t nic_drain_ns) const {
  const int64_t own = static_cast<int64_t>(static_cast<double>(inflight) * 1e9 / share_rate());
  return std::max(own, nic_drain_ns) + min_rtt_ns_;
}

}  // namespace r2ccl
