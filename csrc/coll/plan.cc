// Degraded-mode plans and their cost model (see plan.h and docs/plans.md).
#include "coll/plan.h"
#include "base/enum_names.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace r2ccl::coll {

namespace {
constexpr double kMinCapacity = 1e-3;   // a process with no NIC left still gets a finite time
// No host has a million healthy NICs: a larger capacity (a peer's bytes say so) is clamped,
// so sums of capacities stay finite (the fuzzer found 1e308s summing to infinity and
// every share becoming 0: tests/fuzz/regressions/signature/).
constexpr double kMaxCapacity = 1e6;

std::vector<double> clamp_capacities(const std::vector<double>& c) {
  std::vector<double> out(c.size());
  for (size_t i = 0; i < c.size(); i++)
    out[i] = std::isfinite(c[i]) ? std::clamp(c[i], kMinCapacity, kMaxCapacity) : kMinCapacity;
  return out;
}
}  // namespace

const char* plan_name(PlanKind k) { return enum_name(kPlanNames, k, "?"); }

bool parse_plan(const std::string& s, PlanKind* out) { return parse_enum(kPlanNames, s, out); }

namespace {
// "R2CCL_X must be a, b or c" when `value` is none of the table's names, else empty.
template <typename E, size_t N>
std::string setting_error(const char* setting, const char* const (&table)[N], const std::string& value) {
  E k;
  if (parse_enum(table, value, &k)) return {};
  std::string all;
  for (size_t i = 0; i < N; i++) all += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + table[i];
  return std::string(setting) + " must be " + all;
}
}  // namespace

std::string plan_setting_error(const std::string& plan) {
  return setting_error<PlanKind>("R2CCL_PLAN", kPlanNames, plan);
}

const char* algo_name(AlgoKind k) { return enum_name(kAlgoNames, k, "?"); }

bool parse_algo(const std::string& s, AlgoKind* out) { return parse_enum(kAlgoNames, s, out); }

std::string algo_setting_error(const std::string& algo) {
  return setting_error<AlgoKind>("R2CCL_ALGO", kAlgoNames, algo);
}

AlgoKind choose_algo(AlgoKind want, int processes, int max_peers, bool all_reduce, double bytes) {
  if (want == AlgoKind::kAuto) {
    if (processes - 1 <= max_peers) return AlgoKind::kDirect;
    const bool small = bytes <= static_cast<double>(kSmallAllReduceBytes);
    if (all_reduce && small && bytes * processes <= static_cast<double>(kDoublingMaxBytes)) return AlgoKind::kDoubling;
    return all_reduce && two_level_group(processes, max_peers) >= 2 ? AlgoKind::kTwoLevel : AlgoKind::kRing;
  }
  if ((want == AlgoKind::kDoubling || want == AlgoKind::kTwoLevel) && !all_reduce) return AlgoKind::kRing;
  return want;
}

int two_level_group(int processes, int max_peers) {
  for (int m = std::min(std::max(1, max_peers), processes); m > 1; m--)
    if (processes % m == 0) return m;
  return 1;
}

double two_level_load(int m, int g, int k) {
  if (g < 2) return m - 2.0;
  // Out: the running fold to group k+1 (all but the last group), the result on around the
  // groups (g-1 -> 0 -> 1 -> ... -> g-2: all but group g-2). In: the fold from group k-1 (all
  // but the first), the result (all but the last).
  const int out = (k < g - 1 ? 1 : 0) + (k != g - 2 ? 1 : 0);
  const int in = (k > 0 ? 1 : 0) + (k != g - 1 ? 1 : 0);
  return m - 2.0 + std::max(out, in);
}

