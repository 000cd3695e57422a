// The collectives' scratch memory (see scratch.h).
#include "coll/scratch.h"

#include <cstring>
#include <new>

#include "base/error.h"
#include "base/log.h"

namespace r2ccl::coll {

namespace {
constexpr int kMinClass = 12;   // 4 KiB: blocks are page-aligned, as registration wants
constexpr size_t kAlign = 4096;

int class_of(uint64_t bytes) {
  int c = kMinClass;
  while ((uint64_t{1} << c) < bytes) c++;
  return c;
}
}  // namespace

ScratchCache::ScratchCache(std::shared_ptr<Endpoint> ep) : ep_(std::move(ep)) {}

ScratchCache::~ScratchCache() {
  for (auto& list : free_)
    for (const Free& f : list) release(f.p, f.reg);
}

ScratchCache::Block& ScratchCache::Block::operator=(Block&& o) noexcept {
  if (this != &o) {
    if (cache_ && p_) cache_->give_back(p_, cls_, reg_);
    cache_ = std::move(o.cache_);
    p_ = o.p_;
    cls_ = o.cls_;
    reg_ = o.reg_;
    o.p_ = nullptr;
    o.reg_ = 0;
  }
  return *this;
}

ScratchCache::Block::~Block() {
  if (cache_ && p_) cache_->give_back(p_, cls_, reg_);
}

ScratchCache::Block ScratchCache::take(uint64_t bytes) {
  Block b;
  b.cls_ = class_of(bytes);
  if (b.cls_ >= 63) throw Error(Cause::kInvalidArgument, -1, "scratch of " + std::to_string(bytes) + " bytes");
  const uint64_t size = uint64_t{1} << b.cls_;
  {
    std::lock_guard<std::mutex> g(mu_);
    const size_t c = static_cast<size_t>(b.cls_);
    if (c < free_.size() && !free_[c].empty()) {
      b.p_ = free_[c].back().p;
      b.reg_ = free_[c].back().reg;
      free_[c].pop_back();
      free_bytes_ -= size;
      reuses_++;
    }
  }
  if (!b.p_) {
    b.p_ = static_cast<uint8_t*>(::operator new(size, std::align_val_t(kAlign), std::nothrow));
    if (!b.p_)
      throw Error(Cause::kSystem, -1, "cannot allocate " + std::to_string(size) + " bytes of collective scratch");
    if (size >= kScratchRegisterBytes) {
      try {
        b.reg_ = ep_->register_memory(b.p_, size);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> g(mu_);
        if (!warned_) R2_WARN("collective scratch stays unregistered, so it moves by copies: %s", e.what());
        warned_ = true;
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    allocations_++;
    if (b.reg_) registered_bytes_ += size;
  }
  std::memset(b.p_, 0, size);
  b.cache_ = shared_from_this();
  return b;
}

void ScratchCache::give_back(uint8_t* p, int cls, uint64_t reg) noexcept {
  const uint64_t size = uint64_t{1} << cls;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (free_bytes_ + size <= kScratchCachedBytes) {
      while (free_.size() <= static_cast<size_t>(cls)) free_.emplace_back();
      free_[static_cast<size_t>(cls)].push_back({p, reg});
      free_bytes_ += size;
      return;
    }
    if (reg) registered_bytes_ -= size;
  }
  release(p, reg);
}

void ScratchCache::release(uint8_t* p, uint64_t reg) noexcept {
  if (reg) {
    try {
      ep_->deregister_memory(reg);
    } catch (const Error& e) {
      R2_WARN("deregistering collective scratch: %s", e.what());
    }
  }
  ::operator delete(p, std::align_val_t(kAlign));
}

ScratchStats ScratchCache::stats() {
  std::lock_guard<std::mutex> g(mu_);
  return {allocations_, reuses_, registered_bytes_};
}

}  // namespace r2ccl::coll
