// Helpers shared by the engine's files (engine*.cc) and nothing else: units, handshake
// labels and MACs, frame encoding and header reading. Knows nothing of collectives or JAX.
#pragma once
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/channel.h"
#include "core/digest.h"
#include "core/wire.h"
#include "net/transport.h"

namespace r2ccl {
namespace detail {
constexpr int64_t kMs = 1000000;
constexpr size_t kMaxPendings = 64;
// Connections accepted per listener per turn of the engine: a flood of dials waits in the
// kernel's backlog instead of keeping the engine from its rails.
constexpr int kAcceptBatch = 16;
// Rejected or dropped connections logged per window; the rest are counted and summed up in
// one line when the window ends (a stranger must not be able to flood the log).
constexpr int kStrangerLogLines = 8;
constexpr int64_t kStrangerLogWindowNs = 10000 * kMs;
constexpr int64_t kEagerDrainNs = 5000 * kMs;   // most a close waits for eager sends to be acked (or R2CCL_TIMEOUT)
// How long a closed peer's links stay open after its goodbye, for the peer to close them
// first (its close reads our bye before our sockets go: no reset, no rail failure logged).
constexpr int64_t kCloseLingerNs = 2000 * kMs;
// How long after a caller's last test() the engine thread stays off the sockets (the test
// lease, engine.h). epoll's clock is in ms, so the engine thread looks again 1-2 ms after a
// caller stops polling without waiting.
constexpr int64_t kTestLeaseNs = 1 * kMs;

inline void random_bytes(uint8_t* out, size_t n) {
  while (n > 0) {
    ssize_t got = getrandom(out, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(Cause::kSystem, -1, std::string("getrandom: ") + std::strerror(errno));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
}


// Posts a small frame on a fresh link and writes it now: false when it did not all go.
inline bool send_at_once(FrameLink& link, const TxFrame& f) {
  SendPost p;
  p.header = f.hdr;
  p.payload = f.payload ? f.payload : f.owned.data();
  p.payload_len = f.payload_len;
  link.post_send(p);
  return link.poll_send().kind == LinkCompletion::kSent;
}

// Why a rail failed, from why its link did.
inline FailReason fail_reason_of(const LinkFailure& f) {
  switch (f.error) {
    case LinkError::kClosedByPeer: return FailReason::kClosedByPeer;
    case LinkError::kAbandoned: return FailReason::kAbandoned;
    default: return FailReason::kIo;
  }
}

}  // namespace detail
}  // namespace r2ccl
