// The verbs backend's memory registration (verbs_internal.h): today each link's bounce buffers,
// registered with its device's protection domain for local access only (SENDs; nothing of
// ours is remotely accessible). The transport registers no caller memory: posts are copied.
#if R2CCL_HAVE_IBVERBS

#include <cstdlib>
#include <string>

#include "net/ibverbs/verbs_internal.h"

namespace r2ccl::verbs {

bool VerbsLink::register_buffers() {
  const size_t bytes = size_t{n_send_ + n_recv_} * buf_bytes_ + kCtrlBuffers * kCtrlSlotBytes;
  mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095}));
  if (!mem_) return sys_fail("bounce buffer allocation");
  mr_ = api_->reg_mr(at_.dev->pd, mem_, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (!mr_) return sys_fail("ibv_reg_mr of " + std::to_string(bytes) + " bytes of bounce buffers (RLIMIT_MEMLOCK?)");
  return true;
}

}  // namespace r2ccl::verbs

#endif  // R2CCL_HAVE_IBVERBS
