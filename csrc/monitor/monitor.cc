// The health monitor thread (see monitor.h).
#include "monitor/monitor.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "base/log.h"
#include "base/sysfs.h"

namespace r2ccl::monitor {

namespace {

constexpr int64_t kMs = 1000000;
constexpr size_t kEventsKept = 4096;
constexpr double kMinWeight = 0.02;        // a slow rail keeps a trickle, so recovery is seen
constexpr double kMinBusyS = 0.005;        // busy time a bandwidth sample needs
constexpr int64_t kWeightHoldNs = 200 * kMs;
constexpr int64_t kFlapWindowNs = 10000 * kMs;
constexpr double kBwAlpha = 0.3;           // weight of a new bandwidth sample
constexpr int kAgree = 3;                  // samples in a row before a weight or event changes

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Link state from sysfs; true when unknown (no such file: loopback, address-only NICs).
bool sysfs_link_up(const std::string& ifname, std::string* why) {
  if (ifname.empty()) return true;
  std::string op = read_first_line("/sys/class/net/" + ifname + "/operstate");
  if (op.empty()) return true;
  if (op == "down" || op == "lowerlayerdown" || op == "notpresent") {
    *why = "operstate " + op + " (sysfs)";
    return false;
  }
  std::string carrier = read_first_line("/sys/class/net/" + ifname + "/carrier");
  if (carrier == "0") {
    *why = "no carrier (sysfs)";
    return false;
  }
  return true;
}

std::string fmt_rate(double bps) {
  char b[64];
  std::snprintf(b, sizeof b, "%.1f MB/s", bps / 1e6);
  return b;
}

}  // namespace

Monitor::Monitor(std::shared_ptr<Endpoint> ep, const Config& cfg) : ep_(std::move(ep)), cfg_(cfg) {
  if (!ep_) throw Error(Cause::kInvalidArgument, -1, "the health monitor needs an endpoint");
  for (auto& info : ep_->nics()) {
    NicTrack n;
    n.name = info.name;
    n.ifname = info.ifname;
    n.addr = info.addr;
    // Loopback NICs are never watched: lo stays up, and many "NICs" may share it.
    bool loop = info.addr.rfind("127.", 0) == 0;
    n.ifindex = info.ifname.empty() || loop ? 0 : static_cast<int>(if_nametoindex(info.ifname.c_str()));
    if (n.ifindex) {   // an IPoIB or RoCE netdev: its IB ports' state counts too
      std::string ib = "/sys/class/net/" + info.ifname + "/device/infiniband";
      for (auto& dev : list_dir(ib))
        for (auto& port : list_dir(ib + "/" + dev + "/ports"))
          n.ib_ports.push_back(ib + "/" + dev + "/ports/" + port + "/state");
    }
    nics_.push_back(n);
  }
  nl_fd_ = ::socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (nl_fd_ >= 0) {
    sockaddr_nl sa{};
    sa.nl_family = AF_NETLINK;
    sa.nl_groups = RTMGRP_LINK;
    if (::bind(nl_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      ::close(nl_fd_);
      nl_fd_ = -1;
    }
  }
  source_ = nl_fd_ >= 0 ? "netlink" : "sysfs";
  if (nl_fd_ < 0) R2_INFO("health monitor: no netlink socket (%s); polling sysfs", std::strerror(errno));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // A NIC already down at start is held down now.
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < nics_.size(); i++) {
    std::string why;
    if (!nics_[i].ifindex) continue;
    nics_[i].nl_up = sysfs_link_up(nics_[i].ifname, &why);
    if (!nics_[i].nl_up) link_change(i, false, why);
  }
  poll_ib();
  // The baseline of every rail's counters: what happens from here on is reported.
  sample(mono_ns());
  thread_ = std::thread([this] {
    name_this_thread("r2ccl-monitor");
    log_bind_thread(ep_->config().debug_level, ep_->rank());
    run();
  });
}

Monitor::~Monitor() { close(); }

void Monitor::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    stop_ = true;
  }
  uint64_t one = 1;
  ssize_t w = ::write(wake_fd_, &one, sizeof one);
  (void)w;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (nl_fd_ >= 0) ::close(nl_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  nl_fd_ = wake_fd_ = -1;
}

