// The testing hook of boundary.h.
#include "ffi/boundary.h"

#include "base/log.h"

#include <stdexcept>

namespace r2ccl::ffi {

std::atomic<int>& injected_throw() {
  static std::atomic<int> armed{0};
  return armed;
}

void arm_injected_throw(InjectedThrow kind) { injected_throw().store(static_cast<int>(kind)); }

void log_call(const coll::DeviceCall& c, const char* platform) {
  R2_INFO("call: run %llx op %llx comm %llu group %lld rank %lld %s %llu elements on %s",
          static_cast<unsigned long long>(c.run_id), static_cast<unsigned long long>(c.op_id),
          static_cast<unsigned long long>(c.comm_id), static_cast<long long>(c.group), static_cast<long long>(c.rank),
          coll::kind_name(c.kind), static_cast<unsigned long long>(c.count), platform);
}

void maybe_throw_injected() {
  if (injected_throw().load(std::memory_order_relaxed) == 0) return;
  int k = injected_throw().exchange(0);
  switch (static_cast<InjectedThrow>(k)) {
    case InjectedThrow::kNone: return;
    case InjectedThrow::kStd: throw std::runtime_error("injected std::runtime_error (testing)");
    case InjectedThrow::kError: throw Error(Cause::kSystem, 3, "injected r2ccl::Error (testing)");
    case InjectedThrow::kOther: throw 42;
  }
}

}  // namespace r2ccl::ffi
