// The seam between one collective's state machine (coll/op.h: its messages, folds, signatures,
// failures and deadline) and the algorithm that says which messages it posts. Each algorithm
// is one file of coll/algo/, named only here and in algorithm.cc, which picks one per call:
//   algo/direct.cc    every process exchanges with every other; the all-reduce's owners by plan
//   algo/chain.cc     the ring in canonical order (R2CCL_ALGO=ring): two peers per process
//   algo/doubling.cc  recursive doubling, the small all-reduce past R2CCL_MAX_PEERS
//   algo/two_level.cc groups of contiguous processes: owners inside, a chain of owners across
//   algo/exchange.cc  all-to-all and permute: fixed blocks between fixed pairs
//   algo/ragged.cc    ragged_all_to_all: per-call sizes, learnt from the senders first
// An algorithm knows nothing of the executor, of signatures or of how a failure spreads.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "coll/plan.h"

namespace r2ccl::coll {

enum class Kind : int;
class Op;

// The role of each message of a collective: its tag mixes the call's tag, the phase and the
// message's place in it (Op::tag). One list, so no two algorithms' messages can meet; the
// numbers are on the wire.
enum class Phase : uint64_t {
  kSignature = 0,             // Op: what each process believes the call is (+ its capacity)
  kOwnerReduce = 1,           // direct all-reduce: contributions to a segment's owner
  kOwnerResult = 2,           // ... and the owner's result back to everyone
  kScatterReduce = 3,         // direct reduce-scatter: contributions to a shard's owner
  kGather = 5,                // direct all-gather
  kAllToAll = 6,              // exchange
  kBroadcast = 7,             // direct broadcast
  kPermute = 8,               // exchange
  kOneStep = 9,               // direct small all-reduce: [signature | local sum] to everyone
  kRaggedRows = 10,           // ragged: a slice's rows
  kChainReduce = 11,          // chain: the partial fold along the ring
  kChainAllReduceResult = 12, // chain all-reduce: the result around the ring
  kChainShard = 13,           // chain reduce-scatter: a shard on to its owner
  kChainGather = 14,          // chain all-gather
  kChainBroadcast = 15,       // chain broadcast
  kDoubling = 16,             // doubling: one round's slots
  kRaggedMeta = 17,           // ragged: a (sender, receiver) pair's offsets and sizes
  kTwoContrib = 18,           // two_level: a contribution to its owner inside the group
  kTwoFold = 19,              // two_level: the running fold to the next group's owner
  kAbort = 20,                // Op: a failure passed on to the neighbours (chain, doubling, two_level)
  kTwoResult = 21,            // two_level: the result on to the next group's owner
  kTwoShare = 22,             // two_level: the result from its owner inside the group
  kTwoPlan = 23,              // two_level: a group's shares, to the neighbouring groups
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  // Posts the call's first messages, folds and copies (Op::plan, on the submitting thread).
  // Throws Error to fail the call.
  virtual void start(Op& op) = 0;
  // Posts what waited for earlier messages (owners once every capacity is here, receives
  // once the senders' sizes are, a round once its slots are). Runs before the op folds
  // what arrived and once more after. Returns true when it finished the op (an error).
  virtual bool advance(Op& op) {
    (void)op;
    return false;
  }
  // Whether messages are still to be posted: the op may not finish before.
  virtual bool pending() const { return false; }
  // The processes this one exchanges with: its signatures, and the chain's and doubling's
  // abort notices, go to them. Default: every process of the group.
  virtual std::vector<int> neighbours(const Op& op) const;
};

// The algorithm of one call: `algo` as resolved for it (never kAuto; Op's constructor), for
// `kind`, over `processes` (one process runs the direct code whatever `algo` says).
std::unique_ptr<Algorithm> make_algorithm(Kind kind, AlgoKind algo, int processes);

// An algorithm asked for a kind it does not run (make_algorithm never asks): kInternal.
[[noreturn]] void runs_no(const char* algorithm, Kind kind);

// One per file of coll/algo/.
std::unique_ptr<Algorithm> direct_algorithm(Kind kind);
std::unique_ptr<Algorithm> chain_algorithm(Kind kind);
std::unique_ptr<Algorithm> doubling_algorithm(Kind kind);
std::unique_ptr<Algorithm> two_level_algorithm(Kind kind);
std::unique_ptr<Algorithm> exchange_algorithm(Kind kind);
std::unique_ptr<Algorithm> ragged_algorithm(Kind kind);

}  // namespace r2ccl::coll