void Monitor::run() {
  const int64_t interval = std::max(1, cfg_.monitor_ms) * kMs;
  int64_t next_sample = mono_ns() + interval;
  for (;;) {
    int64_t now = mono_ns();
    int64_t next = next_sample;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return;
      for (auto& n : nics_)
        if (n.readmit_ns) next = std::min(next, n.readmit_ns);
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {nl_fd_, POLLIN, 0}};
    int timeout_ms = static_cast<int>(std::clamp<int64_t>((next - now + kMs - 1) / kMs, 0, 1000));
    int n = ::poll(fds, nl_fd_ >= 0 ? 2 : 1, timeout_ms);
    // The thread works under the lock; callers of rails(), nics() and events() wait for it.
    std::unique_lock<std::mutex> lk(mu_);
    if (stop_) return;
    try {
      if (nl_fd_ >= 0 && n > 0 && (fds[1].revents & POLLIN)) read_netlink();
      now = mono_ns();
      // Hold-downs that ended with the link still up: the NIC carries traffic again.
      for (size_t i = 0; i < nics_.size(); i++) {
        NicTrack& t = nics_[i];
        if (!t.readmit_ns || now < t.readmit_ns) continue;
        t.readmit_ns = 0;
        if (!t.link_up || t.admitted) continue;
        t.admitted = true;
        ep_->set_nic_state(static_cast<int>(i), true, "link up and stable");
        emit({0, unix_s(), "nic_readmitted", -1, -1, t.name,
              "link stable through the hold-down; rails re-dialled"});
      }
      if (now >= next_sample) {
        if (nl_fd_ < 0) poll_sysfs();
        poll_ib();
        sample(now);
        next_sample = now + interval;
      }
    } catch (const Error& e) {
      // The endpoint closed under us (shutdown order): nothing left to watch.
      if (e.cause() == Cause::kClosed) return;
      R2_WARN("health monitor: %s", e.what());
    }
  }
}

void Monitor::read_netlink() {
  alignas(nlmsghdr) char buf[16384];
  for (;;) {
    ssize_t len = ::recv(nl_fd_, buf, sizeof buf, 0);
    if (len < 0) {
      if (errno == ENOBUFS) {   // events were lost: re-read the truth from sysfs
        poll_sysfs();
        continue;
      }
      return;   // EAGAIN or an error: try again on the next readiness
    }
    if (len == 0) return;
    for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, static_cast<unsigned>(len));
         nh = NLMSG_NEXT(nh, len)) {
      if (nh->nlmsg_type != RTM_NEWLINK && nh->nlmsg_type != RTM_DELLINK) continue;
      if (nh->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) continue;
      auto* ifi = static_cast<ifinfomsg*>(NLMSG_DATA(nh));
      for (size_t i = 0; i < nics_.size(); i++) {
        if (nics_[i].ifindex == 0 || nics_[i].ifindex != ifi->ifi_index) continue;
        bool admin_up = (ifi->ifi_flags & IFF_UP) != 0;
        bool running = (ifi->ifi_flags & IFF_RUNNING) != 0;
        bool up = nh->nlmsg_type == RTM_NEWLINK && admin_up && running;
        nics_[i].nl_up = up;
        up = up && nics_[i].ib_up;
        std::string why = nh->nlmsg_type == RTM_DELLINK ? "interface removed (netlink)"
                          : !admin_up                  ? "administratively down (netlink)"
                          : !running                   ? "carrier lost (netlink)"
                                                       : "link up (netlink)";
        link_change(i, up, why);
      }
    }
  }
}

void Monitor::poll_sysfs() {
  for (size_t i = 0; i < nics_.size(); i++) {
    if (!nics_[i].ifindex) continue;
    std::string why = "link up (sysfs)";
    bool up = sysfs_link_up(nics_[i].ifname, &why);
    nics_[i].nl_up = up;
    link_change(i, up && nics_[i].ib_up, why);
  }
}

