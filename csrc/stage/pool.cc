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

StagingPool::StagingPool(std::unique_ptr<Allocator> alloc, uint64_t capacity_bytes, size_t slot_bytes,
                         size_t small_bytes)
    : alloc_(std::move(alloc)),
      cap_(capacity_bytes),
      slot_((std::max<size_t>(slot_bytes, 1) + kAlign - 1) / kAlign * kAlign),
      small_bytes_(small_bytes) {}

StagingPool::~StagingPool() {
  for (auto& b : bufs_) alloc_->release(b.p);   // a lease must not outlive its pool
  if (small_) alloc_->release(small_);
}

size_t StagingPool::small_total() const { return kSmallHeadBytes + 2 * small_bytes_; }

void StagingPool::register_locked(uint8_t* p, size_t bytes, uint64_t* owner) {
  if (!reg_ || *owner == owner_) return;
  *owner = owner_;   // tried once per owner: a refusal is not retried on every call
  if (!reg_(p, bytes)) *owner = ~owner_;
}

uint8_t* StagingPool::new_slot_locked() {
  bufs_.push_back({static_cast<uint8_t*>(alloc_->allocate(slot_)), false, 0});
  allocated_ += slot_;
  allocations_++;
  register_locked(bufs_.back().p, slot_, &bufs_.back().owner);
  return bufs_.back().p;
}

void StagingPool::register_with(uint64_t owner, RegisterFn reg) {
  std::lock_guard<std::mutex> g(mu_);
  if (owner == owner_ && reg_) return;
  owner_ = owner;
  reg_ = std::move(reg);
  current_owner_.store(owner);
  if (small_) register_locked(small_, small_total(), &small_owner_);
  for (auto& b : bufs_) register_locked(b.p, slot_, &b.owner);
}

SmallArea StagingPool::small_locked() {
  if (!small_) {
    small_ = static_cast<uint8_t*>(alloc_->allocate(small_total()));
    register_locked(small_, small_total(), &small_owner_);
  }
  return {small_, small_ + kSmallHeadBytes, small_ + kSmallHeadBytes + small_bytes_, small_bytes_};
}

SmallArea StagingPool::small() {
  std::lock_guard<std::mutex> g(mu_);
  return small_locked();
}

void StagingPool::reserve(int slots) {
  std::lock_guard<std::mutex> g(mu_);
  small_locked();
  while (static_cast<int>(bufs_.size()) < slots && allocated_ + slot_ <= cap_) new_slot_locked();
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
  Lease l;
  if (bytes > slot_) return l;
  std::lock_guard<std::mutex> g(mu_);
  Buf* got = nullptr;
  for (auto& b : bufs_)
    if (!b.used) {
      got = &b;
      break;
    }
  if (got) {
    reuses_++;
  } else {
    if (allocated_ + slot_ > cap_) return l;
    new_slot_locked();
    got = &bufs_.back();
  }
  got->used = true;
  in_use_ += slot_;
  l.pool_ = this;
  l.p_ = got->p;
  l.n_ = slot_;
  return l;
}

void StagingPool::give_back(uint8_t* p) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& b : bufs_)
    if (b.p == p) {
      b.used = false;
      in_use_ -= slot_;
      return;
    }
}

PoolStats StagingPool::stats() {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t registered = 0;
  if (reg_) {
    for (auto& b : bufs_)
      if (b.owner == owner_) registered += slot_;
    if (small_ && small_owner_ == owner_) registered += small_total();
  }
  return {cap_, slot_, allocated_, in_use_, allocations_, reuses_, registered};
}

}  // namespace r2ccl::stage
