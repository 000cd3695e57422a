// Tests for csrc/coll/plan.{h,cc}: the plans' shares against the closed forms of
// docs/plans.md, the optimum against a brute-force search, the lower bounds, boundaries, and
// hostile capacities (zero, negative, NaN, one process). Standalone: exits non-zero and names
// each failing check.
#include "coll/plan.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>
#include "check.h"

using namespace r2ccl::coll;

namespace {

bool near(double a, double b, double tol = 1e-9) { return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b)); }

std::string str(const std::vector<double>& v) {
  std::string s = "[";
  for (double x : v) s += std::to_string(x) + " ";
  return s + "]";
}

// max_i (1 + (P-2) s_i) / c_i: the model's time in units of D / B.
double cost(const std::vector<double>& s, const std::vector<double>& c) {
  return predict_seconds(s, c, 1.0, 1.0, 0.0);
}

void shares_are_a_split(PlanKind k, const std::vector<double>& c) {
  std::vector<double> s = plan_shares(k, c);
  double sum = std::accumulate(s.begin(), s.end(), 0.0);
  bool nonneg = true;
  for (double x : s) nonneg = nonneg && x >= 0 && std::isfinite(x);
  check(s.size() == c.size() && nonneg && (c.empty() || near(sum, 1.0, 1e-12)),
        std::string(plan_name(k)) + " shares " + str(s) + " for capacities " + str(c) + " are not a split");
}

}  // namespace

