// The chunk pipeline of a collective on a device that the transport cannot reach directly:
// device -> host staging -> transport -> host staging -> device, cut into chunks so that the
// copy in of chunk c+1, the collective of chunk c and the copy out of chunk c-1 overlap.
// Platform-neutral: the copies go through a CopyEngine (CUDA streams on GPU, memcpy in
// tests), the staging comes from a StagingPool, each chunk is one collective of the
// process's Runtime (matched across processes and local devices like any other).
//
// Chunking. Every kind has a per-rank "segment" cut into pieces of U elements: all_reduce
// and broadcast cut the buffer; all_gather cuts its input (each piece lands in all n rank
// blocks of the result); reduce_scatter cuts its result (each piece gathers one run from
// each of the n input blocks); all_to_all cuts a block (n runs in, n runs out). A piece's
// collective is the same kind over U elements (U * n where the kind says so), so every
// element meets exactly the same operands in the same canonical order as in one
// collective over the whole buffer: the result is bit-identical to the unstaged path.
// U depends only on R2CCL_STAGING_CHUNK_BYTES, the dtype and the group size, never on the
// pool, so every process cuts the same chunks (a process configured otherwise fails with
// a mismatch on the first chunk).
//
// Small calls. A collective whose bytes fit the pool's small area (64 KiB each way, at most
// one chunk) skips the pipeline: its input is read together with the group and rank
// operands in one wait (CopyEngine::read_now), the collective runs on the small area, and
// the result is queued back (CopyEngine::write_later) without waiting: one wait per call
// instead of four. On the wire it is chunk 0 of a one-chunk staged call (same op id, same
// count), so a process that stages it and one that takes the small path still match.
//
// Blocking: run() returns when the result is on the device (the caller's later work is
// ordered after it) or throws r2ccl::Error; it never returns with a copy or a chunk's
// collective still in flight, so staging is never released under a transfer.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "base/error.h"
#include "coll/runtime.h"
#include "stage/copy_engine.h"
#include "stage/pool.h"

namespace r2ccl::stage {

struct PipelineOptions {
  uint64_t chunk_bytes = 4 << 20;   // R2CCL_STAGING_CHUNK_BYTES: bytes of the larger side of one step
  int depth = 3;                    // steps in flight (fewer when the pool's bound leaves no room)
  double timeout_s = 30.0;          // bound on copies that never complete
  // all_reduce / reduce_scatter with several local ranks: the lowest one folds all their
  // inputs on its device (CopyEngine::fold_to_host) and only the fold crosses to the host;
  // the others copy nothing in.
  bool device_fold = true;
  // The pool's buffers are registered with the runtime's endpoint (StagingPool::register_with),
  // so that RDMA rails write the staged bytes without copying them. Off: the copy path (the
  // benchmark's baseline).
  bool register_staging = true;
};

struct PipelineResult {
  bool small = false;        // the small path (one wait, no pipeline)
  uint64_t chunks = 0;       // collectives the call was cut into
  int depth = 0;             // steps that were in flight at most
  uint64_t staged_bytes = 0; // host staging the call held
  bool device_fold = false;  // the local ranks' inputs were folded on the devices
};

// The bytes of one pool slot: the largest step any kind needs with chunks of `chunk_bytes`.
size_t slot_bytes(uint64_t chunk_bytes);
// The small area's bytes each way: coll::kSmallCollectiveBytes (64 KiB), or one chunk where
// chunks are smaller.
size_t small_bytes(uint64_t chunk_bytes);

// Registers the pool's buffers with `rt`'s endpoint where `opt` says so (run_staged and
// run_device_call do it first; once per runtime, then cheap).
void register_pool(coll::Runtime& rt, StagingPool& pool, const PipelineOptions& opt);

// Elements per chunk (U above) for a collective of `kind` over `n_ranks` with element size `esize`.
uint64_t chunk_elements(coll::Kind kind, int n_ranks, size_t esize, uint64_t chunk_bytes);

// Runs one local rank's part of `call` (call.in / call.out are device memory the engine
// copies; call.done is not used). Throws r2ccl::Error.
PipelineResult run_staged(coll::Runtime& rt, const coll::DeviceCall& call, CopyEngine& engine, StagingPool& pool,
                          const PipelineOptions& opt);

// One local rank's whole call, as a device handler runs it: reads the group and rank
// operands (s32 scalars in device memory) into the pool's small area after the caller's
// queued work, together with the input when the call is small, and sets call.group and
// call.rank from them; then `decoded(call)` (logging; it may throw); then the small path or
// run_staged. On an error after decoding, the call's chunks are abandoned for the process's
// other local ranks. Throws r2ccl::Error.
PipelineResult run_device_call(coll::Runtime& rt, coll::DeviceCall call, CopyEngine& engine, StagingPool& pool,
                               const PipelineOptions& opt, const void* group_operand, const void* rank_operand,
                               const std::function<void(const coll::DeviceCall&)>& decoded, bool allow_small = true);

// For a caller that fails before run_staged could start (e.g. it could not read its group
// and rank): counts every chunk of `call` as made and fails them for the process's other
// local ranks (Runtime::abandon), so none of them waits for this one.
void abandon_staged(coll::Runtime& rt, const coll::DeviceCall& call, const PipelineOptions& opt, const Error& why);

}  // namespace r2ccl::stage
