#include "net/ibverbs/boot_record.h"

#include <cstring>

namespace r2ccl::verbs {

void encode_boot(const BootRecord& r, uint8_t out[kBootBytes]) {
  std::memset(out, 0, kBootBytes);
  put32(out, kBootMagic);
  put16(out + 4, kBootVersion);
  put32(out + 8, r.qpn);
  put32(out + 12, r.psn);
  put16(out + 16, r.lid);
  std::memcpy(out + 20, r.gid, 16);
  put32(out + 36, r.mtu);
  put32(out + 40, r.credits);
  put32(out + 44, r.capacity);
  put32(out + 48, r.header_bytes);
  put32(out + 52, r.reject);
}

std::string decode_boot(const uint8_t in[kBootBytes], BootRecord* r) {
  if (get32(in) != kBootMagic)
    return "the peer's setup record is not a jax_r2ccl verbs record (a socket-transport peer?)";
  const uint16_t version = get16(in + 4);
  if (version != kBootVersion)
    return "the peer's verbs setup is version " + std::to_string(version) + ", ours " + std::to_string(kBootVersion);
  r->qpn = get32(in + 8);
  r->psn = get32(in + 12);
  r->lid = get16(in + 16);
  std::memcpy(r->gid, in + 20, 16);
  r->mtu = get32(in + 36);
  r->credits = get32(in + 40);
  r->capacity = get32(in + 44);
  r->header_bytes = get32(in + 48);
  r->reject = get32(in + 52);
  if (r->mtu < kBootMtuMin || r->mtu > kBootMtuMax) return "the peer's setup record names no valid MTU";
  if (r->credits < 1 || r->credits > kBootMaxCredits || r->capacity < r->header_bytes || r->capacity > kBootMaxCapacity)
    return "the peer's setup record offers impossible buffers";
  return "";
}

}  // namespace r2ccl::verbs
