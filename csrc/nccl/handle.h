// The listen handle of the NCCL net plugin: what listen() writes into NCCL's handle buffer and
// connect() reads back on another process, after NCCL's bootstrap carried it there. It names
// the listener's addresses (one per NIC), the listen's id (the hello's domain) and its nonce,
// the key of every rail's proof (core/identity.h), so a connection that was not given the
// handle cannot join. Fixed layout, little-endian, at most kNcclHandleBytes. Knows nothing
// of NCCL's tables.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace r2ccl::nccl {

inline constexpr size_t kNcclHandleBytes = 128;   // NCCL_NET_HANDLE_MAXSIZE (net_abi.h)
inline constexpr size_t kHandleNonceBytes = 32;
inline constexpr size_t kHandleMaxNics = 8;
inline constexpr uint32_t kHandleMagic = 0x504e3252;   // "R2NP"
inline constexpr uint8_t kHandleVersion = 2;   // 2: the listener's device

struct HandleAddr {
  uint32_t ipv4 = 0;        // network byte order
  uint16_t port = 0;
  uint8_t transport = 0;    // the listener's transport on this NIC: its registry wire_id (net/registry.h)
};

struct ListenHandle {
  uint64_t listen_id = 0;
  uint8_t dev = 0;                 // the device the listen was opened on (per-NIC devices: its NIC)
  std::array<uint8_t, kHandleNonceBytes> nonce{};
  std::vector<HandleAddr> addrs;   // 1..kHandleMaxNics, in NIC order

  // Writes the handle into out[0..kNcclHandleBytes).
  void encode(uint8_t* out) const;
  // Reads one; "" or why the bytes are not a handle of this plugin (NCCL passes any bytes).
  static std::string decode(const uint8_t* in, ListenHandle* out);
  // The addresses as Endpoint::add_peer takes them (net/registry.h's publish_address).
  std::vector<std::string> address_strings() const;
};

inline constexpr size_t kHandleEncodedBytes = 4 + 1 + 1 + 2 + 8 + kHandleNonceBytes + 8 * kHandleMaxNics;
static_assert(kHandleEncodedBytes <= kNcclHandleBytes, "the handle must fit NCCL's handle buffer");

}  // namespace r2ccl::nccl