void Monitor::poll_ib() {
  for (size_t i = 0; i < nics_.size(); i++) {
    NicTrack& t = nics_[i];
    if (t.ib_ports.empty()) continue;
    bool active = false;
    std::string states;
    for (auto& path : t.ib_ports) {
      std::string s = read_first_line(path);   // e.g. "4: ACTIVE", "1: DOWN"
      active = active || s.find("ACTIVE") != std::string::npos;
      states += (states.empty() ? "" : ", ") + s;
    }
    if (active == t.ib_up) continue;
    t.ib_up = active;
    link_change(i, t.nl_up && active, std::string(active ? "IB port active" : "no IB port active") + " (" + states +
                                          ", sysfs)");
  }
}

void Monitor::link_change(size_t i, bool up, const std::string& why) {
  NicTrack& t = nics_[i];
  if (t.link_up == up) return;   // netlink repeats NEWLINK for every attribute change
  const int64_t now = mono_ns();
  const std::string name = t.name;
  t.link_up = up;
  if (!up) {
    t.downs.push_back(now);
    t.total_downs++;
    t.readmit_ns = 0;
    if (t.admitted) {
      t.admitted = false;
      ep_->set_nic_state(static_cast<int>(i), false, why);
    }
    emit({0, unix_s(), "link_down", -1, -1, name, why});
    return;
  }
  while (!t.downs.empty() && now - t.downs.front() > kFlapWindowNs) t.downs.pop_front();
  // Hold-down: R2CCL_LINK_HOLDDOWN_MS after the first failure, doubling with every further
  // one in the last 10 s (up to 16x), so a flapping link stays out instead of costing a
  // failover each time it drops.
  int recent = std::max<int>(1, static_cast<int>(t.downs.size()));
  int64_t hold = static_cast<int64_t>(cfg_.link_holddown_ms) * kMs << std::min(recent - 1, 4);
  t.readmit_ns = now + hold;
  emit({0, unix_s(), "link_up", -1, -1, name,
        why + "; re-admitted after " + std::to_string(hold / kMs) + " ms if it stays up"});
}

