// What every XLA FFI handler of jax_r2ccl shares, on both platforms: decoding operands into a
// coll::DeviceCall, the error text XLA shows ("[r2ccl <cause>, peer <n>] ..."), and the rule
// that no C++ exception crosses into XLA (an exception there ends the process): handler
// bodies run inside guard(), which turns any exception into an ffi::Error naming it.
// Included only by csrc/ffi/*.cc (the files that may know XLA's types).
#pragma once
#include <atomic>
#include <exception>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "coll/runtime.h"
#include "ffi/handlers.h"
#include "xla/ffi/api/ffi.h"

namespace r2ccl::ffi {

namespace xffi = xla::ffi;

// Testing: the armed injection (handlers.h, InjectedThrow).
std::atomic<int>& injected_throw();
void maybe_throw_injected();   // throws (and disarms) when armed; handlers call it after decoding
// One line per call at INFO (R2CCL_DEBUG=INFO), once its group and rank are known:
// "call: run R op O comm C group G rank K KIND N elements on PLATFORM". Processes of one
// program log the same run ids (XLA's launch id); bench/gpu_check.sh compares them.
void log_call(const coll::DeviceCall& c, const char* platform);

inline bool to_dtype(xffi::DataType t, coll::DType* out) {
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

// "[r2ccl <cause>, peer <n>] <what>" with the status code XLA prefixes.
inline xffi::Error to_ffi_error(const Error& e) {
  std::string msg = std::string("[r2ccl ") + cause_name(e.cause()) +
                    (e.peer() >= 0 ? ", peer " + std::to_string(e.peer()) : std::string()) + "] " + e.what();
  auto code = e.cause() == Cause::kInvalidArgument || e.cause() == Cause::kMismatch ? xffi::ErrorCode::kInvalidArgument
               : e.cause() == Cause::kInternal || e.cause() == Cause::kDevice      ? xffi::ErrorCode::kInternal
                                                                                  : xffi::ErrorCode::kUnavailable;
  return xffi::Error(code, msg);
}

inline xffi::Error invalid(const std::string& why) { return to_ffi_error(Error(Cause::kInvalidArgument, -1, why)); }

// Runs `body` (returning ffi::Error or ffi::Future); any exception becomes `on_error(Error)`.
template <typename Body, typename OnError>
auto guard(const char* where, Body&& body, OnError&& on_error) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    return on_error(e);
  } catch (const std::exception& e) {
    return on_error(Error(Cause::kInternal, -1, std::string(where) + ": unexpected C++ exception: " + e.what()));
  } catch (...) {
    return on_error(Error(Cause::kInternal, -1, std::string(where) + ": unexpected exception of unknown type"));
  }
}

// The custom call's signature after any platform context (the CUDA stream): the run id, the
// operands x, group, rank, the result, and the attributes, in this order on every platform.
template <typename Binding>
auto bind_collective(Binding b) {
  return std::move(b).template Ctx<xffi::RunId>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::Buffer<xffi::S32>>()
      .template Arg<xffi::Buffer<xffi::S32>>()
      .template Ret<xffi::AnyBuffer>()
      .template Attr<int64_t>("comm_id")
      .template Attr<int64_t>("op_id")
      .template Attr<int64_t>("kind")
      .template Attr<int64_t>("reduce_op")
      .template Attr<int64_t>("root");
}

