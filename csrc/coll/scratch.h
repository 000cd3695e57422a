// The collectives' scratch memory: a peer's partial before it is folded, an accumulator, a
// relayed piece, a signature. Blocks of power-of-two sizes, reused across calls (a freed
// block goes back to its size's list), and from kScratchRegisterBytes up registered once
// with the endpoint (Endpoint::register_memory), so that an RDMA rail writes a peer's piece
// straight into it and reads ours straight out of it, as it does the staging pool's slots
// (docs/design.md §10). A block is handed out zeroed, as the vectors it replaces were.
//
// Lifetimes. A block goes back when the collective that took it is destroyed, after every
// request on it finished or was cancelled (a cancelled receive's keys are renewed first, so
// a late write cannot land in the block's next use). The cache keeps at most
// kScratchCachedBytes of free blocks; a block beyond that, and every block at the cache's
// end, is deregistered and freed. Any thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/endpoint.h"

namespace r2ccl::coll {

inline constexpr uint64_t kScratchRegisterBytes = 64 << 10;   // smaller blocks stay unregistered
inline constexpr uint64_t kScratchCachedBytes = 256ull << 20; // free blocks kept for reuse, at most

struct ScratchStats {
  uint64_t allocations = 0;      // blocks allocated (flat once the sizes in use are cached)
  uint64_t reuses = 0;           // blocks handed out again
  uint64_t registered_bytes = 0; // held now (in use or free) and registered
};

class ScratchCache : public std::enable_shared_from_this<ScratchCache> {
 public:
  explicit ScratchCache(std::shared_ptr<Endpoint> ep);
  ~ScratchCache();
  ScratchCache(const ScratchCache&) = delete;
  ScratchCache& operator=(const ScratchCache&) = delete;

  class Block {
   public:
    Block() = default;
    Block(Block&& o) noexcept { *this = std::move(o); }
    Block& operator=(Block&& o) noexcept;
    ~Block();
    uint8_t* data() const { return p_; }

   private:
    friend class ScratchCache;
    std::shared_ptr<ScratchCache> cache_;
    uint8_t* p_ = nullptr;
    int cls_ = 0;
    uint64_t reg_ = 0;   // the endpoint's registration id (0: none)
  };

  // A zeroed block of at least `bytes` (0 bytes: a valid pointer all the same). Throws
  // Error(kSystem) when memory runs out; a registration the transport refuses is logged
  // once and the block moves by copies.
  Block take(uint64_t bytes);
  ScratchStats stats();

 private:
  struct Free {
    uint8_t* p;
    uint64_t reg;
  };
  void give_back(uint8_t* p, int cls, uint64_t reg) noexcept;
  void release(uint8_t* p, uint64_t reg) noexcept;

  std::shared_ptr<Endpoint> ep_;
  std::mutex mu_;
  std::vector<std::vector<Free>> free_;   // by size class (2^cls bytes)
  uint64_t free_bytes_ = 0, registered_bytes_ = 0, allocations_ = 0, reuses_ = 0;
  bool warned_ = false;
};

}  // namespace r2ccl::coll
