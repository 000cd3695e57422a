// Degraded-mode plans for the all-reduce: which share of the vector each process owns (reduces
// and sends back to everyone), chosen from every process's capacity (bandwidth in units of one
// healthy NIC, from the health monitor) with an alpha-beta cost model. Ownership changes which
// process adds an element's contributions, never the order they are added in (canonical
// process order), so every plan gives the same bits. See docs/plans.md for the argument.
// Knows nothing of sockets or JAX.
#pragma once
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

namespace r2ccl::coll {

enum class PlanKind : int { kAuto = 0, kBalance, kR2cc, kWeighted, kOptimal };
// The plans' names in enum order: the one list (R2CCL_PLAN's values), exported by
// _core.names() for the bench's --plan and the simulator.
inline constexpr const char* kPlanNames[] = {"auto", "balance", "r2cc", "weighted", "optimal"};
static_assert(std::size(kPlanNames) == static_cast<size_t>(PlanKind::kOptimal) + 1, "a PlanKind without a name");
const char* plan_name(PlanKind k);
// Inverse of plan_name; false when unknown.
bool parse_plan(const std::string& s, PlanKind* out);
// R2CCL_PLAN's check, which Config::validate leaves to this layer (base/ does not know the
// plans): empty when `plan` names one, else a sentence naming the setting and every plan.
std::string plan_setting_error(const std::string& plan);

struct PlanChoice {
  PlanKind kind = PlanKind::kBalance;   // never kAuto
  std::vector<double> shares;           // per process in canonical order, sum 1
  double predicted_s = 0;               // cost model, for `bytes` and `nic_Bps`
};

// Shares for one plan over processes of capacities c (NIC units; 0 is treated as tiny).
std::vector<double> plan_shares(PlanKind k, const std::vector<double>& c);

// Cost model of the owner all-reduce (every process sends its contributions straight to each
// owner, owners send results straight back): process i moves D(1 + (P-2) s_i) out and as much
// in over capacity c_i * nic_Bps, full duplex; plus two message latencies.
double predict_seconds(const std::vector<double>& shares, const std::vector<double>& c, double bytes,
                       double nic_Bps, double alpha_s);

// The plan to run: `want`, or for kAuto the one the model predicts fastest (ties: the simpler).
PlanChoice choose_plan(PlanKind want, const std::vector<double>& c, double bytes, double nic_Bps, double alpha_s);

// Element boundaries of the owners' segments: b[0] = 0, b[P] = n, b[i+1] - b[i] ~ shares[i] * n.
// A pure function of its arguments, so every process computes the same split.
std::vector<uint64_t> share_boundaries(const std::vector<double>& shares, uint64_t n);

}  // namespace r2ccl::coll
