// Request completion (thread-safe handoff from the engine to the waiting caller).
#include "core/request.h"

#include <chrono>

#include "base/log.h"

namespace r2ccl {

__thread std::vector<std::function<void()>>* t_deferred_callbacks = nullptr;

namespace {
void run_on_finish(std::function<void()>& f) {
  if (!f) return;
  if (t_deferred_callbacks)
    t_deferred_callbacks->push_back(std::move(f));
  else
    f();
}
}  // namespace

void Request::finish_ok() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (done_) return;
    done_ = true;
    cv_.notify_all();
  }
  run_on_finish(on_finish);
}

void Request::finish_error(Cause cause, const std::string& message) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (done_) return;
    done_ = true;
    failed_ = true;
    cause_ = cause;
    error_ = message;
    cv_.notify_all();
  }
  run_on_finish(on_finish);
}

bool Request::failed() {
  std::lock_guard<std::mutex> g(mu_);
  return failed_;
}

std::string Request::error_message() {
  std::lock_guard<std::mutex> g(mu_);
  return error_;
}

Cause Request::error_cause() {
  std::lock_guard<std::mutex> g(mu_);
  return cause_;
}

bool Request::wait_until(int64_t deadline_ns) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!done_) {
    int64_t left = deadline_ns - now_ns();
    if (left <= 0) return false;
    cv_.wait_for(lk, std::chrono::nanoseconds(std::min<int64_t>(left, 100000000)));
  }
  return true;
}

bool Request::finished() {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

void Request::rethrow() {
  std::lock_guard<std::mutex> g(mu_);
  if (failed_) throw Error(cause_, peer, error_);
}

}  // namespace r2ccl
