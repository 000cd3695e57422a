// Names of error causes, as Python sees them (R2cclError.cause).
#include "base/error.h"

namespace r2ccl {

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::kInvalidArgument: return "invalid_argument";
    case Cause::kTimeout: return "timeout";
    case Cause::kAllRailsDown: return "all_rails_down";
    case Cause::kPeerGone: return "peer_gone";
    case Cause::kProtocol: return "protocol";
    case Cause::kMismatch: return "mismatch";
    case Cause::kSystem: return "system";
    case Cause::kClosed: return "closed";
  }
  return "unknown";
}

}  // namespace r2ccl
