// The verbs link's setup record: 64 bytes each way on the TCP bootstrap socket (queue pair
// number, PSN, LID, GID, MTU and the receive buffers offered). It is read before the peer
// has proven anything, so decoding checks every field a later step sizes or indexes by.
// Pure: no <infiniband/verbs.h> here (the fuzz harness builds without rdma-core).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace r2ccl::verbs {

// Little-endian fields (the record's, and the 8-byte prefix of every verbs message).
inline void put16(uint8_t* p, uint16_t v) { p[0] = v & 0xff, p[1] = static_cast<uint8_t>(v >> 8); }
inline void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t get32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

inline constexpr uint32_t kBootMagic = 0x42563252;   // "R2VB"
inline constexpr uint16_t kBootVersion = 1;
inline constexpr size_t kBootBytes = 64;
inline constexpr uint32_t kBootMtuMin = 1, kBootMtuMax = 5;   // enum ibv_mtu: 256 .. 4096 bytes
inline constexpr uint32_t kBootMaxCredits = 4096;
inline constexpr uint32_t kBootMaxCapacity = 1u << 25;

struct BootRecord {
  uint32_t qpn = 0, psn = 0;
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint32_t mtu = 0;            // enum ibv_mtu of the port
  uint32_t credits = 0;        // data receive buffers offered
  uint32_t capacity = 0;       // bytes after the prefix one receive buffer holds
  uint32_t header_bytes = 0;
  uint32_t reject = 0;         // 0: accepted; else why not (kReject*)
};
enum : uint32_t { kRejectNone = 0, kRejectHeader = 1, kRejectQp = 2 };

void encode_boot(const BootRecord& r, uint8_t out[kBootBytes]);
// "" when well formed (then `r` holds it), else what is wrong (the peer is not a verbs link
// of this version, or offers buffers no link could have).
std::string decode_boot(const uint8_t in[kBootBytes], BootRecord* r);

}  // namespace r2ccl::verbs
