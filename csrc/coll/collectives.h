// Collective algorithms over the multi-rail channels: one process's part of an all-reduce,
// reduce-scatter, all-gather, all-to-all or broadcast among the ranks (devices) of a group,
// driven by an executor thread as non-blocking state machines, so that any number of
// collectives can be in flight in any order on each process without deadlock.
// Knows nothing of sockets, rails or JAX: it posts messages on an Endpoint.
//
// Canonical reduction order (bit-exactness): the group's ranks are ordered by their index;
// processes are ordered by their first rank. Each element's result is
//   (((S_p0 (op) S_p1) (op) S_p2) ...)   with   S_p = ((x_l0 (op) x_l1) (op) x_l2) ...
// over the ranks l0 < l1 < ... that process p holds. The order depends only on the group's
// membership and placement, never on faults, rail weights or timing.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/in_flight.h"
#include "coll/plan.h"
#include "coll/reduce.h"
#include "coll/scratch.h"
#include "core/endpoint.h"

namespace r2ccl::coll {

enum class Kind : int { kAllReduce = 0, kReduceScatter, kAllGather, kAllToAll, kBroadcast, kPermute, kRaggedAllToAll };
// The kinds' names in enum order: the one list. The FFI attribute `kind` is the index, so
// jax_r2ccl's lowering and host collectives read it from _core.names() instead of a copy.
inline constexpr const char* kKindNames[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                                            "permute",    "ragged_all_to_all"};
static_assert(std::size(kKindNames) == static_cast<size_t>(Kind::kRaggedAllToAll) + 1, "a Kind without a name");

// ragged_all_to_all (jax.lax.ragged_all_to_all), one local rank's slices: K = n * s of them
// (s per peer), in rows of ProcessCall::row_elems elements. Slice k goes to rank k / s: send[k]
// rows from row in_off[k] of the input, written at row out_off[k] of that rank's output; the
// receiver expects recv[j] rows in its slice j = sender * s + k % s. Per rank, not equal across
// processes: checked inside the collective, so a bad one fails the call on every process.
struct RaggedSlices {
  std::vector<int64_t> in_off, send, out_off, recv;
};
const char* kind_name(Kind k);
bool parse_kind(const std::string& name, Kind* out);   // inverse of kind_name; false when unknown

// Collectives of at most this many bytes are small (base/config.h, where R2CCL_SYNC_WAIT_US's
// doc reads it too).
using r2ccl::kSmallCollectiveBytes;

// One process's part of one collective.
struct ProcessCall {
  Kind kind = Kind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;                          // broadcast: the rank whose input everyone gets
  // permute (jax.lax.ppermute): each rank's destination rank, or -1 (sends nothing); no two
  // ranks share a destination; a rank no one sends to gets zeros. Equal on every process.
  std::vector<int> perm;
  // ragged_all_to_all: per entry of my_ranks; rows of row_elems elements; out_count elements
  // in each output, which holds the result's initial value (only received slices are written).
  std::vector<RaggedSlices> ragged;
  uint64_t row_elems = 1;
  uint64_t out_count = 0;
  uint64_t tag = 0;                      // unique per collective instance, equal on every process
  std::vector<int> process_of_rank;      // the group, in rank order: each rank's process
  std::vector<int> my_ranks;             // the ranks this process holds, increasing
  std::vector<const void*> in;           // per entry of my_ranks
  std::vector<void*> out;                // per entry of my_ranks
  uint64_t count = 0;                    // elements of each rank's input
  bool prefolded = false;                // all_reduce/reduce_scatter: in[0] already holds the local ranks' fold
  double timeout_s = 30.0;
  std::string plan;                      // all-reduce plan for this call ("": R2CCL_PLAN); equal everywhere
  std::string algo;                      // algorithm for this call ("": R2CCL_ALGO); equal everywhere
  std::string what;                      // for error messages, e.g. "psum over ('data',)"
  // Runs once, on the executor thread, when the call finished (error null) or failed.
  std::function<void(const Error*)> done;
};

// Elements of each rank's output for a collective over n ranks with `count` input elements.
uint64_t output_count(Kind k, uint64_t count, int n_ranks);
// Checks a call's shape before it runs; returns a sentence, or empty when it is valid.
std::string validate(const ProcessCall& c, int my_process);

// The plan and algorithm one large all-reduce ran with (Executor::last_plan).
struct PlanRecord {
  PlanKind kind = PlanKind::kBalance;
  AlgoKind algo = AlgoKind::kDirect;        // ring: no owners (shares empty)
  std::vector<double> shares, capacities;   // per process of the group, canonical order
  std::vector<int> processes;
  uint64_t bytes = 0;
  uint64_t serial = 0;                      // how many planned all-reduces this executor ran
};

struct CollectiveOptions {
  uint64_t piece_bytes = 1 << 20;        // pipelining unit of large reductions
  uint64_t small_bytes = kSmallCollectiveBytes;  // at or below: one-step exchange (latency)
  PlanKind plan = PlanKind::kAuto;       // R2CCL_PLAN
  AlgoKind algo = AlgoKind::kAuto;       // R2CCL_ALGO
  int max_peers = Config{}.max_peers;    // R2CCL_MAX_PEERS (the executor takes the endpoint's)
};

class Op;   // coll/op.h: one call's state machine

// Threads: one executor thread runs every call's steps; submit, run, set_capacity_source,
// last_plan, ran, drain and close are safe from any thread but the endpoint's engine thread
// (run, drain and close wait). A call's `done` runs exactly once: on the executor thread, on
// the engine thread when a small all-reduce completes there (Op::try_complete_inline), or on
// the submitting or closing thread when the call fails at its start or at close. No lock of
// the executor is held while an op finishes (its `done` and its cancels may wait for the
// engine thread, whose completion callbacks take those locks). It shares the endpoint's
// lifetime (holds it); close() it before the endpoint is closed.
class Executor : public std::enable_shared_from_this<Executor> {
 public:
  Executor(std::shared_ptr<Endpoint> ep, int my_process, CollectiveOptions opt = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Starts a call; `done` runs later on the executor thread. Invalid calls fail at once.
  void submit(ProcessCall call);
  // Runs a call and waits for it (for tests and benchmarks); throws Error.
  void run(ProcessCall call);
  // This process's capacity for the planner (bandwidth in healthy-NIC units; the health
  // monitor's), read once per large all-reduce. Unset: 1 (every process equal).
  void set_capacity_source(std::function<double()> fn);
  PlanRecord last_plan();
  // The most collectives this executor held in flight at once since it started (any thread).
  size_t peak_in_flight() const { return peak_active_.load(); }
  int my_process() const { return my_process_; }
  // The collectives' scratch (coll/scratch.h): reused, and registered for one-sided writes.
  ScratchCache& scratch() { return *scratch_; }
  // Waits until no call submitted here is still running, at most `timeout_s`; returns how
  // many still run (0: idle). Calls submitted meanwhile are waited for too. Any thread but
  // the endpoint's engine thread.
  size_t drain(double timeout_s);
  // Stops the executor. Every call submitted and not yet finished fails with kClosed (its
  // `done` runs, naming the collective), and so does every call submitted from now on:
  // nothing submitted is ever left without its `done`. Waits for the executor thread.
  void close();

  // Whether a collective with this tag was submitted here lately (the last kRanKept): a
  // peer's announcement of one is late news, not another program. Any thread.
  bool ran(uint64_t tag);
  // Calls submitted here and not finished. Any thread.
  size_t in_flight() const { return unfinished_.count(); }
  // A call failed (for a cause but a mismatch or bad input) at `now_ns` (CLOCK_MONOTONIC);
  // whether one did at or after `since_ns`. Any thread.
  void note_failure(int64_t now_ns) { last_failure_ns_.store(now_ns, std::memory_order_relaxed); }
  bool failed_since(int64_t since_ns) const {
    const int64_t t = last_failure_ns_.load(std::memory_order_relaxed);
    return t != 0 && t >= since_ns;
  }
  // A collective this process will never run (one of its local ranks could not take part):
  // counted as run for ran(), so a peer's announcement of it is not taken for another
  // program. Any thread.
  void skipped(uint64_t tag) { note_ran(tag); }

 private:
  void loop();
  void note_ran(uint64_t tag);
  // An op ran its `done` (any thread): counted for drain().
  void op_finished();
  static constexpr size_t kRanKept = 4096;
  std::mutex ran_mu_;
  std::unordered_set<uint64_t> ran_set_;
  std::deque<uint64_t> ran_order_;

  std::shared_ptr<Endpoint> ep_;
  int my_process_;
  CollectiveOptions opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false;
  bool stop_ = false;
  // What a request's completion callback reaches the executor through: it may outlive the
  // executor (a signature send left in flight after a mismatch), so it holds no raw pointer
  // that close() has not cleared first.
  struct Waker {
    std::mutex mu;
    Executor* ex = nullptr;
  };
  std::shared_ptr<Waker> waker_;
  std::shared_ptr<ScratchCache> scratch_;
  std::deque<std::shared_ptr<Op>> incoming_;
  InFlight unfinished_;   // calls submitted and not finished (drain())
  std::thread thread_;
  std::mutex plan_mu_;
  std::function<double()> capacity_;
  PlanRecord last_plan_;
  std::atomic<size_t> peak_active_{0};
  std::atomic<int64_t> last_failure_ns_{0};   // note_failure()
  friend class Op;
};

}  // namespace r2ccl::coll
