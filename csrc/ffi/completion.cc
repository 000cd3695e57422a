// The elastic completion pool (see completion.h). Threads are detached and live for the
// process; an idle thread leaves after 10 s, a minimum of two stay.
#include "ffi/completion.h"

#include <chrono>
#include <thread>

namespace r2ccl::ffi {

namespace {
constexpr int kMaxThreads = 256;
constexpr int kKeepThreads = 2;
}  // namespace

CompletionPool& CompletionPool::instance() {
  static CompletionPool* pool = new CompletionPool();   // never destroyed: threads may outlive exit
  return *pool;
}

void CompletionPool::run(std::function<void()> task) {
  bool spawn = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    tasks_.push_back(std::move(task));
    if (idle_ < static_cast<int>(tasks_.size()) && threads_ < kMaxThreads) {
      threads_++;
      spawn = true;
    }
  }
  if (spawn) {
    std::thread([this] { worker(); }).detach();
  } else {
    cv_.notify_one();
  }
}

void CompletionPool::worker() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    idle_++;
    bool got = cv_.wait_for(lk, std::chrono::seconds(10), [this] { return !tasks_.empty(); });
    idle_--;
    if (!got) {
      if (threads_ > kKeepThreads) {
        threads_--;
        return;
      }
      continue;
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    task();
    lk.lock();
  }
}

}  // namespace r2ccl::ffi
