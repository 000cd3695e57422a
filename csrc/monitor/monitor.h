// The host-side health monitor: one thread per endpoint that watches every rail and NIC and
// steers the endpoint through its two seams (set_nic_state, set_rail_weight).
//   - Link state from the kernel as events (netlink RTM_NEWLINK; sysfs operstate/carrier
//     polled when netlink is unavailable; InfiniBand/RoCE port state polled from sysfs where
//     the netdev has IB ports): a NIC going down fails its rails at once; coming
//     back it is re-admitted after a hold-down that grows while the link flaps.
//   - Delivered bandwidth per rail: acknowledged bytes over the time the rail had bytes in
//     flight, smoothed; weights follow it (with hysteresis), so a degraded rail carries a
//     share it can finish in time and a healed one gets its share back.
//   - Events (link, failure, recovery, degradation) with timestamps, logged at WARN and
//     kept for Python (jax_r2ccl.health(), jax_r2ccl.on_event).
// Knows nothing of collectives or JAX.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "core/endpoint.h"

namespace r2ccl::monitor {

struct Event {
  uint64_t seq = 0;
  double t_unix = 0;
  std::string kind;        // link_down, link_up, nic_readmitted, rail_failed, rail_recovered, degraded, restored,
                           // backups_engaged, backups_released (a peer's event with rail -1)
  int peer = -1;           // -1: a NIC event
  int rail = -1;
  std::string nic;         // local NIC (interface name, else address)
  std::string detail;
};

struct RailHealth {
  int peer = 0;
  RailStats stats;
  double bandwidth_Bps = 0;   // smoothed delivered rate while busy (0: not measured yet)
  std::string last_event;
};

struct NicHealth {
  std::string name, ifname, addr;   // as given, kernel interface, IPv4 address
  bool link_up = true;        // as the kernel reports it
  bool admitted = true;       // carrying traffic (false: down or in hold-down)
  std::string source;         // netlink, sysfs or none (loopback, or no interface to watch)
  int downs = 0;              // link-down events seen
};

// Threads: its own sampling thread steers the endpoint; every public call is safe from any
// thread but the endpoint's engine thread (rails() and nics() read under the monitor's lock;
// events() may block for its timeout). It shares the endpoint's lifetime (holds it);
// close() it before the endpoint is closed.
class Monitor : public std::enable_shared_from_this<Monitor> {
 public:
  Monitor(std::shared_ptr<Endpoint> ep, const Config& cfg);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  std::vector<RailHealth> rails();
  std::vector<NicHealth> nics();
  // This process's bandwidth in units of one healthy NIC: per local NIC, 0 when down or held
  // down, else the best delivered-bandwidth ratio of its rails (1: as fast as the best rail).
  // Lock-free; updated every sample. The all-reduce planner's input.
  double capacity() const { return capacity_->load(); }
  // The same value as a shared cell that outlives the monitor (for the planner's callback).
  std::shared_ptr<const std::atomic<double>> capacity_cell() const { return capacity_; }
  // Events with seq > after, oldest first; waits up to timeout_s for one when there is none.
  std::vector<Event> events(uint64_t after, double timeout_s);
  void close();

 private:
  struct RailTrack {
    uint64_t acked = 0;
    double busy_s = 0;
    double bw = 0;              // smoothed bytes/s
    double weight = 1.0;        // last applied
    int64_t weight_ns = 0;      // when it was applied
    uint64_t failures = 0, recoveries = 0;
    bool degraded = false;
    double ratio = 1.0;         // delivered bandwidth over the best sibling's (quantised as the weight)
    int below = 0, above = 0, pending = 0;   // consecutive samples that agree
    std::string last_event;
    bool seen = false;
  };
  struct NicTrack {
    std::string name, ifname, addr;
    int ifindex = 0;
    bool link_up = true, admitted = true;
    bool nl_up = true, ib_up = true;         // the netdev's state; its InfiniBand ports' state
    std::vector<std::string> ib_ports;       // sysfs state files of the netdev's IB/RoCE ports
    int64_t readmit_ns = 0;     // hold-down end (0: none pending)
    std::deque<int64_t> downs;  // recent link-down times
    int total_downs = 0;
  };

  void run();
  void read_netlink();
  void poll_sysfs();
  void poll_ib();
  void link_change(size_t nic, bool up, const std::string& why);
  void sample(int64_t now);
  void update_capacity(const std::map<int, std::vector<RailStats>>& by_peer);
  void steer_backups(const std::map<int, std::vector<RailStats>>& by_peer, int64_t now);
  void emit(Event e);   // these run with mu_ held

  std::shared_ptr<Endpoint> ep_;
  Config cfg_;
  int nl_fd_ = -1, wake_fd_ = -1;
  std::string source_;
  std::thread thread_;
  bool stop_ = false;

  std::mutex mu_;               // guards everything below (the thread and callers)
  std::condition_variable cv_;
  std::vector<NicTrack> nics_;
  std::map<std::pair<int, int>, RailTrack> rails_;
  std::map<std::pair<int, int>, RailStats> last_stats_;
  // Backup rails (per-NIC devices): per local NIC, samples in a row under half (slow) or over
  // 0.8 (fine) of the best NIC's rate, and whether it counts as degraded; per peer, the
  // standby rails this monitor put to work because its primaries' NICs degraded.
  std::vector<int> nic_slow_, nic_fine_;
  std::vector<bool> nic_degraded_;
  struct Engaged {
    std::vector<int> rails;     // the standby rails put to work
    int64_t probe_ns = 0;       // when the primary is tried alone again
  };
  std::map<int, Engaged> engaged_;
  // Per peer: the wait before the next probe of a degraded primary (doubles while it stays
  // degraded), and when its backups were last released by a probe.
  std::map<int, std::pair<int64_t, int64_t>> probe_backoff_;
  std::deque<Event> events_;
  std::shared_ptr<std::atomic<double>> capacity_ = std::make_shared<std::atomic<double>>(0.0);
  uint64_t next_seq_ = 1;
};

}  // namespace r2ccl::monitor
