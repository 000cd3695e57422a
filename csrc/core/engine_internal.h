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

namespace r2ccl {
namespace detail {
constexpr int64_t kMs = 1000000;
constexpr size_t kMaxPendings = 64;
constexpr char kAcceptorLabel[] = "r2ccl-v1-acceptor";
constexpr char kConnectorLabel[] = "r2ccl-v1-connector";

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

inline std::array<uint8_t, kMacBytes> handshake_mac(const std::string& secret, const char* label,
                                             const uint8_t* hello, const uint8_t* nonce) {
  ByteSpan parts[3] = {{label, std::strlen(label)}, {hello, kHelloBytes}, {nonce, kNonceBytes}};
  return hmac_sha256(secret.data(), secret.size(), parts, 3);
}

inline const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kNone: return "";
    case Fault::kClose: return "close";
    case Fault::kStall: return "stall";
    case Fault::kRate: return "rate";
  }
  return "?";
}

// Reads into rx.hdr until a whole header is there. Returns kOk when complete.
inline IoResult read_header(Connection& c, RxFrame& rx) {
  while (rx.hdr_got < kHeaderBytes) {
    IoResult res = c.read(rx.hdr + rx.hdr_got, kHeaderBytes - rx.hdr_got);
    if (res.kind != IoResult::kOk) return res;
    rx.hdr_got += res.bytes;
  }
  return {IoResult::kOk, 0, 0};
}

}  // namespace detail
}  // namespace r2ccl
