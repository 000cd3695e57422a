// The one error type: a cause, the peer it concerns (-1: none) and a sentence.
// Every failure that reaches Python is one of these. Knows nothing above base/.
#pragma once
#include <iterator>
#include <stdexcept>
#include <string>

namespace r2ccl {

enum class Cause {
  kInvalidArgument,  // the caller asked for something impossible
  kTimeout,          // a wait ran past its deadline
  kAllRailsDown,     // every rail to a peer failed for longer than R2CCL_TIMEOUT
  kPeerGone,         // the peer process closed or refuses every connection
  kProtocol,         // the peer sent something the wire protocol forbids
  kMismatch,         // both sides disagree about a message (size, kind)
  kSystem,           // an operating-system call failed
  kClosed,           // the endpoint was closed while the operation was pending
  kDevice,           // a CUDA call failed (the accelerator, its driver or its memory)
  kInternal,         // a bug in jax_r2ccl: an unexpected exception caught at the FFI boundary
};

// Python's names of the causes (R2cclError.cause), in enum order: the one list, exported
// by _core.names() so jax_r2ccl/errors.py and the parity test read the same names.
inline constexpr const char* kCauseNames[] = {
    "invalid_argument", "timeout", "all_rails_down", "peer_gone", "protocol", "mismatch", "system", "closed",
    "device", "internal",
};
static_assert(std::size(kCauseNames) == static_cast<size_t>(Cause::kInternal) + 1, "a Cause without a name");

const char* cause_name(Cause c);

class Error : public std::runtime_error {
 public:
  Error(Cause cause, int peer, const std::string& what)
      : std::runtime_error(what), cause_(cause), peer_(peer) {}
  // Copies own their sentence. std::runtime_error's copies share one reference-counted
  // buffer whose count lives in the standard library, which ThreadSanitizer does not see:
  // an Error handed to another thread (a request's failure, a call's answer) then looks
  // like a race when the last owner frees it. Errors are rare; the copy costs nothing.
  Error(const Error& o) : std::runtime_error(std::string(o.what())), cause_(o.cause_), peer_(o.peer_) {}
  Error& operator=(const Error& o) {
    if (this != &o) {
      std::runtime_error::operator=(std::runtime_error(std::string(o.what())));
      cause_ = o.cause_;
      peer_ = o.peer_;
    }
    return *this;
  }
  Cause cause() const { return cause_; }
  int peer() const { return peer_; }

 private:
  Cause cause_;
  int peer_;
};

}  // namespace r2ccl