int main() {
  const double X25 = 0.25, X50 = 0.5;
  // Closed forms for P = 4, one host at 1 - X (docs/plans.md, and the paper's for balance/r2cc).
  for (double X : {X25, X50}) {
    std::vector<double> c = {4, 4, 4, 4 * (1 - X)};
    const double healthy = cost(plan_shares(PlanKind::kBalance, {4, 4, 4, 4}), {4, 4, 4, 4});
    check(near(healthy, 1.5 / 4), "healthy balance costs 1.5 D/B");
    check(near(cost(plan_shares(PlanKind::kBalance, c), c) / healthy, 1 / (1 - X)), "balance = 1/(1-X)");
    check(near(cost(plan_shares(PlanKind::kR2cc, c), c) / healthy, 1 + 4 * X / (2 * 3 * (1 - X))),
          "r2cc = 1 + nX/(2(n-1)(1-X))");
    double opt = cost(plan_shares(PlanKind::kOptimal, c), c);
    // The two lower bounds of docs/plans.md: the slow host moves D; 2(P-1)D over sum c.
    double bound = std::max(1.0 / (4 * (1 - X)), 2.0 * 3 / (12 + 4 * (1 - X)));
    check(near(opt, bound), "optimal meets the lower bound at X=" + std::to_string(X) + ": " + std::to_string(opt) +
                                " vs " + std::to_string(bound));
  }
  check(near(plan_shares(PlanKind::kOptimal, {4, 4, 4, 2})[3], 0.0), "the slow host owns nothing at X=0.5");
  check(near(plan_shares(PlanKind::kOptimal, {4, 4, 4, 3})[3], 0.1), "the slow host owns 0.1 at X=0.25");

  // The optimum is no worse than any split a coarse search finds (P = 3, 4, 5).
  uint64_t rng = 12345;
  auto uni = [&] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(rng >> 11) / static_cast<double>(1ull << 53);
  };
  for (int trial = 0; trial < 300; trial++) {
    size_t P = 3 + static_cast<size_t>(trial % 3);
    std::vector<double> c(P);
    for (auto& x : c) x = 0.1 + 4 * uni();
    double opt = cost(plan_shares(PlanKind::kOptimal, c), c);
    for (int k = 0; k < 400; k++) {
      std::vector<double> s(P);
      double sum = 0;
      for (auto& x : s) sum += (x = uni() * uni());
      for (auto& x : s) x /= sum;
      if (cost(s, c) < opt * (1 - 1e-9)) {
        check(false, "a random split beats optimal for " + str(c) + ": " + str(s));
        break;
      }
    }
    for (PlanKind k : {PlanKind::kBalance, PlanKind::kR2cc, PlanKind::kWeighted})
      check(cost(plan_shares(k, c), c) >= opt * (1 - 1e-9), std::string(plan_name(k)) + " beats optimal");
    PlanChoice a = choose_plan(PlanKind::kAuto, c, 1.0, 1.0, 0.0);
    check(near(a.predicted_s, opt), "auto picks the fastest");
    for (PlanKind k : {PlanKind::kBalance, PlanKind::kR2cc, PlanKind::kWeighted, PlanKind::kOptimal})
      shares_are_a_split(k, c);
  }

  // Equal capacities: every plan is balance, and auto says so.
  for (PlanKind k : {PlanKind::kR2cc, PlanKind::kWeighted, PlanKind::kOptimal}) {
    std::vector<double> s = plan_shares(k, {2, 2, 2, 2});
    for (double x : s) check(near(x, 0.25), std::string(plan_name(k)) + " with equal capacities is even");
  }
  check(choose_plan(PlanKind::kAuto, {3, 3, 3}, 1, 1, 0).kind == PlanKind::kBalance, "auto keeps balance when equal");

  // Hostile capacities never give a non-split or a non-finite time.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (auto c : std::vector<std::vector<double>>{{}, {1}, {0, 0, 0}, {4, 0, 4}, {-1, 4, 4, 4}, {nan, 4, 4},
                                                  {inf, 4, 4, 4}, {4, 4}, {1e-300, 1e300, 1}}) {
    for (PlanKind k : {PlanKind::kBalance, PlanKind::kR2cc, PlanKind::kWeighted, PlanKind::kOptimal}) {
      shares_are_a_split(k, c);
      double t = predict_seconds(plan_shares(k, c), c, 1e6, 1e6, 1e-5);
      check(std::isfinite(t) && t >= 0, std::string(plan_name(k)) + " time not finite for " + str(c));
    }
  }

  // Boundaries: monotone, cover [0, n], follow the shares, identical when recomputed.
  for (uint64_t n : {0ull, 1ull, 7ull, 1000003ull, 1ull << 40}) {
    std::vector<double> s = plan_shares(PlanKind::kOptimal, {4, 4, 4, 3});
    std::vector<uint64_t> b = share_boundaries(s, n);
    bool mono = b.front() == 0 && b.back() == n;
    for (size_t i = 0; i + 1 < b.size(); i++) {
      mono = mono && b[i] <= b[i + 1];
      double want = s[i] * static_cast<double>(n);
      mono = mono && std::fabs(static_cast<double>(b[i + 1] - b[i]) - want) <= 1.0 + 1e-9 * want;
    }
    check(mono, "boundaries for n=" + std::to_string(n));
    check(b == share_boundaries(s, n), "boundaries are a pure function");
  }
  check(share_boundaries({0.5, 0.0, 0.5}, 10)[1] == share_boundaries({0.5, 0.0, 0.5}, 10)[2],
        "a zero share is an empty segment");

  PlanKind k;
  check(parse_plan("optimal", &k) && k == PlanKind::kOptimal && !parse_plan("ring", &k), "plan names");

  // Algorithms (docs/plans.md, "Algorithms"): auto is direct within max_peers, then doubling
  // for small all-reduces whose local sums fit kDoublingMaxBytes, two_level for a large one
  // where groups of 2+ exist, the ring for the rest.
  check(choose_algo(AlgoKind::kAuto, 17, 16, true, 1e9) == AlgoKind::kDirect, "auto within max_peers: direct");
  check(choose_algo(AlgoKind::kAuto, 18, 16, true, 1e9) == AlgoKind::kTwoLevel, "auto past max_peers: two_level");
  check(choose_algo(AlgoKind::kAuto, 19, 16, true, 1e9) == AlgoKind::kRing, "a prime count: the ring");
  check(choose_algo(AlgoKind::kAuto, 18, 16, false, 1e9) == AlgoKind::kRing, "other kinds: the ring");
  check(choose_algo(AlgoKind::kTwoLevel, 4, 16, false, 1e9) == AlgoKind::kRing, "two_level only all-reduces");
  check(choose_algo(AlgoKind::kAuto, 18, 16, true, 4096) == AlgoKind::kDoubling, "small: doubling");
  check(choose_algo(AlgoKind::kAuto, 1024, 16, true, 65536) == AlgoKind::kTwoLevel, "P x bytes past the bound: two_level");
  check(choose_algo(AlgoKind::kAuto, 18, 16, false, 4096) == AlgoKind::kRing, "small, other kinds: ring");
  check(choose_algo(AlgoKind::kDoubling, 4, 16, false, 4096) == AlgoKind::kRing, "doubling only all-reduces");
  check(choose_algo(AlgoKind::kRing, 2, 16, true, 1) == AlgoKind::kRing, "a forced algorithm stays");
  check(startup_peers(AlgoKind::kAuto, 0, 5, 16) == std::vector<int>({1, 2, 3, 4}), "direct: every peer at start");
  check(startup_peers(AlgoKind::kRing, 0, 5, 16) == std::vector<int>({1, 4}), "ring: the two neighbours");
  check(startup_peers(AlgoKind::kRing, 1, 2, 16) == std::vector<int>({0}), "ring of two: one neighbour");
  check(startup_peers(AlgoKind::kAuto, 0, 1, 16).empty(), "alone: nobody");
  check(startup_peers(AlgoKind::kAuto, 3, 12, 4) == std::vector<int>({0, 1, 2, 7, 11}),
        "two_level: the group and the column's neighbours");
  check(startup_peers(AlgoKind::kAuto, 5, 8, 4) == std::vector<int>({1, 4, 6, 7}), "two groups: one column neighbour");
  check(two_level_group(128, 16) == 16 && two_level_group(18, 16) == 9 && two_level_group(19, 16) == 1 &&
            two_level_group(8, 4) == 4 && two_level_group(6, 1) == 1,
        "two_level groups: the largest divisor within max_peers");
  check(algo_peers(AlgoKind::kTwoLevel, 128, 16) == 17 && algo_peers(AlgoKind::kTwoLevel, 8, 4) == 4,
        "two_level peers: the group and two (one) column neighbours");
  // The two_level model: with two groups a process moves the direct exchange's 2D(P-1)/P
  // (1.75 D for 8 processes in groups of 4); a middle group of three moves the ring's 2D; a host
  // at half its NICs owns less inside its group: 8/7 of healthy (the direct's optimal plan too).
  check(near(two_level_load(4, 2, 0), 3.0) && near(two_level_load(4, 2, 1), 3.0) &&
            near(two_level_load(4, 3, 1), 4.0) && near(two_level_load(4, 3, 0), 4.0) && near(two_level_load(4, 3, 2), 3.0),
        "two_level loads");
  const double tl_healthy = choose_two_level(PlanKind::kAuto, std::vector<double>(8, 1.0), 4, 1.0, 1.0, 0.0, 0.0).predicted_s;
  check(near(tl_healthy, 1.75), "two_level, 2 x 4 healthy: 1.75 D/B");
  std::vector<double> tl_slow(8, 1.0);
  tl_slow[5] = 0.5;
  const TwoLevelChoice tls = choose_two_level(PlanKind::kAuto, tl_slow, 4, 1.0, 1.0, 0.0, 0.0);
  check(near(tls.predicted_s / tl_healthy, 2.0 / 1.75) && near(tls.groups[1].shares[1], 0.0) &&
            tls.groups[0].kind == PlanKind::kBalance,
        "two_level, a host at half: it owns nothing, 8/7 of healthy, the other group untouched");
  // The pipeline's start (plan.h): a process whose share of one contributor's data is below
  // a piece waits flows x (piece - s D) before its first result; none with healthy shares.
  {
    std::vector<double> x50(8, 1.0);
    x50[3] = 0.5;
    const double D = 64.0, piece = 1.0;   // MiB; one NIC = 1 MiB/s
    const PlanChoice without = choose_plan(PlanKind::kOptimal, x50, D, 1.0, 0.0);
    const PlanChoice with = choose_plan(PlanKind::kOptimal, x50, D, 1.0, 0.0, -1, piece, 7);
    check(near(with.shares[3], 0.0) && near(with.predicted_s - without.predicted_s, 7 * piece / 0.5),
          "pipeline start: a host owning nothing waits one piece per owner over its own link");
    check(near(predict_seconds(std::vector<double>(8, 0.125), std::vector<double>(8, 1.0), D, 1.0, 0.0, -1, piece, 7),
               predict_seconds(std::vector<double>(8, 0.125), std::vector<double>(8, 1.0), D, 1.0, 0.0)),
          "pipeline start: nothing for healthy shares of a large vector");
    const TwoLevelChoice t = choose_two_level(PlanKind::kAuto, x50, 4, D, 1.0, 0.0, piece);
    const TwoLevelChoice t0 = choose_two_level(PlanKind::kAuto, x50, 4, D, 1.0, 0.0, 0.0);
    check(near(t.groups[0].predicted_s - t0.groups[0].predicted_s, 3 * (piece / 8) / 0.5),
          "pipeline start, two_level: an eighth of a piece (the taper) to each of m - 1 owners");
  }
  check(near(choose_two_level(PlanKind::kBalance, std::vector<double>(12, 1.0), 4, 1.0, 1.0, 0.0, 0.0).predicted_s, 2.0),
        "two_level, three groups: the middle moves 2 D");
  check(doubling_partners(0, 8) == std::vector<int>({1, 2, 4, 6, 7}), "doubling partners of 8");
  check(algo_peers(AlgoKind::kDoubling, 128) == 13 && algo_peers(AlgoKind::kRing, 128) == 2 &&
            algo_peers(AlgoKind::kDirect, 128) == 127,
        "peers per algorithm");
  // The ring's model: a middle process moves 2D, so healthy P = 8 takes 2D/B (+ fill), the
  // owner exchange 1.75 D/B; a middle process at half capacity doubles the ring's bandwidth term.
  const std::vector<double> eight(8, 1.0);
  check(near(predict_ring_seconds(eight, 1.0, 1.0, 0.0, 0.0), 2.0), "ring, 8 healthy: 2 D/B");
  std::vector<double> slow_mid = eight, slow_end = eight;
  slow_mid[3] = 0.5;
  slow_end[7] = 0.5;
  check(near(predict_ring_seconds(slow_mid, 1.0, 1.0, 0.0, 0.0), 4.0), "ring, a slow middle process: 4 D/B");
  check(near(predict_ring_seconds(slow_end, 1.0, 1.0, 0.0, 0.0), 2.0), "ring, a slow last process: 2 D/B");
  check(near(predict_doubling_seconds(eight, 1.0, 1.0, 0.0), 7.0), "doubling: (P-1) D/B");
  check(near(algo_buffer_bytes(AlgoKind::kDoubling, 8, 10.0, 0), 80.0) &&
            near(algo_buffer_bytes(AlgoKind::kRing, 8, 10.0, 0), 10.0),
        "receive buffers");
  AlgoKind a;
  check(parse_algo("doubling", &a) && a == AlgoKind::kDoubling && !parse_algo("tree", &a) &&
            algo_setting_error("ring").empty() &&
            algo_setting_error("x") == "R2CCL_ALGO must be auto, direct, ring, doubling or two_level",
        "algorithm names");

  return checks_passed("test_plan");
}
