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

#include "base/config.h"

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

// The algorithm a collective runs (R2CCL_ALGO). direct: every process exchanges with every
// other (the owner all-reduce of the plans below, all-gather and broadcast straight from the
// source): the least data, P - 1 peers. ring: every process exchanges with its two ring
// neighbours only (canonical order, wrapping): the all-reduce's contributions are folded
// along the ring 0 -> 1 -> ... -> P-1 (one hop per process, pipelined in pieces, so every
// element still meets the canonical order) and the result travels on around the ring;
// all-gather, reduce-scatter and broadcast relay along it. All-to-all is always direct.
// doubling (all-reduce only; other kinds run the ring): recursive doubling after Bruck, any
// process count: in round r every process sends what it holds of the processes' local sums
// to the process 2^r before it on the ring and receives as much from the one 2^r after it;
// after ceil(log2 P) rounds each holds every local sum and folds them in canonical order. It
// moves (P - 1) times the vector: for small all-reduces, where the rounds (latency) rule.
// two_level (all-reduce only; other kinds run the ring): the processes in groups of
// two_level_group() contiguous ones (a rack stays a group); inside each group the owner
// exchange with its group's own plan, across groups each element's running fold passes from
// its owner in group k to its owner in group k+1, who folds its group's contributions onto it
// (so the order stays the canonical one), and the result goes back around the groups and
// out inside each: group - 1 + 2 peers per process, the direct's bytes with two groups.
// Every algorithm gives the same bits (docs/plans.md, "Algorithms").
enum class AlgoKind : int { kAuto = 0, kDirect, kRing, kDoubling, kTwoLevel };
inline constexpr const char* kAlgoNames[] = {"auto", "direct", "ring", "doubling", "two_level"};
static_assert(std::size(kAlgoNames) == static_cast<size_t>(AlgoKind::kTwoLevel) + 1, "an AlgoKind without a name");
const char* algo_name(AlgoKind k);
bool parse_algo(const std::string& s, AlgoKind* out);
// R2CCL_ALGO's check: empty when `algo` names one, else a sentence naming every algorithm.
std::string algo_setting_error(const std::string& algo);
// The algorithm one collective over `processes` runs (all-to-all is always direct, the
// caller's business): `want`, or for kAuto direct while each process's direct peers
// (processes - 1) fit `max_peers` (R2CCL_MAX_PEERS), beyond that doubling for a small
// all-reduce, two_level for a large one where the processes split into groups of two or more
// (two_level_group), and the ring for anything else. (Within the budget the cost model
// always prefers direct: it moves 2D(P-1)/P per process, the ring 2D; past it, the peer
// count is what rules: connections, windows, incast. two_level moves at most the ring's 2D,
// exactly the direct's with two groups, keeps plans inside each group and fills its pipeline
// in 2 (groups - 1) hops, not P.) doubling or two_level asked for anything but an all-reduce
// runs the ring.
// A pure function of values equal on every process; the result travels in the signature.
// `bytes`: the vector's size: a small all-reduce (at most kSmallAllReduceBytes) runs doubling
// only while it holds at most kDoublingMaxBytes of local sums (P x bytes), so that no process's
// memory grows with the job.
inline constexpr uint64_t kSmallAllReduceBytes = kSmallCollectiveBytes;   // base/config.h
inline constexpr uint64_t kDoublingMaxBytes = 16 << 20;
AlgoKind choose_algo(AlgoKind want, int processes, int max_peers, bool all_reduce = true, double bytes = 1e18);
// Receive buffers one process allocates for one all-reduce of `bytes` (max_share: the largest
// owner's share, direct and two_level): direct, the P - 1 contributions to its segment; ring,
// one partial per piece (the whole vector); doubling, every process's local sum; two_level,
// its group's contributions and the running fold in and out.
double algo_buffer_bytes(AlgoKind k, int processes, double bytes, double max_share, int max_peers = Config{}.max_peers);
// two_level's group size over `processes`: the largest divisor of it that is at most
// max(1, max_peers) (equal groups: each element has one owner per group). 1: no two_level.
int two_level_group(int processes, int max_peers);
// The load factor of a two_level owner in group k of g groups of m (see plan_shares): what it
// moves per byte of its share beyond the contributions, m - 2 plus its cross-group messages
// (the running fold in and out, the result relayed in and out; the larger direction).
double two_level_load(int m, int g, int k);
// Cost model of the ring all-reduce over processes of capacities c: process i moves its
// ring loads (out: the partial to its successor unless last, the result on unless it is
// the last to get it; in: likewise) over c_i * nic_Bps, plus the pipeline's fill: the first
// piece crosses 2(P - 1) hops.
double predict_ring_seconds(const std::vector<double>& c, double bytes, double nic_Bps, double alpha_s,
                            double piece_bytes);
