// A count of operations in flight that another thread can wait to reach zero, with a
// deadline: what close paths drain before they fail what is left (the executor's calls, the
// runtime's custom calls). Knows nothing above base/.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace r2ccl {

// Any thread. Its mutex is never held while anything else runs.
class InFlight {
 public:
  void enter() {
    std::lock_guard<std::mutex> g(mu_);
    n_++;
  }
  void leave() {
    std::lock_guard<std::mutex> g(mu_);
    if (n_ > 0) n_--;
    if (n_ == 0) cv_.notify_all();
  }
  // Waits until none is in flight, at most `timeout_s`; returns how many still are.
  size_t drain(double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::duration<double>(std::max(0.0, timeout_s)), [&] { return n_ == 0; });
    return n_;
  }
  size_t count() const {
    std::lock_guard<std::mutex> g(mu_);
    return n_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t n_ = 0;
};

}  // namespace r2ccl