void Monitor::sample(int64_t now) {
  // One call for every peer: an NCCL plugin holds a peer per connection, hundreds of them.
  std::map<int, std::vector<RailStats>> by_peer = ep_->all_rail_stats();
  std::vector<int> peers;
  for (const auto& [peer, rails] : by_peer) peers.push_back(peer);
  for (int peer : peers) {
    const std::vector<RailStats>& stats = by_peer[peer];
    double best = 0;
    std::vector<double> bw(stats.size(), 0);
    for (size_t k = 0; k < stats.size(); k++) {
      const RailStats& s = stats[k];
      RailTrack& t = rails_[{peer, s.rail}];
      const std::string nic = s.local_nic_name;
      if (!t.seen) {
        t.seen = true;
        t.acked = s.acked_bytes;
        t.busy_s = s.busy_s;
        t.failures = s.failures;
        t.recoveries = s.recoveries;
        t.weight = s.weight;
      }
      if (s.failures > t.failures)
        emit({0, unix_s(), "rail_failed", peer, s.rail, nic, s.last_error});
      if (s.recoveries > t.recoveries) emit({0, unix_s(), "rail_recovered", peer, s.rail, nic, "failback"});
      t.failures = s.failures;
      t.recoveries = s.recoveries;
      double d_busy = s.busy_s - t.busy_s;
      uint64_t d_acked = s.acked_bytes - t.acked;
      if (d_busy >= kMinBusyS && s.state == RailState::kUp) {
        double rate = static_cast<double>(d_acked) / d_busy;
        // Smoothed over ~200 ms: a rail shares its NIC with other peers' rails, and samples
        // of 50 ms catch bursts and TCP's unfairness among them.
        t.bw = t.bw > 0 ? (1 - kBwAlpha) * t.bw + kBwAlpha * rate : rate;
        t.acked = s.acked_bytes;
        t.busy_s = s.busy_s;
      } else if (s.state != RailState::kUp) {
        t.acked = s.acked_bytes;
        t.busy_s = s.busy_s;
      }
      last_stats_[{peer, s.rail}] = s;
      if (s.state == RailState::kUp && t.bw > 0) {
        bw[k] = t.bw;
        best = std::max(best, t.bw);
      }
    }
    if (best <= 0) continue;
    for (size_t k = 0; k < stats.size(); k++) {
      if (bw[k] <= 0) continue;
      const RailStats& s = stats[k];
      RailTrack& t = rails_[{peer, s.rail}];
      // Rails within 25% of the best count as equal: measurement noise (queues, token-bucket
      // bursts) must not shrink a healthy rail's window.
      double target = std::clamp(bw[k] / best, kMinWeight, 1.0);
      if (target >= 0.75) target = 1.0;
      t.ratio = target;
      // Three samples in a row must agree before anything changes (a lone sample may catch a
      // slow start or a burst), and a weight changes at most every 200 ms.
      t.below = target < 0.5 ? t.below + 1 : 0;
      t.above = target >= 0.8 ? t.above + 1 : 0;
      if (t.below >= kAgree && !t.degraded) {
        t.degraded = true;
        emit({0, unix_s(), "degraded", peer, s.rail, s.local_nic_name,
              "delivers " + fmt_rate(bw[k]) + ", " + std::to_string(static_cast<int>(100 * bw[k] / best)) +
                  "% of its best sibling (" + fmt_rate(best) + ")"});
      } else if (t.above >= kAgree && t.degraded) {
        t.degraded = false;
        emit({0, unix_s(), "restored", peer, s.rail, s.local_nic_name,
              "delivers " + fmt_rate(bw[k]) + " again (best sibling " + fmt_rate(best) + ")"});
      }
      if (!cfg_.adaptive_weights) continue;
      // Hysteresis: only a change of more than 25%.
      bool big = target < 0.8 * t.weight || target > 1.25 * t.weight;
      t.pending = big ? t.pending + 1 : 0;
      if (t.pending >= kAgree && now - t.weight_ns >= kWeightHoldNs) {
        ep_->set_rail_weight(peer, s.rail, target);
        t.weight = target;
        t.weight_ns = now;
        t.pending = 0;
      }
    }
  }
  steer_backups(by_peer, now);
  // Forget the rails of peers that are gone (an NCCL plugin opens and closes connections
  // for the life of the job: their tracks must not pile up).
  for (auto it = rails_.begin(); it != rails_.end();) {
    auto p = by_peer.find(it->first.first);
    it = p == by_peer.end() || p->second.empty() ? rails_.erase(it) : std::next(it);
  }
  update_capacity(by_peer);
}

