// A CopyEngine of plain memcpy on a worker thread of its own: what stands in for the copy
// engine when the chunk pipeline is tested on CPU (and the model of the CUDA engine: copies
// run in the order queued, `done` fires after each batch).
#pragma once
#include <memory>

#include "stage/copy_engine.h"

namespace r2ccl::stage {

// fail_after: testing, the batch with this index (0-based, counting both directions) fails
// and every later sync() reports it; -1 never.
std::unique_ptr<CopyEngine> host_copy_engine(int fail_after = -1);

}  // namespace r2ccl::stage
