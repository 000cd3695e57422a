// Names of error causes, as Python sees them (R2cclError.cause).
#include "base/error.h"

namespace r2ccl {

const char* cause_name(Cause c) {
  const auto i = static_cast<size_t>(c);
  return i < std::size(kCauseNames) ? kCauseNames[i] : "unknown";
}

}  // namespace r2ccl
