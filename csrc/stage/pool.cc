// The staging pool (see pool.h).
#include "stage/pool.h"

#include <algorithm>
#include <new>

#include "base/error.h"

namespace r2ccl::stage {

namespace {
constexpr size_t kAlign = 4096;

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = ::operator new(bytes, std::align_val_t(kAlign), std::nothrow);
    if (!p) throw Error(Cause::kSystem, -1, "cannot allocate " + std::to_string(bytes) + " bytes of host staging");
    return p;
  }
  void release(void* p) noexcept override { ::operator delete(p, std::align_val_t(kAlign)); }
  const char* kind() const override { return "host"; }
};
}  // namespace

std::unique_ptr<Allocator> host_allocator() { return std::make_unique<HostAllocator>(); }

StagingPool::StagingPool(std::unique_ptr<Allocator> alloc, uint64_t capacity_bytes)
    : alloc_(std::move(alloc)), cap_(capacity_bytes) {}

StagingPool::~StagingPool() {
  for (auto& b : bufs_) alloc_->release(b.p);   // a lease must not outlive its pool
}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (pool_ && p_) pool_->give_back(p_);
    pool_ = o.pool_;
    p_ = o.p_;
    n_ = o.n_;
    o.pool_ = nullptr;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

StagingPool::Lease::~Lease() {
  if (pool_ && p_) pool_->give_back(p_);
}

StagingPool::Lease StagingPool::try_acquire(size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  Lease l;
  std::lock_guard<std::mutex> g(mu_);
  Buf* best = nullptr;   // the smallest free buffer that is large enough
  for (auto& b : bufs_)
    if (!b.used && b.n >= bytes && (!best || b.n < best->n)) best = &b;
  if (!best) {
    // Drop free buffers, smallest first, until the new one fits under the bound.
    std::sort(bufs_.begin(), bufs_.end(), [](const Buf& a, const Buf& b) { return a.n < b.n; });
    for (size_t i = 0; i < bufs_.size() && allocated_ + bytes > cap_;) {
      if (!bufs_[i].used) {
        alloc_->release(bufs_[i].p);
        allocated_ -= bufs_[i].n;
        bufs_.erase(bufs_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        i++;
      }
    }
    if (allocated_ + bytes > cap_) return l;
    auto* p = static_cast<uint8_t*>(alloc_->allocate(bytes));
    bufs_.push_back({p, bytes, false});
    allocated_ += bytes;
    allocations_++;
    best = &bufs_.back();
  } else {
    reuses_++;
  }
  best->used = true;
  in_use_ += best->n;
  l.pool_ = this;
  l.p_ = best->p;
  l.n_ = best->n;
  return l;
}

void StagingPool::give_back(uint8_t* p) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& b : bufs_)
    if (b.p == p) {
      b.used = false;
      in_use_ -= b.n;
      return;
    }
}

PoolStats StagingPool::stats() {
  std::lock_guard<std::mutex> g(mu_);
  return {cap_, allocated_, in_use_, allocations_, reuses_};
}

}  // namespace r2ccl::stage