std::vector<int> doubling_partners(int me, int P) {
  std::vector<int> out;
  for (int d = 1; d < P; d <<= 1)
    for (int q : {((me - d) % P + P) % P, (me + d) % P})
      if (q != me && std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
  std::sort(out.begin(), out.end());
  return out;
}

int algo_peers(AlgoKind k, int processes, int max_peers) {
  if (processes < 2) return 0;
  if (k == AlgoKind::kRing) return processes == 2 ? 1 : 2;
  if (k == AlgoKind::kDoubling) return static_cast<int>(doubling_partners(0, processes).size());
  if (k == AlgoKind::kTwoLevel) {
    const int m = two_level_group(processes, max_peers), g = processes / m;
    return m - 1 + (g > 2 ? 2 : g - 1);   // its group, and its column's neighbours in the next and previous groups
  }
  return processes - 1;
}

double algo_buffer_bytes(AlgoKind k, int P, double bytes, double max_share, int max_peers) {
  if (P < 2) return 0;
  switch (k) {
    case AlgoKind::kRing: return bytes;                                  // a partial per piece
    case AlgoKind::kDoubling: return static_cast<double>(P) * bytes;     // every local sum
    case AlgoKind::kTwoLevel:                                            // contributions, the fold in and out
      return (static_cast<double>(two_level_group(P, max_peers)) + 1) * max_share * bytes;
    default: return (static_cast<double>(P) - 1) * max_share * bytes;     // the contributions to its segment
  }
}

double predict_doubling_seconds(const std::vector<double>& c_in, double bytes, double nic_Bps, double alpha_s) {
  const size_t P = c_in.size();
  if (P < 2) return 0;
  const std::vector<double> c = clamp_capacities(c_in);
  int rounds = 0;
  for (size_t d = 1; d < P; d <<= 1) rounds++;
  const double cmin = *std::min_element(c.begin(), c.end());
  return rounds * alpha_s + (static_cast<double>(P) - 1) * bytes / (cmin * nic_Bps);
}

std::vector<int> startup_peers(AlgoKind want, int me, int world, int max_peers) {
  std::vector<int> out;
  if (world < 2) return out;
  const AlgoKind k = choose_algo(want, world, max_peers);
  if (k == AlgoKind::kRing) {
    out = {(me + world - 1) % world, (me + 1) % world};
  } else if (k == AlgoKind::kTwoLevel) {
    const int m = two_level_group(world, max_peers), g = world / m, group = me / m;
    for (int p = group * m; p < group * m + m; p++) out.push_back(p);
    if (g > 1) out.push_back((me + m) % world), out.push_back((me - m + world) % world);
  } else {
    for (int p = 0; p < world; p++) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), me), out.end());
  return out;
}

double predict_ring_seconds(const std::vector<double>& c_in, double bytes, double nic_Bps, double alpha_s,
                            double piece_bytes) {
  const size_t P = c_in.size();
  if (P < 2) return 0;
  const std::vector<double> c = clamp_capacities(c_in);
  double worst = 0;
  for (size_t i = 0; i < P; i++) {
    // Partials go 0 -> 1 -> ... -> P-1; the result P-1 -> 0 -> 1 -> ... -> P-2.
    const double out = (i + 1 < P ? bytes : 0) + (i + 2 < P || i + 1 == P ? bytes : 0);
    const double in = (i > 0 ? bytes : 0) + (i + 1 < P ? bytes : 0);
    worst = std::max(worst, std::max(out, in) / (c[i] * nic_Bps));
  }
  // The pipeline's fill: the first piece reaches the last process after P - 1 hops; from
  // then on the busiest links stay busy (the result's pieces follow the partials).
  const double cmin = *std::min_element(c.begin(), c.end());
  const double hop = alpha_s + std::min(piece_bytes, bytes) / (cmin * nic_Bps);
  return worst + (static_cast<double>(P) - 1) * hop;
}

std::vector<double> plan_shares(PlanKind k, const std::vector<double>& c_in, double load) {
  const size_t P = c_in.size();
  std::vector<double> s(P, P ? 1.0 / static_cast<double>(P) : 0.0);
  if (P < 2) return s;
  const std::vector<double> c = clamp_capacities(c_in);
  const double cmax = *std::max_element(c.begin(), c.end());
  switch (k) {
    case PlanKind::kAuto:
    case PlanKind::kBalance:
      break;
    case PlanKind::kWeighted: {
      // Ownership in proportion to capacity.
      double sum = std::accumulate(c.begin(), c.end(), 0.0);
      for (size_t i = 0; i < P; i++) s[i] = c[i] / sum;
      break;
    }
    case PlanKind::kR2cc: {
      // R2CCL's R2CC-AllReduce in ownership terms: (1-X) of a degraded process's bytes go
      // through the all-process exchange (it owns (1-X)/P), the rest through the healthy
      // processes only (they share what it does not own).
      double given = 0;
      size_t healthy = 0;
      for (size_t i = 0; i < P; i++) {
        if (c[i] < cmax * (1 - 1e-9)) {
          s[i] = (c[i] / cmax) / static_cast<double>(P);
          given += s[i];
        } else {
          healthy++;
        }
      }
      for (size_t i = 0; i < P; i++)
        if (c[i] >= cmax * (1 - 1e-9)) s[i] = (1 - given) / static_cast<double>(healthy);
      break;
    }
    case PlanKind::kOptimal: {
      // Minimise max_i (1 + L s_i) / c_i with sum s = 1, s >= 0 (L = `load`, the direct
      // exchange's P-2): every process with a share finishes at the same time T,
      // s_i = (T c_i - 1) / L; the slowest may own nothing. Solved exactly by trying the k
      // fastest as owners. (L = 0, two processes: each moves D whatever it owns.)
      const double p2 = load < 0 ? static_cast<double>(P) - 2 : load;
      if (!(p2 > 0)) break;
      std::vector<size_t> order(P);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return c[a] > c[b]; });
      double T = 0, csum = 0;
      for (size_t k2 = 1; k2 <= P; k2++) {
        csum += c[order[k2 - 1]];
        double t = (p2 + static_cast<double>(k2)) / csum;
        bool kth_positive = t * c[order[k2 - 1]] >= 1;
        bool next_zero = k2 == P || t * c[order[k2]] <= 1;
        if (kth_positive && next_zero) {
          T = t;
          break;
        }
      }
      double sum = 0;
      for (size_t i = 0; i < P; i++) {
        s[i] = std::max(0.0, (T * c[i] - 1) / p2);
        sum += s[i];
      }
      if (!(sum > 0)) return std::vector<double>(P, 1.0 / static_cast<double>(P));
      for (auto& x : s) x /= sum;
      break;
    }
  }
  return s;
}

