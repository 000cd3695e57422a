// How much one rail may hold in flight, and how long its acks may take before silence means
// a black hole. Each rail measures what it delivers while it has work (acknowledged bytes
// over busy time) and its smallest round trip. The engine shares each local NIC's delivered
// bandwidth x the target queueing delay (R2CCL_RAIL_QUEUE_MS) equally among the rails busy
// on that NIC (share_window): a fast NIC's rails hold much, a slow or crowded one's little;
// what a NIC has queued stays near the target however many peers share it, and rails that
// meet in one queue hold equal windows, so they get equal shares of it. A window that is
// too small measures a rate of window / round trip and grows by target / round trip per
// update, so it finds the NIC's rate within a few updates. Pure logic: time comes in as
// arguments; nothing here reads a clock or touches a socket. Engine-thread only (one per
// rail). Knows nothing of frames, sockets, collectives or JAX.
#pragma once
#include <cstdint>

namespace r2ccl {

struct RailPaceLimits {
  uint64_t min_window = 32 << 10;     // never below this (two smallest chunks)
  uint64_t max_window = 4 << 20;      // R2CCL_RAIL_WINDOW_BYTES
  uint64_t min_chunk = 16 << 10;      // smallest chunk dealt
  uint64_t max_chunk = 256 << 10;     // R2CCL_CHUNK_BYTES
  int64_t target_ns = 10000000;       // R2CCL_RAIL_QUEUE_MS
};

class RailPace {
 public:
  using Limits = RailPaceLimits;
  // Window before the first bandwidth sample: the smallest. Many rails that start at once
  // on one slow NIC must not overflow its queue; a fast rail measures window / round trip
  // and grows by target / round trip at the next update.
  static constexpr uint64_t kInitialWindow = 32 << 10;
  // A sample spans at least this long and this many acknowledged chunks.
  static constexpr int64_t kSampleNs = 5000000;
  static constexpr int kSampleChunks = 4;

  RailPace() : RailPace(Limits()) {}
  explicit RailPace(const Limits& lim);

  // A chunk was dealt at `now`; `was_idle`: nothing was in flight before it.
  void on_deal(int64_t now, bool was_idle);
  // A chunk of `bytes` dealt at `dealt_ns` (0: a resend, no round-trip sample) was
  // acknowledged at `now`; `inflight_after` is what the rail still holds.
  void on_ack(int64_t now, uint64_t bytes, int64_t dealt_ns, uint64_t inflight_after);
  // A round trip of this rail measured outside the data (a heartbeat's echo): a sample
  // for the smallest round trip only. Data chunks on a busy rail all wait behind each
  // other, so without it the smallest round trip can stay at a standing queue's delay for
  // long and the window would hold that queue on top of the target.
  void on_rtt(int64_t rtt_ns);
  // The rail failed: its in-flight bytes left it. The estimates are kept (the same NIC
  // pair comes back at about the same rate).
  void on_idle();

  uint64_t window() const { return window_; }
  // Rate this rail is taken to deliver, for its NIC's share: the measured one, or before any
  // sample what its window would deliver in the target time.
  double share_rate() const;
  // This rail's window from its NIC's delivered rate and how many rails share it.
  void share_window(double nic_rate, int busy_rails);
  // Recently had work: counts as one of its NIC's busy rails.
  bool busy_since(int64_t since_ns) const { return last_busy_ns_ >= since_ns; }
  uint64_t chunk() const;
  double bandwidth() const { return bw_; }    // delivered bytes/s while busy; 0: no sample yet
  int64_t min_rtt_ns() const { return min_rtt_ns_; }
  int64_t srtt_ns() const { return srtt_ns_; }
  // How long the peer may take to acknowledge `inflight` bytes on a healthy rail: their
  // drain at the measured rate plus the smallest round trip seen. Bytes still in flight
  // after this long (plus R2CCL_STALL_MS) mean the path is not slow but dead.
  // `nic_drain_ns`: what every rail of the same NIC holds over the NIC's rate (this rail's
  // bytes queue behind its siblings' in the NIC); the allowance is the larger of the two.
  int64_t drain_ns(uint64_t inflight, int64_t nic_drain_ns = 0) const;

 private:
  Limits lim_;
  double bw_ = 0;
  int64_t min_rtt_ns_ = 0, srtt_ns_ = 0;
  uint64_t window_;
  int64_t last_busy_ns_ = 0;
  int64_t sample_start_ = 0;     // 0: no bandwidth sample open
  int64_t idle_since_ = 0;       // when the last byte in flight was acknowledged (0: busy)
  uint64_t sample_bytes_ = 0;
  int sample_chunks_ = 0;
};

}  // namespace r2ccl
