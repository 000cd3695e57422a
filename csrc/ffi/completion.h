// Completes custom-call futures off the collective executor's thread. XLA resumes the rest
// of a program inline on whichever thread completes its future; if that were the executor,
// an XLA collective (or long compute) that follows would block every other r2ccl
// collective of the process. Each completion therefore runs on a pool thread, and the pool
// grows when all its threads are held by XLA, so one blocked continuation never stalls the
// others. Knows nothing of sockets or XLA types.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

namespace r2ccl::ffi {

class CompletionPool {
 public:
  static CompletionPool& instance();
  void run(std::function<void()> task);

 private:
  void worker();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0;
  int threads_ = 0;
};

}  // namespace r2ccl::ffi