// The processes `me` exchanges with in a doubling all-reduce over `processes` (indices into
// the group's canonical order): the one 2^r before and the one 2^r after, every round r.
std::vector<int> doubling_partners(int me, int processes);
// Peers one process exchanges data with in one all-reduce of each algorithm (healthy: equal
// shares in every group of two_level).
int algo_peers(AlgoKind k, int processes, int max_peers = Config{}.max_peers);
// Cost model of the doubling all-reduce: ceil(log2 P) rounds, (P - 1) D over the slowest
// process's capacity.
double predict_doubling_seconds(const std::vector<double>& c, double bytes, double nic_Bps, double alpha_s);
// The peers process `me` of `world` connects to at start-up: every other one where a
// collective over all processes runs direct, its two ring neighbours where it runs the ring.
// (A collective over another group opens the connections it needs on first use.)
std::vector<int> startup_peers(AlgoKind want, int me, int world, int max_peers);

struct PlanChoice {
  PlanKind kind = PlanKind::kBalance;   // never kAuto
  std::vector<double> shares;           // per process in canonical order, sum 1
  double predicted_s = 0;               // cost model, for `bytes` and `nic_Bps`
};

// Shares for one plan over processes of capacities c (NIC units; 0 is treated as tiny).
// `load`: what an owner moves per byte of its share beyond its contributions (below); < 0:
// the direct owner exchange's P - 2.
std::vector<double> plan_shares(PlanKind k, const std::vector<double>& c, double load = -1);

// Cost model of the owner all-reduce (every process sends its contributions straight to each
// owner, owners send results straight back): process i moves D(1 + (P-2) s_i) out and as much
// in over capacity c_i * nic_Bps, full duplex; plus two message latencies. With `load` >= 0,
// D(1 + load s_i) (a two_level group: two_level_load).
// With `first_piece` > 0, the pipeline's start: a process's inbound carries its share's
// contributions from the first moment, but results only once its first pieces (one to each of
// its `flows` owners, side by side on its link) reached them and came back folded. A process
// whose share of one contributor's data is below one piece (s_i D < p) waits for that:
// flows (p - s_i D) / (c_i nic_Bps), p = min(first_piece, D / flows). 0 for a healthy plan
// over a large vector; for a host short of NICs that owns nothing, one piece per owner over
// its own link (docs/plans.md, "The pipeline's start"; choose_two_level applies it).
double predict_seconds(const std::vector<double>& shares, const std::vector<double>& c, double bytes,
                       double nic_Bps, double alpha_s, double load = -1, double first_piece = 0, int flows = 0);

// The plan to run: `want`, or for kAuto the one the model's bandwidth term predicts fastest
// (ties: the simpler); predicted_s includes the pipeline's start (first_piece, flows).
PlanChoice choose_plan(PlanKind want, const std::vector<double>& c, double bytes, double nic_Bps, double alpha_s,
                       double load = -1, double first_piece = 0, int flows = 0);
// two_level's cells are tapered at the ends of every range: the first and last grid cell of a
// range are cut at 1/2^kTwoLevelTaper, ..., 1/4, 1/2 of the grid (coll/algo/two_level.cc), so
// its pipeline starts with a piece of piece_bytes >> kTwoLevelTaper.
inline constexpr unsigned kTwoLevelTaper = 3;

// two_level over processes of capacities c (canonical order) in groups of m: each group's own
// plan (choose_plan over its capacities with its two_level_load), and the time: the slowest
// group, plus the pipeline's fill (a piece's running fold crosses g - 1 groups, its result
// g - 1 more, each hop at the slowest process's pace).
struct TwoLevelChoice {
  std::vector<PlanChoice> groups;   // per group, in order
  double predicted_s = 0;
};
TwoLevelChoice choose_two_level(PlanKind want, const std::vector<double>& c, int m, double bytes, double nic_Bps,
                                double alpha_s, double piece_bytes);

// Element boundaries of the owners' segments: b[0] = 0, b[P] = n, b[i+1] - b[i] ~ shares[i] * n.
// A pure function of its arguments, so every process computes the same split.
std::vector<uint64_t> share_boundaries(const std::vector<double>& shares, uint64_t n);

}  // namespace r2ccl::coll