// Decodes the operands every handler has into `c` (all but the data pointers' meaning, which
// is the platform's: host memory on CPU, device memory on CUDA). Checks the result buffer's
// type here; its element count is checked by the runtime against the group size.
inline std::string decode(coll::DeviceCall& c, uint64_t run_id, const xffi::AnyBuffer& x, int32_t group, int32_t rank,
                          const xffi::AnyBuffer& out, int64_t comm_id, int64_t op_id, int64_t kind, int64_t reduce_op,
                          int64_t root) {
  if (!to_dtype(x.element_type(), &c.dtype)) return "unsupported operand dtype";
  if (out.element_type() != x.element_type()) return "the result buffer's dtype differs from the operand's";
  if (kind < 0 || kind > static_cast<int64_t>(coll::Kind::kPermute) || reduce_op < 0 ||
      reduce_op > static_cast<int64_t>(coll::ReduceOp::kMax))
    return "bad collective attributes (kind " + std::to_string(kind) + ", reduce_op " + std::to_string(reduce_op) + ")";
  c.comm_id = static_cast<uint64_t>(comm_id);
  c.op_id = static_cast<uint64_t>(op_id);
  c.run_id = run_id;
  c.kind = static_cast<coll::Kind>(kind);
  c.op = static_cast<coll::ReduceOp>(reduce_op);
  c.root = static_cast<int>(root);
  c.group = group;
  c.rank = rank;
  c.in = x.untyped_data();
  c.out = out.untyped_data();
  c.count = x.element_count();
  c.out_count = out.element_count();
  return {};
}

// ragged_all_to_all's custom call: the operand, the output (aliased to the result, so the
// result starts as it), input_offsets, send_sizes, output_offsets, recv_sizes (s32 or s64),
// group, rank; the result; comm_id, op_id.
template <typename Binding>
auto bind_ragged(Binding b) {
  return std::move(b).template Ctx<xffi::RunId>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::AnyBuffer>()
      .template Arg<xffi::Buffer<xffi::S32>>()
      .template Arg<xffi::Buffer<xffi::S32>>()
      .template Ret<xffi::AnyBuffer>()
      .template Attr<int64_t>("comm_id")
      .template Attr<int64_t>("op_id");
}

// One of ragged_all_to_all's integer operands into `out`; empty, or why it cannot be.
inline std::string decode_ints(const xffi::AnyBuffer& b, const char* name, std::vector<int64_t>* out) {
  const size_t n = b.element_count();
  out->resize(n);
  if (b.element_type() == xffi::DataType::S32) {
    const auto* p = static_cast<const int32_t*>(b.untyped_data());
    for (size_t i = 0; i < n; i++) (*out)[i] = p[i];
  } else if (b.element_type() == xffi::DataType::S64) {
    const auto* p = static_cast<const int64_t*>(b.untyped_data());
    for (size_t i = 0; i < n; i++) (*out)[i] = p[i];
  } else {
    return std::string("ragged_all_to_all's ") + name + " must be int32 or int64";
  }
  return {};
}

inline std::string decode_ragged(coll::DeviceCall& c, uint64_t run_id, const xffi::AnyBuffer& x,
                                 const xffi::AnyBuffer& output, const xffi::AnyBuffer& in_off,
                                 const xffi::AnyBuffer& send, const xffi::AnyBuffer& out_off,
                                 const xffi::AnyBuffer& recv, int32_t group, int32_t rank, const xffi::AnyBuffer& out,
                                 int64_t comm_id, int64_t op_id) {
  std::string bad = decode(c, run_id, x, group, rank, out, comm_id, op_id, 0, 0, 0);
  if (!bad.empty()) return bad;
  c.kind = coll::Kind::kRaggedAllToAll;
  if (output.element_type() != x.element_type() || output.element_count() != out.element_count())
    return "ragged_all_to_all's output operand differs from its result buffer";
  const auto dims = x.dimensions();
  if (dims.size() == 0 || dims[0] <= 0) return "ragged_all_to_all's operand needs a leading axis of rows";
  c.row_elems = c.count / static_cast<uint64_t>(dims[0]);
  for (auto [b, name, v] : {std::tuple{&in_off, "input_offsets", &c.ragged.in_off},
                            std::tuple{&send, "send_sizes", &c.ragged.send},
                            std::tuple{&out_off, "output_offsets", &c.ragged.out_off},
                            std::tuple{&recv, "recv_sizes", &c.ragged.recv}}) {
    bad = decode_ints(*b, name, v);
    if (!bad.empty()) return bad;
  }
  return {};
}

}  // namespace r2ccl::ffi
