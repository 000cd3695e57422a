// The collectives' names and the check of a call's shape (collectives.h). The executor is in
// executor.cc, one call's state machine in op.cc, the algorithms in algo/.
#include "coll/collectives.h"

#include "base/enum_names.h"

namespace r2ccl::coll {

const char* kind_name(Kind k) { return enum_name(kKindNames, k, "?"); }

bool parse_kind(const std::string& name, Kind* out) { return parse_enum(kKindNames, name, out); }

uint64_t output_count(Kind k, uint64_t count, int n) {
  switch (k) {
    case Kind::kReduceScatter: return count / static_cast<uint64_t>(n);
    case Kind::kAllGather: return count * static_cast<uint64_t>(n);
    default: return count;
  }
}

std::string validate(const ProcessCall& c, int my_process) {
  const int n = static_cast<int>(c.process_of_rank.size());
  if (n == 0) return "the group has no ranks";
  if (c.my_ranks.empty()) return "this process holds no rank of the group";
  if (c.in.size() != c.my_ranks.size() || c.out.size() != c.my_ranks.size())
    return "one input and one output buffer are needed per local rank";
  for (size_t i = 0; i < c.my_ranks.size(); i++) {
    int r = c.my_ranks[i];
    if (r < 0 || r >= n) return "local rank " + std::to_string(r) + " is outside the group of " + std::to_string(n);
    if (c.process_of_rank[r] != my_process)
      return "rank " + std::to_string(r) + " belongs to process " + std::to_string(c.process_of_rank[r]) +
             ", not to this process " + std::to_string(my_process);
    if (i > 0 && c.my_ranks[i - 1] >= r) return "local ranks must be given in increasing order";
  }
  if (c.kind == Kind::kReduceScatter && c.count % static_cast<uint64_t>(n) != 0)
    return "reduce_scatter needs an input size divisible by the group size (" + std::to_string(c.count) +
           " elements over " + std::to_string(n) + " ranks)";
  if (c.kind == Kind::kAllToAll && c.count % static_cast<uint64_t>(n) != 0)
    return "all_to_all needs an input size divisible by the group size (" + std::to_string(c.count) +
           " elements over " + std::to_string(n) + " ranks)";
  if (c.kind == Kind::kPermute) {
    if (c.perm.size() != static_cast<size_t>(n))
      return "permute needs one destination per rank (" + std::to_string(c.perm.size()) + " for a group of " +
             std::to_string(n) + ")";
    std::vector<bool> taken(static_cast<size_t>(n), false);
    for (int d : c.perm) {
      if (d < -1 || d >= n) return "permute destination " + std::to_string(d) + " is outside the group of " + std::to_string(n);
      if (d >= 0 && taken[static_cast<size_t>(d)]) return "permute sends to rank " + std::to_string(d) + " twice";
      if (d >= 0) taken[static_cast<size_t>(d)] = true;
    }
  } else if (!c.perm.empty()) {
    return std::string(kind_name(c.kind)) + " takes no permutation";
  }
  if (c.kind == Kind::kRaggedAllToAll) {
    // Shapes only (equal on every process); the slices' values are checked inside the call.
    if (c.row_elems == 0 || c.count % c.row_elems != 0 || c.out_count % c.row_elems != 0)
      return "ragged_all_to_all needs whole rows: " + std::to_string(c.count) + " input and " +
             std::to_string(c.out_count) + " output elements in rows of " + std::to_string(c.row_elems);
    if (c.ragged.size() != c.my_ranks.size()) return "ragged_all_to_all needs one set of slices per local rank";
    const size_t K = c.ragged.front().send.size();
    for (const RaggedSlices& r : c.ragged)
      if (r.in_off.size() != K || r.send.size() != K || r.out_off.size() != K || r.recv.size() != K)
        return "ragged_all_to_all needs input_offsets, send_sizes, output_offsets and recv_sizes of one length";
    if (K == 0 || K % static_cast<size_t>(n) != 0)
      return "ragged_all_to_all needs a number of slices divisible by the group size (" + std::to_string(K) +
             " slices over " + std::to_string(n) + " ranks)";
  } else if (!c.ragged.empty()) {
    return std::string(kind_name(c.kind)) + " takes no ragged slices";
  }
  if (c.kind == Kind::kBroadcast && (c.root < 0 || c.root >= n))
    return "broadcast root " + std::to_string(c.root) + " is outside the group of " + std::to_string(n);
  PlanKind pk;
  if (!c.plan.empty() && !parse_plan(c.plan, &pk))
    return "unknown all-reduce plan '" + c.plan + "' (use auto, balance, r2cc, weighted or optimal)";
  AlgoKind ak;
  if (!c.algo.empty() && !parse_algo(c.algo, &ak)) return "unknown algorithm '" + c.algo + "' (use auto, direct or ring)";
  if (c.dtype == DType::kBool && (c.op == ReduceOp::kSum || c.op == ReduceOp::kProd) &&
      (c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter))
    return std::string("a ") + reduce_op_name(c.op) + " over bool is not defined (use max or min)";
  return {};
}

}  // namespace r2ccl::coll
