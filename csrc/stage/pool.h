// Host staging buffers (pinned, on CUDA) for one device, reused across calls and bounded in
// total size (R2CCL_STAGING_BYTES). The memory itself comes from an Allocator: page-locked
// memory from the CUDA driver, or plain aligned memory for tests and CPU. A buffer is handed
// out whole to one pipeline at a time. Knows nothing of CUDA or XLA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace r2ccl::stage {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;   // throws r2ccl::Error (device/system) on failure
  virtual void release(void* p) noexcept = 0;
  virtual const char* kind() const = 0;       // "pinned" / "host", for reports
};

std::unique_ptr<Allocator> host_allocator();   // 4 KiB-aligned operator new

struct PoolStats {
  uint64_t capacity_bytes = 0;   // the bound
  uint64_t allocated_bytes = 0;  // held from the allocator now (in use or free)
  uint64_t in_use_bytes = 0;
  uint64_t allocations = 0;      // allocator calls so far (stays flat when buffers are reused)
  uint64_t reuses = 0;           // buffers handed out again without allocating
};

class StagingPool {
 public:
  StagingPool(std::unique_ptr<Allocator> alloc, uint64_t capacity_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease();
    uint8_t* data() const { return p_; }
    size_t size() const { return n_; }
    explicit operator bool() const { return p_ != nullptr; }

   private:
    friend class StagingPool;
    StagingPool* pool_ = nullptr;
    uint8_t* p_ = nullptr;
    size_t n_ = 0;
  };

  // A buffer of at least `bytes`: a free one when one is large enough, else a new one,
  // dropping free buffers to stay under the bound. Returns an empty lease when the bound
  // leaves no room (in-use buffers are never taken back).
  Lease try_acquire(size_t bytes);
  PoolStats stats();
  uint64_t capacity() const { return cap_; }

 private:
  struct Buf {
    uint8_t* p;
    size_t n;
    bool used;
  };
  void give_back(uint8_t* p);

  std::unique_ptr<Allocator> alloc_;
  const uint64_t cap_;
  std::mutex mu_;
  std::vector<Buf> bufs_;
  uint64_t allocated_ = 0, in_use_ = 0, allocations_ = 0, reuses_ = 0;
};

}  // namespace r2ccl::stage