double predict_seconds(const std::vector<double>& shares, const std::vector<double>& c_in, double bytes,
                       double nic_Bps, double alpha_s, double load, double first_piece, int flows) {
  const size_t P = shares.size();
  if (P < 2 && load < 0) return 0;
  const std::vector<double> c = clamp_capacities(c_in);
  const double L = load < 0 ? static_cast<double>(P) - 2 : load;
  const double piece = flows > 0 ? std::min(first_piece, bytes / flows) : 0;
  double worst = 0;
  for (size_t i = 0; i < P; i++) {
    const double moved = bytes * (1 + L * shares[i]);
    const double wait = flows * std::max(0.0, piece - shares[i] * bytes);
    worst = std::max(worst, (moved + wait) / (c[i] * nic_Bps));
  }
  return worst + 2 * alpha_s;
}

PlanChoice choose_plan(PlanKind want, const std::vector<double>& c, double bytes, double nic_Bps, double alpha_s,
                       double load, double first_piece, int flows) {
  // The plans are ranked by the bandwidth term alone; the pipeline's start (at most one piece
  // per owner) is in the time reported, not in the choice, so which plan runs does not
  // depend on the piece size.
  PlanChoice best;
  if (want != PlanKind::kAuto) {
    best.kind = want;
    best.shares = plan_shares(want, c, load);
  } else {
    bool first = true;
    for (PlanKind k : {PlanKind::kBalance, PlanKind::kR2cc, PlanKind::kWeighted, PlanKind::kOptimal}) {
      std::vector<double> s = plan_shares(k, c, load);
      double t = predict_seconds(s, c, bytes, nic_Bps, alpha_s, load);
      if (first || t < best.predicted_s * (1 - 1e-9)) {   // ties keep the simpler plan
        best.kind = k;
        best.shares = std::move(s);
        best.predicted_s = t;
        first = false;
      }
    }
  }
  best.predicted_s = predict_seconds(best.shares, c, bytes, nic_Bps, alpha_s, load, first_piece, flows);
  return best;
}

TwoLevelChoice choose_two_level(PlanKind want, const std::vector<double>& c_in, int m, double bytes, double nic_Bps,
                                double alpha_s, double piece_bytes) {
  TwoLevelChoice out;
  const int P = static_cast<int>(c_in.size());
  if (m < 1 || P < 1 || P % m != 0) return out;
  const int g = P / m;
  const std::vector<double> c = clamp_capacities(c_in);
  double worst = 0;
  for (int k = 0; k < g; k++) {
    const std::vector<double> ck(c.begin() + k * m, c.begin() + (k + 1) * m);
    out.groups.push_back(choose_plan(want, ck, bytes, nic_Bps, alpha_s, two_level_load(m, g, k),
                                     std::ldexp(piece_bytes, -static_cast<int>(kTwoLevelTaper)), m - 1));
    worst = std::max(worst, out.groups.back().predicted_s);
  }
  // The fill: a piece's running fold crosses g - 1 groups and its result g - 1 more.
  const double cmin = *std::min_element(c.begin(), c.end());
  const double hop = alpha_s + std::min(piece_bytes, bytes / m) / (cmin * nic_Bps);
  out.predicted_s = worst + 2.0 * (g - 1) * hop;
  return out;
}

std::vector<uint64_t> share_boundaries(const std::vector<double>& shares, uint64_t n) {
  const size_t P = shares.size();
  std::vector<uint64_t> b(P + 1, 0);
  double cum = 0;
  for (size_t i = 0; i < P; i++) {
    cum += shares[i];
    // In double until clamped: n * cum may round past n (or be NaN for shares no process
    // sends, see tests/fuzz/fuzz_signature.cc), and a cast out of range is undefined.
    const double x = std::floor(static_cast<double>(n) * cum + 0.5);
    const uint64_t v = i + 1 == P || !(x < static_cast<double>(n)) ? n : x > 0 ? static_cast<uint64_t>(x) : 0;
    b[i + 1] = std::clamp<uint64_t>(v, b[i], n);
  }
  return b;
}

}  // namespace r2ccl::coll
