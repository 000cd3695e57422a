// The process's communicator: the one object that owns what jax_r2ccl.initialize() opens
// (the transport endpoint, the collective executor, the health monitor and the collective
// runtime the custom calls reach) and that stops them in the one safe order. Python holds
// a handle to it; each part is held by std::shared_ptr, and each part holds what it uses
// (the runtime the executor and the endpoint, the executor and the monitor the endpoint),
// so nothing keeps a raw pointer or reference to another part whose lifetime it does not
// share. Knows the layers below it; nothing below knows it.
#pragma once
#include <memory>
#include <mutex>

#include "coll/collectives.h"
#include "coll/runtime.h"
#include "core/endpoint.h"
#include "monitor/monitor.h"

namespace r2ccl::comm {

// Threads: open, close and the accessors are safe from any thread but the endpoint's engine
// thread and the executor's thread (close waits for both). The parts' own calls say which
// threads may make them.
class Communicator {
 public:
  // Starts, over `ep` (its Config decides): the executor; the health monitor when
  // R2CCL_MONITOR_MS > 0, its capacity wired into the all-reduce planner; the runtime, which
  // is installed for the custom calls (replacing any earlier one). `my_process` is this
  // process's index among the endpoint's peers.
  static std::shared_ptr<Communicator> open(std::shared_ptr<Endpoint> ep, int my_process);
  ~Communicator();   // close()
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::shared_ptr<Endpoint>& endpoint() const { return ep_; }
  const std::shared_ptr<coll::Executor>& executor() const { return ex_; }
  const std::shared_ptr<monitor::Monitor>& monitor() const { return mon_; }   // null: off
  const std::shared_ptr<coll::Runtime>& runtime() const { return rt_; }
  int my_process() const { return my_process_; }
  bool closed() const;

  // Waits, at most `timeout_s`, until no custom call is in progress (Runtime::drain): the
  // first half of a safe shutdown, before close(). Calls that start meanwhile are served.
  // Returns how many are still in progress (close() then fails them with kClosed).
  size_t drain(double timeout_s);
  size_t calls_in_progress() const;

  // The shutdown order, each step before the next (idempotent):
  //  1. the runtime is uninstalled (a custom call from now on fails with kClosed) and
  //     closed (local ranks waiting for the others fail with kClosed);
  //  2. the monitor stops steering the endpoint (no weight or NIC change after this);
  //  3. the planner forgets the monitor, and the executor stops (its pending calls fail);
  //  4. the endpoint closes (its pending requests fail with kClosed).
  // Every call still in progress gets its completion (an error with cause kClosed naming
  // it) before close() returns, except a CUDA handler's, which returns on its own thread
  // once its chunks failed. A custom call holds the runtime (and through it the executor and
  // the endpoint) alive until its completion was delivered; it only finds them closed.
  void close();

 private:
  Communicator(std::shared_ptr<Endpoint> ep, int my_process);

  std::shared_ptr<Endpoint> ep_;
  int my_process_;
  std::shared_ptr<coll::Executor> ex_;
  std::shared_ptr<monitor::Monitor> mon_;
  std::shared_ptr<coll::Runtime> rt_;
  mutable std::mutex mu_;
  bool closed_ = false;
};

}  // namespace r2ccl::comm
