// Names of error causes, as Python sees them (R2cclError.cause).
#include "base/error.h"
#include "base/enum_names.h"

namespace r2ccl {

const char* cause_name(Cause c) { return enum_name(kCauseNames, c, "unknown"); }

}  // namespace r2ccl
