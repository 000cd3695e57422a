// The process's collective runtime: communicators (groups of ranks and where they live) and
// the rendezvous that turns the calls of this process's local ranks (one per device, each
// on its own thread, in any order) into one process-level call, matched across processes
// by (communicator, group, run, op, k-th execution) — never by arrival order.
// Knows nothing of sockets or JAX.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <condition_variable>
#include <thread>
#include <string>
#include <tuple>
#include <vector>

#include "base/in_flight.h"
#include "coll/collectives.h"

namespace r2ccl::coll {

// One local rank's part of one collective (what a custom call hands over).
struct DeviceCall {
  uint64_t comm_id = 0;
  int64_t group = 0;       // which group of the communicator (index over the other mesh axes)
  int64_t rank = 0;        // rank within the group (axis index)
  uint64_t run_id = 0;     // one execution of a compiled program (equal on every process)
  uint64_t op_id = 0;      // the collective's position in the program
  Kind kind = Kind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const void* in = nullptr;
  void* out = nullptr;
  uint64_t count = 0;      // input elements
  uint64_t out_count = 0;  // elements of the result buffer: checked against the kind before anything runs
  // all_reduce / reduce_scatter: the process's local ranks' inputs are already folded, in
  // canonical order, into the lowest local rank's `in` (a device-side fold); the other local
  // ranks' `in` is unused.
  bool prefolded = false;
  // ragged_all_to_all: this rank's slices, and the elements of one row (input and output are
  // rows; out_count is the output's size, any whole number of rows).
  RaggedSlices ragged;
  uint64_t row_elems = 1;
  std::function<void(const Error*)> done;
};

// Threads: device_call, abandon, check and local_ranks come from XLA's threads (one per
// local device, any order), register_comm from the Python thread; all are safe from any
// thread but the engine's. A watchdog thread of its own fails local rendezvous that never
// complete. It shares the endpoint's and the executor's lifetime (holds both); a custom
// call that found it through current() holds it, and so them, until the call is done.
class Runtime : public std::enable_shared_from_this<Runtime> {
 public:
  Runtime(std::shared_ptr<Endpoint> ep, std::shared_ptr<Executor> ex, int my_process, double timeout_s);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process-wide runtime the custom calls use (null before jax_r2ccl.initialize()).
  static std::shared_ptr<Runtime> current();
  static void install(std::shared_ptr<Runtime> rt);
  // Uninstalls `rt` if it is the current one (a later install is left alone).
  static void uninstall(const Runtime* rt);
  // Stops the watchdog; local rendezvous still waiting fail with kClosed, and later calls
  // fail at once. Idempotent; any thread but the engine's.
  void close();

  // A custom call in progress: taken at the handler's entry and held until the call's
  // completion has been delivered to XLA (CPU: its future set; CUDA: the handler returned).
  // Dropping the last copy ends it. It holds the runtime (and so the executor and the
  // endpoint) alive: nothing a call touches is freed before its completion was delivered.
  using CallToken = std::shared_ptr<void>;
  CallToken enter_call();
  // Waits until no custom call is in progress, at most `timeout_s`; returns how many still
  // are. Calls that start meanwhile (computations XLA had already enqueued) are served and
  // waited for too. Any thread but the engine's and the executor's.
  size_t drain(double timeout_s);
  size_t calls_in_progress() const;

  // groups[g][r] = the process of rank r of group g. Registering the same id again with the
  // same layout is a no-op; with another layout it is an error. `perm`: a permute's
  // communicator (ProcessCall::perm, the same in every group); only permutes run on it.
  void register_comm(uint64_t comm_id, std::vector<std::vector<int>> groups, std::string name,
                     std::vector<int> perm = {});
  // Hands one local rank's call over; `done` runs later (or at once on an error). Returns
  // true when this call is the only collective of the process in flight (its local
  // rendezvous aside): the caller may then wait for it briefly (see R2CCL_SYNC_WAIT_US).
  bool device_call(DeviceCall call);
  // A local rank that cannot take part in a call it was due to make (its handler failed
  // before handing it over): counts the call as made, so later ones still match, and fails
  // the call for the process's other local ranks (waiting or still to come) with `why`
  // instead of leaving them waiting. Peer processes see the collective fail at R2CCL_TIMEOUT.
  void abandon(const DeviceCall& call, const Error& why);
  // The checks device_call makes before it takes a call (communicator, group, rank, result
  // size), without taking it: empty, or the sentence; *n_ranks gets the group's size.
  std::string check(const DeviceCall& call, int* n_ranks) const;
  // The ranks of the call's group that live in this process, increasing (empty if unknown).
  std::vector<int> local_ranks(const DeviceCall& call) const;
  int my_process() const { return my_process_; }
  const Config& config() const;
  // Registers memory that outlives the endpoint (a device's staging pool) for one-sided
  // writes, for the endpoint's life (Endpoint::register_memory). False where it cannot
  // (logged): those bytes then move by copies.
  bool register_memory(const void* p, size_t bytes);
  // Distinct for every runtime the process makes (never 0): a staging pool registered with
  // one runtime's endpoint registers again with the next one's.
  uint64_t serial() const { return serial_; }

 private:
  struct Comm {
    std::vector<std::vector<int>> groups;
    std::string name;
    std::vector<int> perm;
  };
  struct Pending {
    std::vector<DeviceCall> calls;   // waiting for the other local ranks
    size_t arrived = 0;              // local ranks that made (or abandoned) the call
    std::optional<Error> failed;     // set: every arrival fails with it
    int64_t since_ns = 0;            // first arrival
  };
  using Key = std::tuple<uint64_t, int64_t, uint64_t, uint64_t, uint64_t>;   // comm, group, run, op, k

  std::string check_locked(const DeviceCall& call, size_t* n_ranks) const;
  // The key of the call's k-th execution (advances k); the caller holds mu_.
  struct Slot {
    Pending* p;
    uint64_t k;
    size_t local;
  };
  Slot arrive_locked(const DeviceCall& call);
  // The process-level collective's tag (equal on every process for the same call).
  static uint64_t process_tag(const Key& key);
  // Fails the waiting calls of `key` with `e` and poisons it for the local ranks still to come.
  void poison_locked(const std::tuple<uint64_t, int64_t, uint64_t, uint64_t, uint64_t>& key, Pending& p, const Error& e);
  // Local rendezvous older than R2CCL_TIMEOUT fail (a local rank whose launch never came).
  void watchdog();

  std::shared_ptr<Endpoint> ep_;
  std::shared_ptr<Executor> ex_;
  const uint64_t serial_;
  bool closed_ = false;   // under mu_
  int my_process_;
  double timeout_s_;
  mutable std::mutex mu_;
  std::map<uint64_t, Comm> comms_;
  std::map<Key, Pending> pending_;
  // k-th execution of (comm, group, rank, op) within a run; runs are forgotten oldest first.
  std::map<uint64_t, std::map<std::tuple<uint64_t, int64_t, int64_t, uint64_t>, uint64_t>> counts_;
  std::vector<uint64_t> run_order_;
  // Process-level calls handed to the executor and not yet done (shared: a call may finish
  // after this runtime was uninstalled).
  std::shared_ptr<std::atomic<int>> in_flight_ = std::make_shared<std::atomic<int>>(0);
  InFlight calls_;   // custom calls in progress (enter_call / drain)
  std::condition_variable watch_cv_;
  bool stop_ = false;
  std::thread watch_;
};

}  // namespace r2ccl::coll
