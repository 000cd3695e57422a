// Encoding and validation of the version-2 wire format (see wire.h).
#include "core/wire.h"

#include <cstring>

#include "core/digest.h"

namespace r2ccl {

// Layout: magic u32 | version u16 | type u8 | flags u8 | payload_len u32 | header_crc u32 |
// seq u64 | msg_id u64 | tag u64 | offset u64 | msg_len u64 | tag_seq u32 | payload_crc u32
void encode_header(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  store_le32(out + 0, kWireMagic);
  out[4] = uint8_t(kWireVersion & 0xff);
  out[5] = uint8_t(kWireVersion >> 8);
  out[6] = static_cast<uint8_t>(h.type);
  out[7] = h.flags;
  store_le32(out + 8, h.payload_len);
  store_le32(out + 12, 0);
  store_le64(out + 16, h.seq);
  store_le64(out + 24, h.msg_id);
  store_le64(out + 32, h.tag);
  store_le64(out + 40, h.offset);
  store_le64(out + 48, h.msg_len);
  store_le32(out + 56, h.tag_seq);
  store_le32(out + 60, h.payload_crc);
  store_le32(out + 12, crc32c(out, kHeaderBytes));
}

std::string decode_header(const uint8_t in[kHeaderBytes], const WireLimits& lim, FrameHeader* h) {
  if (load_le32(in) != kWireMagic) return "bad magic";
  uint16_t version = uint16_t(in[4] | (in[5] << 8));
  if (version != kWireVersion)
    return "unsupported protocol version " + std::to_string(version) + " (this build speaks " +
           std::to_string(kWireVersion) + ")";
  uint8_t copy[kHeaderBytes];
  std::memcpy(copy, in, kHeaderBytes);
  store_le32(copy + 12, 0);
  if (crc32c(copy, kHeaderBytes) != load_le32(in + 12)) return "header checksum mismatch";
  uint8_t type = in[6];
  if (type < 1 || type > kMaxFrameType) return "unknown frame type " + std::to_string(type);
  h->type = static_cast<FrameType>(type);
  h->flags = in[7];
  if (h->flags & ~kKnownFlags) return "unknown flags " + std::to_string(h->flags);
  if ((h->flags & kFlagAbort) && h->type != FrameType::kData) return "abort flag on a non-data frame";
  if ((h->flags & kFlagAbortMismatch) && !(h->flags & kFlagAbort)) return "abort-mismatch flag without the abort flag";
  if ((h->flags & kFlagAckAsk) && h->type != FrameType::kData) return "ack-ask flag on a non-data frame";
  if ((h->flags & kFlagWritten) && (h->type != FrameType::kData || (h->flags & kFlagAbort)))
    return "written flag on a frame other than a data chunk";
  if ((h->flags & kFlagResting) && h->type != FrameType::kHeartbeat && h->type != FrameType::kHeartbeatAck)
    return "resting flag on a frame other than a heartbeat";
  h->payload_len = load_le32(in + 8);
  h->seq = load_le64(in + 16);
  h->msg_id = load_le64(in + 24);
  h->tag = load_le64(in + 32);
  h->offset = load_le64(in + 40);
  h->msg_len = load_le64(in + 48);
  h->tag_seq = load_le32(in + 56);
  h->payload_crc = load_le32(in + 60);
  const uint32_t n = h->payload_len;
  switch (h->type) {
    case FrameType::kHello:
      if (n != kHelloBytes) return "hello of wrong length";
      break;
    case FrameType::kChallenge:
      if (n != kChallengeBytes) return "challenge of wrong length";
      break;
    case FrameType::kAuth:
      if (n != kAuthBytes) return "auth of wrong length";
      break;
    case FrameType::kWelcome:
    case FrameType::kBye:
      if (n != 0) return "non-empty control frame";
      break;
    case FrameType::kHeartbeat:
    case FrameType::kHeartbeatAck:
      if (n != kHeartbeatBytes) return "heartbeat of wrong length";
      break;
    case FrameType::kRailState:
      if (n != kRailStateBytes) return "rail state of wrong length";
      break;
    case FrameType::kAdvert:
      if (n < kAdvertFixedBytes + 4 || n > kAdvertFixedBytes + 4 * kMaxAdvertKeys || (n - kAdvertFixedBytes) % 4 != 0)
        return "advert of wrong length";
      break;
    case FrameType::kAck:
      if (h->seq == 0 || h->seq > kMaxAckRanges || n != h->seq * kAckRangeBytes) return "ack of wrong length";
      break;
    case FrameType::kData:
      if (h->flags & kFlagAbort) {
        if (n != 0) return "abort mark with a payload";
      } else if ((n == 0 && h->msg_len != 0) || n > lim.max_chunk_bytes)
        return "data chunk length " + std::to_string(n) + " out of range";
      if (h->msg_len > lim.max_message_bytes)
        return "message length " + std::to_string(h->msg_len) + " exceeds R2CCL_MAX_MESSAGE_BYTES";
      if (h->offset > h->msg_len || n > h->msg_len - h->offset) return "chunk lies outside its message";
      break;
  }
  return {};
}

void encode_hello(const HelloBody& b, uint8_t out[kHelloBytes]) {
  store_le64(out, b.job_id);
  store_le32(out + 8, b.from_rank);
  store_le32(out + 12, b.to_rank);
  store_le32(out + 16, b.rail);
  store_le32(out + 20, b.epoch);
  std::memcpy(out + 24, b.nonce.data(), kNonceBytes);
}

HelloBody decode_hello(const uint8_t in[kHelloBytes]) {
  HelloBody b;
  b.job_id = load_le64(in);
  b.from_rank = load_le32(in + 8);
  b.to_rank = load_le32(in + 12);
  b.rail = load_le32(in + 16);
  b.epoch = load_le32(in + 20);
  std::memcpy(b.nonce.data(), in + 24, kNonceBytes);
  return b;
}

std::vector<uint8_t> encode_advert(const AdvertBody& a) {
  std::vector<uint8_t> out(kAdvertFixedBytes + 4 * a.keys.size());
  store_le64(out.data(), a.tag);
  store_le32(out.data() + 8, a.tag_seq);
  store_le32(out.data() + 12, static_cast<uint32_t>(a.keys.size()));
  store_le64(out.data() + 16, a.addr);
  store_le64(out.data() + 24, a.len);
  for (size_t i = 0; i < a.keys.size(); i++) store_le32(out.data() + kAdvertFixedBytes + 4 * i, a.keys[i]);
  return out;
}

std::string decode_advert(const std::vector<uint8_t>& body, AdvertBody* a) {
  if (body.size() < kAdvertFixedBytes) return "advert of wrong length";
  const uint32_t n = load_le32(body.data() + 12);
  if (n < 1 || n > kMaxAdvertKeys || body.size() != kAdvertFixedBytes + 4 * size_t{n})
    return "advert naming " + std::to_string(n) + " keys in " + std::to_string(body.size()) + " bytes";
  a->tag = load_le64(body.data());
  a->tag_seq = load_le32(body.data() + 8);
  a->addr = load_le64(body.data() + 16);
  a->len = load_le64(body.data() + 24);
  if (a->addr + a->len < a->addr) return "advert whose memory wraps around";
  a->keys.resize(n);
  for (uint32_t i = 0; i < n; i++) a->keys[i] = load_le32(body.data() + kAdvertFixedBytes + 4 * i);
  return {};
}

}  // namespace r2ccl
