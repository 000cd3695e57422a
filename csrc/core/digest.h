// Integrity and authentication primitives for the wire protocol: CRC32C for
// corruption detection, SHA-256 / HMAC-SHA256 for peer authentication.
// Pure computation; knows nothing of sockets or JAX.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace r2ccl {

// CRC32C (Castagnoli). crc32c_extend continues a running CRC:
// crc32c(a+b) == crc32c_extend(crc32c(a), b).
uint32_t crc32c(const void* data, size_t len);
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t len);

// SHA-256, streaming.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  std::array<uint8_t, 32> finish();  // valid once; object must not be reused afterwards

 private:
  void compress(const uint8_t* block);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_len_ = 0;  // bytes
};

std::array<uint8_t, 32> sha256(const void* data, size_t len);

// HMAC-SHA256 over the concatenation of `parts` (so callers can MAC several
// fields without copying).
struct ByteSpan {
  const void* data;
  size_t len;
};
std::array<uint8_t, 32> hmac_sha256(const void* key, size_t key_len, const ByteSpan* parts,
                                    size_t n_parts);

// Constant-time comparison of two 32-byte MACs.
bool mac_equal(const std::array<uint8_t, 32>& a, const std::array<uint8_t, 32>& b);

}  // namespace r2ccl
