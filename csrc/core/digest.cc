// Integrity and authentication primitives for the wire protocol (CRC32C,
// SHA-256, HMAC-SHA256). Portable C++17 with an SSE4.2 fast path for CRC32C.
#include "core/digest.h"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define R2CCL_CRC_X86 1
#endif

namespace r2ccl {

// ---------------------------------------------------------------------------
// CRC32C
// ---------------------------------------------------------------------------
namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

// T[k][b] is the CRC contribution of byte b followed by k zero bytes, which
// lets slicing-by-8 fold eight input bytes with independent lookups.
constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int j = 0; j < 8; ++j) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPoly : 0u);
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  return t;
}

// Constant-initialised at compile time, so no init-order or threading concerns.
constexpr CrcTables kCrcTables = make_crc_tables();

inline uint32_t load_le32(const uint8_t* p) {
  // Byte-wise assembly is endian-independent; compilers fold it into one load.
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// Operates on the raw (non-inverted) register value.
uint32_t crc32c_sw_raw(uint32_t crc, const uint8_t* p, size_t len) {
  const auto& t = kCrcTables;
  while (len >= 8) {
    const uint32_t lo = crc ^ load_le32(p);
    const uint32_t hi = load_le32(p + 4);
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#ifdef R2CCL_CRC_X86
__attribute__((target("sse4.2"))) uint32_t crc32c_hw_raw(uint32_t crc, const uint8_t* p,
                                                         size_t len) {
  uint64_t c = crc;
  while (len >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // unaligned-safe; x86 is little-endian as the CRC expects
    c = _mm_crc32_u64(c, v);
    p += 8;
    len -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (len--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool have_sse42() {
#ifdef __SSE4_2__
  return true;
#else
  static const bool ok = __builtin_cpu_supports("sse4.2");
  return ok;
#endif
}
#endif

}  // namespace

// Table-driven path, exported (non-static) so tests can cross-check the
// hardware path against it.
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t len) {
  return ~crc32c_sw_raw(~crc, static_cast<const uint8_t*>(data), len);
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t len) {
#ifdef R2CCL_CRC_X86
  if (have_sse42()) return ~crc32c_hw_raw(~crc, static_cast<const uint8_t*>(data), len);
#endif
  return crc32c_portable(crc, data, len);
}

uint32_t crc32c(const void* data, size_t len) { return crc32c_extend(0, data, len); }

// ---------------------------------------------------------------------------
// SHA-256 (FIPS 180-4)
// ---------------------------------------------------------------------------
namespace {

constexpr uint32_t kSha256K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
         0x5be0cd19},
      buf_{} {}

void Sha256::compress(const uint8_t* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) w[i] = load_be32(block + 4 * i);
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kSha256K[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d;
  h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
}

void Sha256::update(const void* data, size_t len) {
  if (len == 0) return;  // data may be null; memcpy(dst, nullptr, 0) is still UB
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_len_ += len;
  if (buf_len_ > 0) {
    const size_t take = len < 64 - buf_len_ ? len : 64 - buf_len_;
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    len -= take;
    if (buf_len_ < 64) return;
    compress(buf_);
    buf_len_ = 0;
  }
  for (; len >= 64; p += 64, len -= 64) compress(p);
  if (len > 0) {
    std::memcpy(buf_, p, len);
    buf_len_ = len;
  }
}

std::array<uint8_t, 32> Sha256::finish() {
  const uint64_t bit_len = total_len_ * 8;
  uint8_t pad[72] = {0x80};
  // Pad so that the 8-byte length ends exactly on a block boundary.
  const size_t zeros = (buf_len_ < 56 ? 56 : 120) - buf_len_;
  for (int i = 0; i < 8; ++i) pad[zeros + i] = static_cast<uint8_t>(bit_len >> (56 - 8 * i));
  update(pad, zeros + 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
  return out;
}

std::array<uint8_t, 32> sha256(const void* data, size_t len) {
  Sha256 s;
  s.update(data, len);
  return s.finish();
}

// ---------------------------------------------------------------------------
// HMAC-SHA256 (RFC 2104)
// ---------------------------------------------------------------------------
std::array<uint8_t, 32> hmac_sha256(const void* key, size_t key_len, const ByteSpan* parts,
                                    size_t n_parts) {
  constexpr size_t kBlock = 64;
  uint8_t k0[kBlock] = {};
  if (key_len > kBlock) {
    const auto kh = sha256(key, key_len);
    std::memcpy(k0, kh.data(), kh.size());
  } else if (key_len > 0) {
    std::memcpy(k0, key, key_len);
  }
  uint8_t pad[kBlock];
  for (size_t i = 0; i < kBlock; ++i) pad[i] = k0[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad, kBlock);
  for (size_t i = 0; i < n_parts; ++i) inner.update(parts[i].data, parts[i].len);
  const auto inner_digest = inner.finish();

  for (size_t i = 0; i < kBlock; ++i) pad[i] = k0[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad, kBlock);
  outer.update(inner_digest.data(), inner_digest.size());
  return outer.finish();
}

bool mac_equal(const std::array<uint8_t, 32>& a, const std::array<uint8_t, 32>& b) {
  // Accumulate every difference with no early exit so timing does not reveal
  // the length of the matching prefix; volatile keeps the optimiser honest.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace r2ccl