// Backups of a degraded primary (an NCCL plugin's per-NIC devices, R2CCL's model: a
// connection's rail on its own NIC carries it, the others stand by). The sibling comparison
// above cannot see a primary that slows without failing, since its standbys carry nothing to
// compare with; the other NICs' primaries can. A local NIC whose primaries deliver under half
// of what the best NIC's deliver, kAgree samples in a row, is degraded: every connection whose
// primaries all use degraded NICs gets its backups to work (standby off), and the weights
// above then split its traffic by what each rail delivers. A primary with a trickle of the
// traffic measures its recovery poorly (small windows, short busy spells), so the backups are
// released to try the primary alone again after kProbeFirstNs, the wait doubling up to
// kProbeMaxNs while it stays degraded; the primary's weight is 1 for the try, and kAgree slow
// samples put the backups back to work. With one NIC's connections only (a process driving
// one GPU) there is nothing to compare with.
void Monitor::steer_backups(const std::map<int, std::vector<RailStats>>& by_peer, int64_t now) {   // mu_ held
  constexpr int64_t kProbeFirstNs = 1000 * kMs, kProbeMaxNs = 16000 * kMs;
  const size_t n = nics_.size();
  nic_slow_.resize(n, 0);
  nic_fine_.resize(n, 0);
  nic_degraded_.resize(n, false);
  std::vector<double> rate(n, 0);
  bool standby_seen = false;
  // A standby rail this monitor put to work is still a backup, not a primary.
  auto engaged_rail = [&](int peer, int rail) {
    auto e = engaged_.find(peer);
    return e != engaged_.end() && std::find(e->second.rails.begin(), e->second.rails.end(), rail) != e->second.rails.end();
  };
  for (auto& [peer, stats] : by_peer) {
    for (auto& s : stats) {
      standby_seen = standby_seen || s.standby;
      auto it = rails_.find({peer, s.rail});
      if (s.standby || engaged_rail(peer, s.rail) || s.state != RailState::kUp || it == rails_.end() || s.local_nic < 0 ||
          static_cast<size_t>(s.local_nic) >= n)
        continue;
      rate[static_cast<size_t>(s.local_nic)] = std::max(rate[static_cast<size_t>(s.local_nic)], it->second.bw);
    }
  }
  if (!standby_seen && engaged_.empty()) return;
  const double best = *std::max_element(rate.begin(), rate.end());
  for (size_t k = 0; k < n; k++) {
    if (best <= 0 || rate[k] <= 0) continue;   // nothing measured on it this time: no change
    nic_slow_[k] = rate[k] < 0.5 * best ? nic_slow_[k] + 1 : 0;
    nic_fine_[k] = rate[k] >= 0.8 * best ? nic_fine_[k] + 1 : 0;
    if (nic_slow_[k] >= kAgree) nic_degraded_[k] = true;
    if (nic_fine_[k] >= kAgree) nic_degraded_[k] = false;
  }
  for (auto& [peer, stats] : by_peer) {
    auto eng = engaged_.find(peer);
    auto is_ours = [&](int rail) { return engaged_rail(peer, rail); };
    bool primary = false, all_degraded = true;
    std::string nic_names;
    for (auto& s : stats) {
      if (s.standby || is_ours(s.rail)) continue;
      primary = true;
      all_degraded = all_degraded && s.local_nic >= 0 && static_cast<size_t>(s.local_nic) < n &&
                     nic_degraded_[static_cast<size_t>(s.local_nic)];
      nic_names += (nic_names.empty() ? "" : ", ") + s.local_nic_name;
    }
    if (!primary) continue;
    auto& backoff = probe_backoff_[peer];   // (wait, last probe)
    if (all_degraded && eng == engaged_.end()) {
      std::vector<int> rails;
      for (auto& s : stats)
        if (s.standby) rails.push_back(s.rail);
      if (rails.empty()) continue;
      try {
        for (int r : rails) ep_->set_rail_standby(peer, r, false);
      } catch (const Error&) {
        continue;   // the connection closed meanwhile
      }
      // Degraded again soon after a probe: wait twice as long before the next one.
      backoff.first = backoff.second > 0 && now - backoff.second < 2 * std::max(backoff.first, kProbeFirstNs)
                          ? std::min(kProbeMaxNs, 2 * std::max(backoff.first, kProbeFirstNs))
                          : kProbeFirstNs;
      engaged_[peer] = Engaged{rails, now + backoff.first};
      emit({0, unix_s(), "backups_engaged", peer, -1, nic_names,
            "its primary NIC delivers under half of the best NIC's rate: " + std::to_string(rails.size()) +
                " backup rail(s) carry its traffic by weight; the primary is tried alone again in " +
                std::to_string(backoff.first / kMs) + " ms"});
    } else if (eng != engaged_.end() && (!all_degraded || now >= eng->second.probe_ns)) {
      const bool probe = all_degraded;
      try {
        for (int r : eng->second.rails) ep_->set_rail_standby(peer, r, true);
        for (auto& s : stats)
          if (!s.standby && !is_ours(s.rail)) {
            ep_->set_rail_weight(peer, s.rail, 1.0);   // the primary carries it all: full window
            RailTrack& t = rails_[{peer, s.rail}];
            t.weight = 1.0;
            t.weight_ns = now;
            t.pending = 0;
            if (probe && s.local_nic >= 0 && static_cast<size_t>(s.local_nic) < n) {
              nic_degraded_[static_cast<size_t>(s.local_nic)] = false;   // fresh samples decide
              nic_slow_[static_cast<size_t>(s.local_nic)] = nic_fine_[static_cast<size_t>(s.local_nic)] = 0;
            }
          }
      } catch (const Error&) {
      }
      if (probe) backoff.second = now;
      emit({0, unix_s(), "backups_released", peer, -1, nic_names,
            probe ? "trying the primary alone again (it was degraded)" : "its primary NIC delivers again: the backups stand by"});
      engaged_.erase(eng);
    }
  }
  for (auto it = engaged_.begin(); it != engaged_.end();)
    it = by_peer.count(it->first) ? std::next(it) : engaged_.erase(it);
  for (auto it = probe_backoff_.begin(); it != probe_backoff_.end();)
    it = by_peer.count(it->first) ? std::next(it) : probe_backoff_.erase(it);
}

