// Host staging for one device: slots of one size (the largest step of the chunk pipeline),
// reused across calls and bounded in number by R2CCL_STAGING_BYTES, and a small area (the
// group and rank operands, and a small collective's input and output) for the path that
// reads them in one wait. The memory comes from an Allocator: page-locked memory from the
// CUDA driver, or plain aligned memory for tests and CPU.
//
// Allocation happens in reserve(), when the runtime prepares the device, not inside a
// collective; a slot reserve() did not make is made at its first use. Nothing is freed
// before the pool is destroyed: freeing pinned memory (cudaFreeHost) synchronises the
// whole device, which a collective must never do behind XLA's back. A slot is handed out
// whole to one pipeline at a time. Knows nothing of CUDA or XLA.
//
// Registration. Every buffer the pool holds (slots and small area) is registered for
// one-sided writes through the function register_with() was last given (the runtime's
// endpoint: Endpoint::register_memory), so that a transport with RDMA WRITE moves the
// staged bytes without a copy (docs/design.md §10); a buffer made later is registered when
// it is made. The memory outlives every endpoint (the pool is never freed before exit), so
// registrations are never dropped here: each ends with the endpoint that holds it, and a
// new owner (a runtime after jax_r2ccl.shutdown and initialize) registers everything again.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
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
  uint64_t slot_bytes = 0;       // every slot's size
  uint64_t allocated_bytes = 0;  // held from the allocator now (in use or free)
  uint64_t in_use_bytes = 0;
  uint64_t allocations = 0;      // allocator calls so far (stays flat when buffers are reused)
  uint64_t reuses = 0;           // buffers handed out again without allocating
  uint64_t registered_bytes = 0; // held and registered with the current owner (see register_with)
};

// Registers `bytes` at `p` for one-sided writes; false where it could not (those bytes then
// move by copies). Called under the pool's lock: it must not call the pool.
using RegisterFn = std::function<bool(const void* p, size_t bytes)>;

// The small area: `head` holds the group and rank operands (and room to spare), `in` and
// `out` a small collective's bytes, `bytes` each.
struct SmallArea {
  uint8_t* head = nullptr;
  uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  size_t bytes = 0;
};
inline constexpr size_t kSmallHeadBytes = 256;

class StagingPool {
 public:
  // Slots of `slot_bytes` (rounded up to 4 KiB), as many as `capacity_bytes` holds; a small
  // area of `small_bytes` each way. Allocates nothing yet.
  StagingPool(std::unique_ptr<Allocator> alloc, uint64_t capacity_bytes, size_t slot_bytes, size_t small_bytes);
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

  // Allocates the small area and slots until `slots` exist (fewer where the bound says so).
  // Throws r2ccl::Error when the allocator fails.
  void reserve(int slots);
  // A slot for a step of `bytes`: a free one, else a new one while the bound has room.
  // Empty when `bytes` exceeds the slot size or every slot the bound allows is in use.
  Lease try_acquire(size_t bytes);
  // The small area (allocated on first use if reserve() did not); one caller at a time.
  SmallArea small();
  PoolStats stats();
  // Registers every buffer through `reg` unless `owner` (a runtime's serial) has them all
  // already, and every later one when it is made. Cheap when nothing is new.
  void register_with(uint64_t owner, RegisterFn reg);
  // Whether register_with(owner, ...) was the last call (one atomic read: a staged call checks
  // it before it builds a RegisterFn).
  bool registered_with(uint64_t owner) const { return owner != 0 && current_owner_.load() == owner; }
  uint64_t capacity() const { return cap_; }
  size_t slot_bytes() const { return slot_; }

 private:
  struct Buf {
    uint8_t* p;
    bool used;
    uint64_t owner;   // registered with this owner (0: not registered)
  };
  void give_back(uint8_t* p);
  SmallArea small_locked();
  size_t small_total() const;
  uint8_t* new_slot_locked();
  void register_locked(uint8_t* p, size_t bytes, uint64_t* owner);

  std::unique_ptr<Allocator> alloc_;
  const uint64_t cap_;
  const size_t slot_;
  const size_t small_bytes_;
  std::mutex mu_;
  std::vector<Buf> bufs_;
  uint8_t* small_ = nullptr;
  uint64_t small_owner_ = 0;
  uint64_t owner_ = 0;   // register_with's: 0 before its first call
  std::atomic<uint64_t> current_owner_{0};   // owner_, for registered_with without the lock
  RegisterFn reg_;
  uint64_t allocated_ = 0, in_use_ = 0, allocations_ = 0, reuses_ = 0;
};

}  // namespace r2ccl::stage
