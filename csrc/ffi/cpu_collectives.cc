// The CPU custom call behind jax_r2ccl.psum and friends. Thin and platform-neutral in
// shape: decode the operands and attributes, hand one DeviceCall to the collective runtime,
// return a Future that the runtime completes on its own thread. Never blocks XLA's thread,
// so independent collectives may run in any order on each process without deadlock.
//
// Operands: x (any supported dtype), group (s32 scalar), rank (s32 scalar).
// Result: the collective's output. Attributes: comm_id, op_id, kind, reduce_op, root (i64).
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "coll/runtime.h"
#include "ffi/boundary.h"
#include "ffi/completion.h"
#include "ffi/handlers.h"
#include "xla/ffi/api/ffi.h"

namespace r2ccl::ffi {
namespace {

// Collectives up to this size may be waited for on XLA's thread (R2CCL_SYNC_WAIT_US): the
// small ones, which the executor finishes in one step.
constexpr uint64_t kSyncWaitMaxBytes = coll::kSmallCollectiveBytes;

// Who completes a call's future: XLA's thread, while it still waits in the handler, or the
// completion pool afterwards. `active` is the call's token (Runtime::enter_call): let go
// right after the future was set, so shutdown's drain never sees a call ended whose
// completion XLA has not got, and never releases the runtime on the executor's or the
// engine's thread (the future is set on XLA's thread or a pool thread).
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool waiting = true;
  bool done = false;
  std::optional<xffi::Error> error;
  coll::Runtime::CallToken active;

  void delivered() {
    coll::Runtime::CallToken t;
    {
      std::lock_guard<std::mutex> g(mu);
      t = std::move(active);
    }
  }
};


xffi::Future ready_error(const xffi::Error& e) {
  xffi::Promise p;
  p.SetError(e);
  return xffi::Future(p);
}

// What the guard's error path needs to know: whether the call was decoded (then the other
// local ranks must hear that this one will not come) and whether the runtime took it.
struct Progress {
  std::shared_ptr<coll::Runtime> rt;
  coll::Runtime::CallToken active;   // from entry; the Waiter takes it over once the call is handed on
  coll::DeviceCall call;
  bool decoded = false;
  bool handed = false;
};

// Everything after decoding, for every handler of this platform: `decode` fills pr.call.
template <typename Decode>
xffi::Future collective_body(Progress& pr, Decode&& decode_call) {
  pr.rt = coll::Runtime::current();
  if (!pr.rt) return ready_error(invalid("jax_r2ccl.initialize() has not been called in this process"));
  pr.active = pr.rt->enter_call();
  coll::DeviceCall& c = pr.call;
  std::string bad = decode_call(c);
  if (!bad.empty()) return ready_error(invalid(bad));
  pr.decoded = true;
  log_call(c, "cpu");
  maybe_throw_injected();
  xffi::Promise promise;
  xffi::Future future(promise);
  auto w = std::make_shared<Waiter>();
  w->active = pr.active;
  c.done = [promise, w](const Error* e) mutable {
    std::optional<xffi::Error> err;
    if (e) err = to_ffi_error(*e);
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
      CompletionPool::instance().run([promise, w]() mutable {
        promise.SetAvailable();
        w->delivered();
      });
    } else {
      CompletionPool::instance().run([promise, w, err = *err]() mutable {
        promise.SetError(err);
        w->delivered();
      });
    }
  };
  const uint64_t bytes = c.count * static_cast<uint64_t>(coll::dtype_size(c.dtype));
  const int wait_us = pr.rt->config().sync_wait_us;
  pr.handed = true;   // from here the runtime owns the call: `done` reports its end
  bool alone = pr.rt->device_call(std::move(c));
  // A small collective that is the only one in flight: wait for it here, briefly, and hand
  // XLA a finished future, which it continues on this same thread (no thread hop). Never
  // longer than R2CCL_SYNC_WAIT_US, so collectives that other processes issue in another
  // order cannot deadlock; after that the future completes from the pool as usual.
  std::unique_lock<std::mutex> lk(w->mu);
  if (!w->done && alone && bytes <= kSyncWaitMaxBytes && wait_us > 0)
    w->cv.wait_for(lk, std::chrono::microseconds(wait_us), [&] { return w->done; });
  w->waiting = false;
  if (!w->done) return future;   // the pool sets it, then lets go of the token
  lk.unlock();
  if (w->error)
    promise.SetError(*w->error);
  else
    promise.SetAvailable();
  w->delivered();
  return future;   // pr.active goes with the handler's return
}

// Nothing thrown below may reach XLA: an exception becomes the call's error, and a call that
// was decoded but never handed over is abandoned, so the process's other local ranks fail
// with it instead of waiting.
template <typename Decode>
xffi::Future guarded(const char* where, Decode&& decode_call) {
  Progress pr;
  return guard(
      where, [&] { return collective_body(pr, decode_call); },
      [&](const Error& e) {
        if (pr.decoded && !pr.handed && pr.rt) pr.rt->abandon(pr.call, e);
        return ready_error(to_ffi_error(e));
      });
}

xffi::Future collective(xffi::RunId run_id, xffi::AnyBuffer x, xffi::Buffer<xffi::S32> group,
                        xffi::Buffer<xffi::S32> rank, xffi::Result<xffi::AnyBuffer> out, int64_t comm_id,
                        int64_t op_id, int64_t kind, int64_t reduce_op, int64_t root) {
  return guarded("r2ccl_collective (cpu)", [&](coll::DeviceCall& c) {
    return decode(c, static_cast<uint64_t>(run_id.run_id), x, group.typed_data()[0], rank.typed_data()[0], *out,
                  comm_id, op_id, kind, reduce_op, root);
  });
}

// jax.lax.ragged_all_to_all: the result is aliased to the output operand (the lowering asks
// XLA for it), so it starts as the output; only received slices are written.
xffi::Future ragged(xffi::RunId run_id, xffi::AnyBuffer x, xffi::AnyBuffer output, xffi::AnyBuffer in_off,
                    xffi::AnyBuffer send, xffi::AnyBuffer out_off, xffi::AnyBuffer recv, xffi::Buffer<xffi::S32> group,
                    xffi::Buffer<xffi::S32> rank, xffi::Result<xffi::AnyBuffer> out, int64_t comm_id, int64_t op_id) {
  return guarded("r2ccl_ragged_all_to_all (cpu)", [&](coll::DeviceCall& c) {
    std::string bad = decode_ragged(c, static_cast<uint64_t>(run_id.run_id), x, output, in_off, send, out_off, recv,
                                    group.typed_data()[0], rank.typed_data()[0], *out, comm_id, op_id);
    if (bad.empty() && output.untyped_data() != out->untyped_data())   // (not aliased after all)
      std::memcpy(out->untyped_data(), output.untyped_data(), out->size_bytes());
    return bad;
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(R2cclCollectiveCpu, collective,
                              bind_collective(xffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(R2cclRaggedCpu, ragged, bind_ragged(xffi::Ffi::Bind()));

void* collective_cpu_handler() { return reinterpret_cast<void*>(R2cclCollectiveCpu); }
void* ragged_cpu_handler() { return reinterpret_cast<void*>(R2cclRaggedCpu); }

}  // namespace r2ccl::ffi
