// The plugin's listen handle (nccl/handle.h): its fixed layout, written and checked.
#include "nccl/handle.h"

#include <arpa/inet.h>

#include <cstring>

#include "net/registry.h"

namespace r2ccl::nccl {

namespace {
void put16(uint8_t* p, uint16_t v) { p[0] = static_cast<uint8_t>(v); p[1] = static_cast<uint8_t>(v >> 8); }
void put32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = static_cast<uint8_t>(v >> (8 * i)); }
void put64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i)); }
uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get32(const uint8_t* p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
uint64_t get64(const uint8_t* p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }
}  // namespace

// Layout: magic u32, version u8, NIC count u8, device u8, reserved u8, listen id u64, nonce[32], then per
// NIC (kHandleMaxNics slots): IPv4 (network order) u32, port u16, transport u8 (the registry's wire_id:
// 0 socket, 1 ibverbs), pad u8.
void ListenHandle::encode(uint8_t* out) const {
  std::memset(out, 0, kNcclHandleBytes);
  put32(out, kHandleMagic);
  out[4] = kHandleVersion;
  out[5] = static_cast<uint8_t>(addrs.size());
  out[6] = dev;
  put64(out + 8, listen_id);
  std::memcpy(out + 16, nonce.data(), kHandleNonceBytes);
  uint8_t* p = out + 16 + kHandleNonceBytes;
  for (const HandleAddr& a : addrs) {
    std::memcpy(p, &a.ipv4, 4);
    put16(p + 4, a.port);
    p[6] = a.transport;
    p += 8;
  }
}

std::string ListenHandle::decode(const uint8_t* in, ListenHandle* out) {
  if (get32(in) != kHandleMagic) return "not a handle of the r2ccl net plugin (another plugin's listen?)";
  if (in[4] != kHandleVersion)
    return "a handle of r2ccl net plugin version " + std::to_string(in[4]) + ", this is version " +
           std::to_string(kHandleVersion) + " (every process must load the same plugin)";
  const size_t n = in[5];
  if (n < 1 || n > kHandleMaxNics) return "a handle naming " + std::to_string(n) + " NICs";
  if (in[6] >= kHandleMaxNics) return "a handle naming device " + std::to_string(in[6]);
  out->dev = in[6];
  out->listen_id = get64(in + 8);
  std::memcpy(out->nonce.data(), in + 16, kHandleNonceBytes);
  out->addrs.clear();
  const uint8_t* p = in + 16 + kHandleNonceBytes;
  for (size_t i = 0; i < n; i++, p += 8) {
    HandleAddr a;
    std::memcpy(&a.ipv4, p, 4);
    a.port = get16(p + 4);
    if (a.port == 0) return "a handle with a malformed address";
    if (!backend_with_wire_id(p[6]))
      return "a handle naming transport " + std::to_string(p[6]) + ", which this build does not have";
    a.transport = p[6];
    out->addrs.push_back(a);
  }
  return {};
}

std::vector<std::string> ListenHandle::address_strings() const {
  std::vector<std::string> out;
  for (const HandleAddr& a : addrs) {
    NetAddr na;
    na.sa.sin_family = AF_INET;
    na.sa.sin_addr.s_addr = a.ipv4;
    na.sa.sin_port = htons(a.port);
    out.push_back(publish_address(*backend_with_wire_id(a.transport), na));
  }
  return out;
}

}  // namespace r2ccl::nccl
