// The one place that names the algorithms (coll/algorithm.h): which one runs a call.
#include "coll/algorithm.h"

#include "coll/op.h"

namespace r2ccl::coll {

std::vector<int> Algorithm::neighbours(const Op& op) const { return op.procs(); }

void runs_no(const char* algorithm, Kind kind) {
  throw Error(Cause::kInternal, -1, std::string(algorithm) + " runs no " + kind_name(kind));
}

std::unique_ptr<Algorithm> make_algorithm(Kind kind, AlgoKind algo, int processes) {
  switch (kind) {
    case Kind::kAllToAll:
    case Kind::kPermute: return exchange_algorithm(kind);
    case Kind::kRaggedAllToAll: return ragged_algorithm(kind);
    default: break;
  }
  if (processes > 1 && algo == AlgoKind::kRing) return chain_algorithm(kind);
  // (doubling or two_level asked for another kind: choose_algo gives the ring instead, plan.h)
  if (processes > 1 && algo == AlgoKind::kDoubling) return doubling_algorithm(kind);
  if (processes > 1 && algo == AlgoKind::kTwoLevel) return two_level_algorithm(kind);
  return direct_algorithm(kind);
}

}  // namespace r2ccl::coll
