// The CPU custom call behind jax_r2ccl.psum and friends. Thin and platform-neutral in
// shape: decode the operands and attributes, hand one DeviceCall to the collective runtime,
// return a Future that the runtime completes on its own thread. Never blocks XLA's thread,
// so independent collectives may run in any order on each process without deadlock.
//
// Operands: x (any supported dtype), group (s32 scalar), rank (s32 scalar).
// Result: the collective's output. Attributes: comm_id, op_id, kind, reduce_op, root (i64).
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "coll/runtime.h"
#include "ffi/completion.h"
#include "ffi/handlers.h"
#include "xla/ffi/api/ffi.h"

namespace xffi = xla::ffi;

namespace r2ccl::ffi {
namespace {

// Collectives up to this size may be waited for on XLA's thread (R2CCL_SYNC_WAIT_US): the
// small ones, which the executor finishes in one step.
constexpr uint64_t kSyncWaitMaxBytes = coll::kSmallCollectiveBytes;

// Who completes a call's future: XLA's thread, while it still waits in the handler, or the
// completion pool afterwards.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool waiting = true;
  bool done = false;
  std::optional<xffi::Error> error;
};

bool to_dtype(xffi::DataType t, coll::DType* out) {
  using coll::DType;
  switch (t) {
    case xffi::DataType::F32: *out = DType::kF32; return true;
    case xffi::DataType::F64: *out = DType::kF64; return true;
    case xffi::DataType::F16: *out = DType::kF16; return true;
    case xffi::DataType::BF16: *out = DType::kBF16; return true;
    case xffi::DataType::S8: *out = DType::kI8; return true;
    case xffi::DataType::U8: *out = DType::kU8; return true;
    case xffi::DataType::S32: *out = DType::kI32; return true;
    case xffi::DataType::U32: *out = DType::kU32; return true;
    case xffi::DataType::S64: *out = DType::kI64; return true;
    case xffi::DataType::U64: *out = DType::kU64; return true;
    case xffi::DataType::PRED: *out = DType::kBool; return true;
    default: return false;
  }
}

xffi::Future ready_error(xffi::ErrorCode code, const std::string& msg) {
  xffi::Promise p;
  p.SetError(xffi::Error(code, msg));
  return xffi::Future(p);
}

xffi::Future collective(xffi::RunId run_id, xffi::AnyBuffer x, xffi::Buffer<xffi::S32> group,
                        xffi::Buffer<xffi::S32> rank, xffi::Result<xffi::AnyBuffer> out, int64_t comm_id,
                        int64_t op_id, int64_t kind, int64_t reduce_op, int64_t root) {
  auto rt = coll::Runtime::current();
  if (!rt)
    return ready_error(xffi::ErrorCode::kFailedPrecondition,
                       "[r2ccl invalid_argument] jax_r2ccl.initialize() has not been called in this process");
  coll::DeviceCall c;
  if (!to_dtype(x.element_type(), &c.dtype) || out->element_type() != x.element_type())
    return ready_error(xffi::ErrorCode::kInvalidArgument, "[r2ccl invalid_argument] unsupported operand dtype");
  if (kind < 0 || kind > 4 || reduce_op < 0 || reduce_op > 3)
    return ready_error(xffi::ErrorCode::kInvalidArgument, "[r2ccl invalid_argument] bad collective attributes");
  c.comm_id = static_cast<uint64_t>(comm_id);
  c.op_id = static_cast<uint64_t>(op_id);
  c.run_id = static_cast<uint64_t>(run_id.run_id);
  c.kind = static_cast<coll::Kind>(kind);
  c.op = static_cast<coll::ReduceOp>(reduce_op);
  c.root = static_cast<int>(root);
  c.group = group.typed_data()[0];
  c.rank = rank.typed_data()[0];
  c.in = x.untyped_data();
  c.out = out->untyped_data();
  c.count = x.element_count();
  xffi::Promise promise;
  xffi::Future future(promise);
  auto w = std::make_shared<Waiter>();
  c.done = [promise, w](const Error* e) mutable {
    std::optional<xffi::Error> err;
    if (e) {
      std::string msg = std::string("[r2ccl ") + cause_name(e->cause()) +
                        (e->peer() >= 0 ? ", peer " + std::to_string(e->peer()) : std::string()) + "] " + e->what();
      auto code = e->cause() == Cause::kInvalidArgument || e->cause() == Cause::kMismatch
                      ? xffi::ErrorCode::kInvalidArgument
                      : xffi::ErrorCode::kUnavailable;
      err = xffi::Error(code, msg);
    }
    {
      std::lock_guard<std::mutex> g(w->mu);
      if (w->waiting) {   // XLA's thread still waits in the handler: it takes the result
        w->done = true;
        w->error = std::move(err);
        w->cv.notify_one();
        return;
      }
    }
    // XLA continues the program on the thread that completes the future: never ours.
    if (!err) {
      CompletionPool::instance().run([promise]() mutable { promise.SetAvailable(); });
    } else {
      CompletionPool::instance().run([promise, err = *err]() mutable { promise.SetError(err); });
    }
  };
  const uint64_t bytes = c.count * static_cast<uint64_t>(coll::dtype_size(c.dtype));
  bool alone = rt->device_call(std::move(c));
  // A small collective that is the only one in flight: wait for it here, briefly, and hand
  // XLA a finished future, which it continues on this same thread (no thread hop). Never
  // longer than R2CCL_SYNC_WAIT_US, so collectives that other processes issue in another
  // order cannot deadlock; after that the future completes from the pool as usual.
  std::unique_lock<std::mutex> lk(w->mu);
  const int wait_us = rt->config().sync_wait_us;
  if (!w->done && alone && bytes <= kSyncWaitMaxBytes && wait_us > 0)
    w->cv.wait_for(lk, std::chrono::microseconds(wait_us), [&] { return w->done; });
  w->waiting = false;
  if (!w->done) return future;
  if (w->error)
    promise.SetError(*w->error);
  else
    promise.SetAvailable();
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(R2cclCollectiveCpu, collective,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::RunId>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Buffer<xffi::S32>>()
                                  .Arg<xffi::Buffer<xffi::S32>>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int64_t>("op_id")
                                  .Attr<int64_t>("kind")
                                  .Attr<int64_t>("reduce_op")
                                  .Attr<int64_t>("root"));

void* collective_cpu_handler() { return reinterpret_cast<void*>(R2cclCollectiveCpu); }

}  // namespace r2ccl::ffi
