// The memcpy copy engine (see host_copy.h).
#include "stage/host_copy.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "coll/reduce.h"

namespace r2ccl::stage {

namespace {

class HostCopyEngine final : public CopyEngine {
 public:
  explicit HostCopyEngine(int fail_after) : fail_after_(fail_after), worker_([this] { loop(); }) {}
  ~HostCopyEngine() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void begin() override {}
  void to_host(const std::vector<Copy>& copies, std::function<void()> done) override {
    push([copies] { run_copies(copies); }, std::move(done));
  }
  void to_device(const std::vector<Copy>& copies, std::function<void()> done) override {
    push([copies] { run_copies(copies); }, std::move(done));
  }
  // The host folds in the engine's thread, in the order given (what a device fold computes).
  bool fold_to_host(void* dst, const std::vector<const void*>& srcs, const std::vector<CopyEngine*>&, coll::DType t,
                    coll::ReduceOp op, FoldShape shape, std::function<void()> done) override {
    push(
        [=] {
          if (shape.width == 0) return;
          const size_t es = coll::dtype_size(t);
          for (size_t r = 0; r < shape.rows; r++) {
            auto* d = static_cast<uint8_t*>(dst) + r * shape.width * es;
            auto src = [&](size_t i) { return static_cast<const uint8_t*>(srcs[i]) + r * shape.src_pitch * es; };
            std::memcpy(d, src(0), shape.width * es);
            for (size_t i = 1; i < srcs.size(); i++) coll::reduce_into(t, op, d, src(i), shape.width);
          }
        },
        std::move(done));
    return true;
  }
  void finish() override {}
  // After everything queued before (the caller's "stream" is this engine's queue here).
  void read_now(const std::vector<Copy>& copies) override {
    sync();
    run_copies(copies);
  }
  void write_later(const std::vector<Copy>& copies) override { run_copies(copies); }
  std::string failure() override {
    std::lock_guard<std::mutex> g(mu_);
    return failed_ ? "host copy engine: injected copy failure (testing)" : "";
  }
  void sync() override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
    if (failed_) throw Error(Cause::kDevice, -1, "host copy engine: injected copy failure (testing)");
  }

 private:
  struct Batch {
    std::function<void()> work;
    std::function<void()> done;
  };
  static void run_copies(const std::vector<Copy>& copies) {
    for (const Copy& c : copies)
      for (size_t r = 0; r < c.rows && c.width > 0; r++)
        std::memcpy(static_cast<uint8_t*>(c.dst) + r * c.dst_pitch, static_cast<const uint8_t*>(c.src) + r * c.src_pitch,
                    c.width);
  }
  void push(std::function<void()> work, std::function<void()> done) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (failed_) throw Error(Cause::kDevice, -1, "host copy engine: injected copy failure (testing)");
      queue_.push_back({std::move(work), std::move(done)});
    }
    cv_.notify_all();
  }
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Batch b = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      bool fail = batches_++ == fail_after_;
      lk.unlock();
      if (!fail) {
        b.work();
        b.done();   // a failed batch never signals, as a faulted stream would not
      }
      lk.lock();
      if (fail) failed_ = true;
      busy_ = false;
      cv_.notify_all();
    }
  }

  const long fail_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false, busy_ = false, failed_ = false;
  long batches_ = 0;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<CopyEngine> host_copy_engine(int fail_after) { return std::make_unique<HostCopyEngine>(fail_after); }

}  // namespace r2ccl::stage