void Monitor::update_capacity(const std::map<int, std::vector<RailStats>>& by_peer) {   // mu_ held
  double cap = 0;
  for (size_t k = 0; k < nics_.size(); k++) {
    if (!nics_[k].admitted || !nics_[k].link_up) continue;
    double f = by_peer.empty() ? 1.0 : 0.0;
    for (auto& [peer, stats] : by_peer)
      for (auto& s : stats)
        if (s.local_nic == static_cast<int>(k) && s.state == RailState::kUp) {
          auto it = rails_.find({peer, s.rail});
          f = std::max(f, it == rails_.end() ? 1.0 : it->second.ratio);
        }
    // Within 40% of the best counts as healthy: the planner must not chase measurement noise
    // (a NIC's rails share it with other peers' traffic, and samples catch bursts). A NIC that
    // is down counts 0 at once; one slowed to a tenth, ~0.1 after a few hundred ms.
    cap += f >= 0.6 ? 1.0 : f;
  }
  capacity_->store(cap);
}

void Monitor::emit(Event e) {   // mu_ held
  std::string where = e.peer >= 0 ? "rail " + std::to_string(e.rail) + " to " + ep_->peer_name(e.peer) + " (" + e.nic + ")"
                                  : "NIC " + e.nic;
  R2_WARN("health: %s %s: %s", where.c_str(), e.kind.c_str(), e.detail.c_str());
  e.seq = next_seq_++;
  if (e.peer >= 0) rails_[{e.peer, e.rail}].last_event = e.kind + ": " + e.detail;
  events_.push_back(std::move(e));
  if (events_.size() > kEventsKept) events_.pop_front();
  cv_.notify_all();
}

std::vector<RailHealth> Monitor::rails() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<RailHealth> out;
  for (auto& [key, s] : last_stats_) {
    RailHealth h;
    h.peer = key.first;
    h.stats = s;
    auto it = rails_.find(key);
    if (it != rails_.end()) {
      h.bandwidth_Bps = it->second.bw;
      h.last_event = it->second.last_event;
    }
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<NicHealth> Monitor::nics() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<NicHealth> out;
  for (auto& t : nics_) {
    NicHealth h;
    h.name = t.name;
    h.ifname = t.ifname;
    h.addr = t.addr;
    h.link_up = t.link_up;
    h.admitted = t.admitted;
    h.source = t.ifindex ? source_ : "none";
    h.downs = t.total_downs;
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<Event> Monitor::events(uint64_t after, double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  auto have = [&] { return stop_ || (!events_.empty() && events_.back().seq > after); };
  if (!have() && timeout_s > 0) cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), have);
  std::vector<Event> out;
  for (auto& e : events_)
    if (e.seq > after) out.push_back(e);
  return out;
}

}  // namespace r2ccl::monitor
