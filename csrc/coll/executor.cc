// The executor (collectives.h): one thread that steps every call's Op (op.h) whenever one of
// its messages finishes, and the calls' start, drain and close.
#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "coll/collectives.h"
#include "coll/op.h"

namespace r2ccl::coll {

namespace {

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Executor::Executor(std::shared_ptr<Endpoint> ep, int my_process, CollectiveOptions opt)
    : ep_(std::move(ep)), my_process_(my_process), opt_(opt), waker_(std::make_shared<Waker>()) {
  if (!ep_) throw Error(Cause::kInvalidArgument, -1, "the collective executor needs an endpoint");
  scratch_ = std::make_shared<ScratchCache>(ep_);
  waker_->ex = this;
  if (!parse_plan(ep_->config().plan, &opt_.plan))
    throw Error(Cause::kInvalidArgument, -1, "R2CCL_PLAN=" + ep_->config().plan + " is not a plan");
  if (!parse_algo(ep_->config().algo, &opt_.algo))
    throw Error(Cause::kInvalidArgument, -1, algo_setting_error(ep_->config().algo));
  opt_.max_peers = ep_->config().max_peers;
  thread_ = std::thread([this] {
    name_this_thread("r2ccl-exec");
    log_bind_thread(ep_->config().debug_level, ep_->rank());
    loop();
  });
}

Executor::~Executor() { close(); }

void Executor::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> g(waker_->mu);   // waits for a callback in progress
  waker_->ex = nullptr;
}

void Executor::submit(ProcessCall call) {
  std::string bad = validate(call, my_process_);
  if (!bad.empty()) {
    Error e(Cause::kInvalidArgument, -1, std::string(kind_name(call.kind)) + ": " + bad);
    if (call.done) call.done(&e);
    return;
  }
  note_ran(call.tag);
  unfinished_.enter();   // until the op's finish(): every op created here finishes exactly once
  auto op = std::make_shared<Op>(this, *ep_, std::move(call), my_process_, opt_);
  std::weak_ptr<Op> weak = op;
  op->set_wake([waker = waker_, weak] {
    std::lock_guard<std::mutex> w(waker->mu);
    Executor* ex = waker->ex;
    if (!ex) return;   // closed: nothing waits for this completion any more
    if (auto o = weak.lock())
      if (o->try_complete_inline()) return;
    {
      std::lock_guard<std::mutex> g(ex->mu_);
      ex->wake_ = true;
    }
    ex->cv_.notify_one();
  });
  bool stopped;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped = stop_;
  }
  if (stopped) {   // closed: the call fails through its `done`, like any other failure
    op->abort_closed();
    return;
  }
  // Post the first messages from the caller's thread: one thread hop less on the latency
  // path of small collectives. The executor thread takes over from the next completion.
  if (op->start()) return;
  bool wake;
  {
    std::lock_guard<std::mutex> g(mu_);
    // Closed meanwhile: the loop has taken its last look at incoming_, so this op is ours
    // to fail (below, without mu_: finishing cancels requests, which waits for the engine).
    stopped = stop_;
    // A wake-up the engine thread sent before this push may already be consumed: ask the op.
    wake = !stopped && (!op->completes_inline() || op->wants_executor());
    if (!stopped) incoming_.push_back(op);
    wake_ = wake_ || wake;
  }
  if (stopped) {
    op->abort_closed();
    return;
  }
  if (wake) cv_.notify_one();
}

void Executor::op_finished() { unfinished_.leave(); }

size_t Executor::drain(double timeout_s) { return unfinished_.drain(timeout_s); }

void Executor::note_ran(uint64_t tag) {
  std::lock_guard<std::mutex> g(ran_mu_);
  if (!ran_set_.insert(tag).second) return;
  ran_order_.push_back(tag);
  if (ran_order_.size() > kRanKept) {
    ran_set_.erase(ran_order_.front());
    ran_order_.pop_front();
  }
}

bool Executor::ran(uint64_t tag) {
  std::lock_guard<std::mutex> g(ran_mu_);
  return ran_set_.count(tag) != 0;
}

void Executor::set_capacity_source(std::function<double()> fn) {
  std::lock_guard<std::mutex> g(plan_mu_);
  capacity_ = std::move(fn);
}

PlanRecord Executor::last_plan() {
  std::lock_guard<std::mutex> g(plan_mu_);
  return last_plan_;
}

void Executor::run(ProcessCall call) {
  // The answer by value (a copy of the error is thrown here: see Error's copy constructor).
  struct Result {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, failed = false;
    Error error{Cause::kInternal, -1, ""};
  };
  auto result = std::make_shared<Result>();
  double limit = call.timeout_s + 30;
  call.done = [result](const Error* e) {
    std::lock_guard<std::mutex> g(result->mu);
    if (e) result->error = *e;
    result->failed = e != nullptr;
    result->done = true;
    result->cv.notify_all();
  };
  submit(std::move(call));
  std::unique_lock<std::mutex> lk(result->mu);
  if (!result->cv.wait_for(lk, std::chrono::duration<double>(limit), [&] { return result->done; }))
    throw Error(Cause::kTimeout, -1, "collective executor did not answer");
  if (result->failed) throw Error(result->error);
}

void Executor::loop() {
  std::vector<std::shared_ptr<Op>> active, fresh;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      int64_t next = mono_ns() + 100 * 1000000LL;
      for (auto& op : active) next = std::min(next, op->deadline_ns());
      cv_.wait_for(lk, std::chrono::nanoseconds(std::max<int64_t>(0, next - mono_ns())),
                   [this] { return wake_ || stop_; });
      if (stop_) break;
      wake_ = false;
      while (!incoming_.empty()) {
        fresh.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    for (auto& op : fresh) active.push_back(std::move(op));
    fresh.clear();
    if (active.size() > peak_active_.load()) peak_active_.store(active.size());
    for (size_t i = 0; i < active.size();) {
      if (active[i]->step_locked()) {
        active.erase(active.begin() + static_cast<long>(i));
      } else {
        i++;
      }
    }
  }
  // Every op still here fails, with no executor lock held: an op's abort cancels its requests
  // (Engine::call waits for the engine thread) while the engine thread's completion callback
  // may wait for mu_ (the wake-up in submit()). Holding mu_ here deadlocked the two until the
  // engine call's 30 s deadline; the cancel then failed, and the engine wrote into buffers
  // freed with the op (the heap corruption at shutdown). submit() fails what arrives later.
  std::deque<std::shared_ptr<Op>> left;
  {
    std::lock_guard<std::mutex> g(mu_);
    left.swap(incoming_);
  }
  for (auto& op : active) op->abort_closed();
  for (auto& op : left) op->abort_closed();
}

}  // namespace r2ccl::coll
