// Tests for the version-1 wire protocol, csrc/core/wire.{h,cc}: round trips of every frame
// type, rejection of each corrupted field, a randomized robustness loop, and the hello body.
// Standalone: exits non-zero and names each failing check.
#include "core/wire.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/digest.h"
#include "check.h"

using namespace r2ccl;

namespace {

uint64_t g_rng = 0x5EED0F31E5ull;
uint64_t rnd() {  // splitmix64: deterministic, so failures reproduce
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();
const WireLimits kLim{1u << 20, 1ull << 30};            // 1 MiB chunks, 1 GiB messages
const WireLimits kLimHuge{kU32Max, kU64Max};            // only the overflow checks remain

using Bytes = std::vector<uint8_t>;  // exactly kHeaderBytes on the heap, so ASan sees over-reads

Bytes encode(const FrameHeader& h) {
  Bytes b(kHeaderBytes);
  encode_header(h, b.data());
  return b;
}

// Recomputes the header CRC after a byte-level edit, so the edit is judged by the field
// checks rather than by the checksum.
void reseal(Bytes& b) {
  store_le32(b.data() + 12, 0);
  store_le32(b.data() + 12, crc32c(b.data(), kHeaderBytes));
}

std::string type_name(FrameType t) {
  switch (t) {
    case FrameType::kHello: return "hello";
    case FrameType::kChallenge: return "challenge";
    case FrameType::kAuth: return "auth";
    case FrameType::kWelcome: return "welcome";
    case FrameType::kData: return "data";
    case FrameType::kAck: return "ack";
    case FrameType::kHeartbeat: return "heartbeat";
    case FrameType::kHeartbeatAck: return "heartbeat_ack";
    case FrameType::kBye: return "bye";
    case FrameType::kRailState: return "rail state";
    case FrameType::kAdvert: return "advert";
  }
  return "type" + std::to_string(static_cast<int>(t));
}

std::string describe(const FrameHeader& h) {
  return type_name(h.type) + "{flags=" + std::to_string(h.flags) + " len=" + std::to_string(h.payload_len) +
         " seq=" + std::to_string(h.seq) + " offset=" + std::to_string(h.offset) +
         " msg_len=" + std::to_string(h.msg_len) + "}";
}

bool same(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.flags == b.flags && a.payload_len == b.payload_len && a.seq == b.seq &&
         a.msg_id == b.msg_id && a.tag == b.tag && a.offset == b.offset && a.msg_len == b.msg_len &&
         a.tag_seq == b.tag_seq && a.payload_crc == b.payload_crc;
}

// The payload length a control frame of this type must carry (data and ack are variable).
uint32_t fixed_len(FrameType t) {
  switch (t) {
    case FrameType::kHello: return kHelloBytes;
    case FrameType::kChallenge: return kChallengeBytes;
    case FrameType::kAuth: return kAuthBytes;
    case FrameType::kHeartbeat:
    case FrameType::kHeartbeatAck: return kHeartbeatBytes;
    case FrameType::kRailState: return kRailStateBytes;
    case FrameType::kAdvert: return kAdvertFixedBytes + 4;   // one key (any count up to kMaxAdvertKeys is valid)
    default: return 0;
  }
}

const FrameType kAllTypes[] = {FrameType::kHello,     FrameType::kChallenge,    FrameType::kAuth,
                               FrameType::kWelcome,   FrameType::kData,         FrameType::kAck,
                               FrameType::kHeartbeat, FrameType::kHeartbeatAck, FrameType::kBye,
                               FrameType::kRailState, FrameType::kAdvert};

// A valid header of type t with representative (or, with random=true, random) fields.
FrameHeader valid_header(FrameType t, bool random) {
  FrameHeader h;
  h.type = t;
  h.flags = random ? uint8_t(rnd() & kFlagPayloadCrc) : kFlagPayloadCrc;
  h.seq = random ? rnd() : 0x0102030405060708ull;
  h.msg_id = random ? rnd() : 0x1112131415161718ull;
  h.tag = random ? rnd() : 0xA1A2A3A4A5A6A7A8ull;
  h.offset = random ? rnd() : 0xFFEEDDCCBBAA9988ull;
  h.msg_len = random ? rnd() : 0x8877665544332211ull;
  h.tag_seq = random ? uint32_t(rnd()) : 0xDEADBEEFu;
  h.payload_crc = random ? uint32_t(rnd()) : 0xCAFEF00Du;
  h.payload_len = fixed_len(t);
  if (t == FrameType::kAck) {
    h.seq = random ? 1 + rnd() % kMaxAckRanges : 3;
    h.payload_len = uint32_t(h.seq * kAckRangeBytes);
  } else if (t == FrameType::kData) {
    h.msg_len = random ? rnd() % (kLim.max_message_bytes + 1) : 10 * 1000 * 1000;
    if (h.msg_len == 0) {
      h.offset = 0;
      h.payload_len = 0;
    } else {
      h.payload_len = uint32_t(1 + rnd() % std::min<uint64_t>(h.msg_len, kLim.max_chunk_bytes));
      h.offset = random ? rnd() % (h.msg_len - h.payload_len + 1) : 4096;
    }
  }
  return h;
}

// ---------------------------------------------------------------------------------------------

void test_layout() {
  // Pin the byte layout documented in wire.cc, so both ends of a mixed-build job agree.
  FrameHeader h = valid_header(FrameType::kData, false);
  const Bytes b = encode(h);
  Bytes want(kHeaderBytes, 0);
  const uint8_t prefix[] = {'R', '2', 'C', 'C', 4, 0, 5, kFlagPayloadCrc};
  std::memcpy(want.data(), prefix, sizeof prefix);
  store_le32(want.data() + 8, h.payload_len);
  store_le64(want.data() + 16, h.seq);
  store_le64(want.data() + 24, h.msg_id);
  store_le64(want.data() + 32, h.tag);
  store_le64(want.data() + 40, h.offset);
  store_le64(want.data() + 48, h.msg_len);
  store_le32(want.data() + 56, h.tag_seq);
  store_le32(want.data() + 60, h.payload_crc);
  store_le32(want.data() + 12, crc32c(want.data(), kHeaderBytes));
  check(b == want, "header byte layout (magic, version, type, flags, LE fields, crc at 12)");
  check(load_le64(b.data() + 16) == 0x0102030405060708ull && b[16] == 0x08 && b[23] == 0x01,
        "header fields are little-endian");
}

void test_round_trip() {
  for (FrameType t : kAllTypes) {
    for (uint8_t flags : {uint8_t(0), kFlagPayloadCrc}) {
      FrameHeader h = valid_header(t, false);
      h.flags = flags;
      const Bytes b = encode(h);
      FrameHeader got;
      got.type = FrameType::kBye;  // garbage in the output, to see every field is written
      got.flags = 0xEE;
      got.payload_len = got.tag_seq = got.payload_crc = 0x55555555u;
      got.seq = got.msg_id = got.tag = got.offset = got.msg_len = 0x5555555555555555ull;
      const std::string err = decode_header(b.data(), kLim, &got);
      check(err.empty(), "round trip " + describe(h) + " rejected: " + err);
      check(same(h, got), "round trip " + describe(h) + " decoded as " + describe(got));
      Bytes again = encode(got);
      check(again == b, "round trip " + describe(h) + " re-encodes to other bytes");
    }
  }
  // Boundary values that are still valid.
  struct Case {
    const char* name;
    FrameHeader h;
    WireLimits lim;
  };
  auto data = [](uint64_t offset, uint32_t n, uint64_t msg_len) {
    FrameHeader h;
    h.type = FrameType::kData;
    h.offset = offset;
    h.payload_len = n;
    h.msg_len = msg_len;
    return h;
  };
  auto ack = [](uint64_t ranges) {
    FrameHeader h;
    h.type = FrameType::kAck;
    h.seq = ranges;
    h.payload_len = uint32_t(ranges * kAckRangeBytes);
    return h;
  };
  const Case ok[] = {
      {"zero-length chunk of a zero-length message", data(0, 0, 0), kLim},
      {"chunk of exactly max_chunk_bytes", data(0, kLim.max_chunk_bytes, kLim.max_chunk_bytes), kLim},
      {"message of exactly max_message_bytes, last chunk",
       data(kLim.max_message_bytes - 7, 7, kLim.max_message_bytes), kLim},
      {"one-byte message", data(0, 1, 1), kLim},
      {"chunk ending at 2^64-1", data(kU64Max - 1, 1, kU64Max), kLimHuge},
      {"chunk of 2^32-1 bytes at the end of a 2^64-1 message", data(kU64Max - kU32Max, kU32Max, kU64Max),
       kLimHuge},
      {"ack with 1 range", ack(1), kLim},
      {"ack with kMaxAckRanges ranges", ack(kMaxAckRanges), kLim},
  };
  for (const auto& c : ok) {
    const Bytes b = encode(c.h);
    FrameHeader got;
    const std::string err = decode_header(b.data(), c.lim, &got);
    check(err.empty(), std::string("valid ") + c.name + " rejected: " + err);
    check(err.empty() && same(c.h, got), std::string("valid ") + c.name + " decoded wrongly");
  }
}

// Expects `b` to be rejected with a message containing `want` (the reason it names).
void expect_reject(const Bytes& b, const WireLimits& lim, const std::string& want, const std::string& what) {
  FrameHeader got;
  const std::string err = decode_header(b.data(), lim, &got);
  if (err.empty()) {
    check(false, what + ": accepted");
    return;
  }
  check(err.find(want) != std::string::npos, what + ": rejected for the wrong reason: \"" + err + "\"");
}

void expect_reject(const FrameHeader& h, const WireLimits& lim, const std::string& want, const std::string& what) {
  expect_reject(encode(h), lim, want, what + " " + describe(h));
}

void test_corrupt_fields() {
  const FrameHeader base = valid_header(FrameType::kData, false);

  // Magic: every byte, resealed so only the magic is wrong.
  for (int i = 0; i < 4; ++i) {
    Bytes b = encode(base);
    b[i] ^= 0x20;
    reseal(b);
    expect_reject(b, kLim, "magic", "magic byte " + std::to_string(i) + " changed");
  }
  {
    Bytes b = encode(base);
    store_le32(b.data(), 0x52324343);  // "CC2R": the big-endian spelling
    reseal(b);
    expect_reject(b, kLim, "magic", "byte-swapped magic");
  }

  // Version: anything but this build's (4), including the ones before it (1: no ack-ask flag;
  // 2: no abort-mismatch or resting flag; 3: no adverts or written chunks).
  for (uint16_t v : {uint16_t(0), uint16_t(1), uint16_t(2), uint16_t(3), uint16_t(5), uint16_t(0x0400), uint16_t(0x0101), uint16_t(0xFFFF)}) {
    Bytes b = encode(base);
    b[4] = uint8_t(v & 0xff);
    b[5] = uint8_t(v >> 8);
    reseal(b);
    expect_reject(b, kLim, "version", "version " + std::to_string(v));
  }

  // Header CRC: each bit of the stored CRC, and a zeroed CRC.
  for (int bit = 0; bit < 32; ++bit) {
    Bytes b = encode(base);
    b[12 + bit / 8] ^= uint8_t(1u << (bit % 8));
    expect_reject(b, kLim, "checksum", "header crc bit " + std::to_string(bit) + " flipped");
  }
  {
    Bytes b = encode(base);
    store_le32(b.data() + 12, 0);
    expect_reject(b, kLim, "checksum", "header crc zeroed");
  }
  // A field edited without resealing: caught by the CRC even though the field itself is valid.
  {
    Bytes b = encode(base);
    store_le64(b.data() + 24, base.msg_id + 1);
    expect_reject(b, kLim, "checksum", "msg_id changed without resealing");
  }

  // Unknown frame types.
  for (int t : {0, 12, 13, 0x7F, 0x80, 0xFF}) {
    FrameHeader h = base;
    h.type = static_cast<FrameType>(t);
    expect_reject(h, kLim, "frame type", "unknown type " + std::to_string(t));
  }

  // Unknown flag bits, on every type.
  for (FrameType t : kAllTypes) {
    for (int f = 1; f < 256; ++f) {
      if ((f & ~kKnownFlags) == 0) continue;
      FrameHeader h = valid_header(t, false);
      h.flags = uint8_t(f);
      expect_reject(h, kLim, "flags", "unknown flags " + std::to_string(f));
    }
  }

  // The abort mark: only on data, only empty; an empty chunk of a non-empty message needs it.
  for (FrameType t : kAllTypes) {
    if (t == FrameType::kData) continue;
    FrameHeader h = valid_header(t, false);
    h.flags = kFlagAbort;
    expect_reject(h, kLim, "abort", "abort flag on type " + std::to_string(static_cast<int>(t)));
    h.flags = kFlagAckAsk;
    expect_reject(h, kLim, "ack-ask", "ack-ask flag on type " + std::to_string(static_cast<int>(t)));
    h.flags = kFlagWritten;
    expect_reject(h, kLim, "written", "written flag on type " + std::to_string(static_cast<int>(t)));
  }
  {
    // A written chunk: valid on data, its payload_len the chunk's while its frame carries none.
    FrameHeader h = valid_header(FrameType::kData, false), got;
    h.flags = kFlagWritten | kFlagPayloadCrc;
    check(decode_header(encode(h).data(), kLim, &got).empty() && got.flags == h.flags &&
              got.payload_len == h.payload_len && link_payload_len(got) == 0,
          "a written data chunk is valid, keeps its length and carries no payload on its link");
    const FrameHeader framed = valid_header(FrameType::kData, false);
    check(link_payload_len(framed) == framed.payload_len, "a data chunk in its frame carries its payload");
    h.flags = kFlagWritten | kFlagAbort;
    h.payload_len = 0;
    h.offset = 0;
    expect_reject(h, kLim, "written", "the written flag on an abort mark");
  }
  {
    // Advert bodies: round trip; key counts and lengths out of range; memory that wraps.
    AdvertBody a, got;
    a.tag = 0x0102030405060708ull;
    a.tag_seq = 9;
    a.addr = 0x7f0000001000ull;
    a.len = 1 << 20;
    a.keys = {0x11, 0, 0x33};
    std::vector<uint8_t> b = encode_advert(a);
    check(b.size() == kAdvertFixedBytes + 12 && decode_advert(b, &got).empty() && got.tag == a.tag &&
              got.tag_seq == a.tag_seq && got.addr == a.addr && got.len == a.len && got.keys == a.keys,
          "advert round trip");
    check(!decode_advert(std::vector<uint8_t>(b.begin(), b.end() - 1), &got).empty(), "advert one byte short");
    std::vector<uint8_t> c = b;
    store_le32(c.data() + 12, 4);
    check(!decode_advert(c, &got).empty(), "advert naming more keys than it holds");
    store_le32(c.data() + 12, 0);
    check(!decode_advert(std::vector<uint8_t>(c.begin(), c.begin() + kAdvertFixedBytes), &got).empty(),
          "advert with no key");
    a.keys.assign(kMaxAdvertKeys + 1, 1);
    check(!decode_advert(encode_advert(a), &got).empty(), "advert with more than kMaxAdvertKeys keys");
    a.keys = {1};
    a.addr = ~0ull - 10;
    a.len = 100;
    check(!decode_advert(encode_advert(a), &got).empty(), "advert whose memory wraps around");
    FrameHeader h = valid_header(FrameType::kAdvert, false);
    for (uint32_t n : {uint32_t(0), uint32_t(kAdvertFixedBytes), uint32_t(kAdvertFixedBytes + 6),
                       uint32_t(kAdvertFixedBytes + 4 * kMaxAdvertKeys + 4)}) {
      h.payload_len = n;
      expect_reject(h, kLim, "advert", "advert frame of " + std::to_string(n) + " bytes");
    }
  }
  {
    FrameHeader h = valid_header(FrameType::kData, false), got;
    h.flags = kFlagAckAsk | kFlagPayloadCrc;
    check(decode_header(encode(h).data(), kLim, &got).empty() && got.flags == h.flags,
          "a data chunk that asks for its ack is valid and keeps the flag");
  }
  {
    FrameHeader h = valid_header(FrameType::kData, false);
    h.flags = kFlagAbort;
    h.offset = 0;
    h.msg_len = 1000;
    h.payload_len = 0;
    FrameHeader got;
    check(decode_header(encode(h).data(), kLim, &got).empty(), "abort mark of a non-empty message is valid");
    h.flags = kFlagAbort | kFlagAbortMismatch;
    check(decode_header(encode(h).data(), kLim, &got).empty() && got.flags == h.flags,
          "an abort mark that names a mismatch is valid and keeps both flags");
    h.flags = kFlagAbortMismatch;
    expect_reject(h, kLim, "abort-mismatch", "the abort-mismatch flag without the abort flag");
    h.flags = kFlagResting;
    expect_reject(h, kLim, "resting", "the resting flag on a data frame");
    for (FrameType t : {FrameType::kHeartbeat, FrameType::kHeartbeatAck}) {
      FrameHeader hb = valid_header(t, false);
      hb.flags = kFlagResting;
      check(decode_header(encode(hb).data(), kLim, &got).empty() && got.flags == kFlagResting,
            "a heartbeat (or echo) at rest is valid and keeps the flag");
    }
    FrameHeader ack = valid_header(FrameType::kAck, false);
    ack.flags = kFlagResting;
    expect_reject(ack, kLim, "resting", "the resting flag on an ack");
    h.flags = kFlagAbort;
    h.payload_len = 10;
    expect_reject(h, kLim, "abort", "abort mark with a payload");
  }

  // Fixed-length types with the wrong payload length.
  for (FrameType t : kAllTypes) {
    if (t == FrameType::kData || t == FrameType::kAck || t == FrameType::kAdvert) continue;   // (advert: above)
    const uint32_t good = fixed_len(t);
    const std::string reason = (t == FrameType::kWelcome || t == FrameType::kBye)        ? "control"
                               : (t == FrameType::kHeartbeatAck)                       ? "heartbeat"
                                                                                       : type_name(t);
    std::vector<uint32_t> wrong = {good + 1, good * 2 + 1, 16, 64, 1u << 20, kU32Max, kU32Max - good + 1};
    if (good > 0) {
      wrong.push_back(good - 1);
      wrong.push_back(0);
    }
    for (uint32_t n : wrong) {
      if (n == good) continue;
      FrameHeader h = valid_header(t, false);
      h.payload_len = n;
      expect_reject(h, kLim, reason, "wrong payload length");
    }
  }

  // Ack: range count and length must agree, 1..kMaxAckRanges ranges of 16 bytes each.
  struct AckCase {
    uint64_t ranges;
    uint32_t n;
    const char* what;
  };
  const AckCase acks[] = {
      {0, 0, "0 ranges, empty"},
      {0, 16, "0 ranges, one range of payload"},
      {kMaxAckRanges + 1, uint32_t((kMaxAckRanges + 1) * kAckRangeBytes), "too many ranges"},
      {kMaxAckRanges * 4, uint32_t(kMaxAckRanges * 4 * kAckRangeBytes), "far too many ranges"},
      {uint64_t(1) << 60, 0, "2^60 ranges (count * 16 wraps to 0 in 64 bits)"},
      {uint64_t(1) << 28, 0, "2^28 ranges (count * 16 wraps to 0 in 32 bits)"},
      {kU64Max, kU32Max, "2^64-1 ranges"},
      {2, 33, "length not a multiple of 16 (33)"},
      {2, 31, "length not a multiple of 16 (31)"},
      {1, 8, "length not a multiple of 16 (8)"},
      {1, 0, "1 range, empty payload"},
      {2, 16, "count and length disagree (2 vs 1)"},
      {1, 32, "count and length disagree (1 vs 2)"},
      {3, 64, "count and length disagree (3 vs 4)"},
  };
  for (const auto& a : acks) {
    FrameHeader h = valid_header(FrameType::kAck, false);
    h.seq = a.ranges;
    h.payload_len = a.n;
    expect_reject(h, kLim, "ack", std::string("ack ") + a.what);
  }

  // Data chunks.
  auto data = [](uint64_t offset, uint32_t n, uint64_t msg_len) {
    FrameHeader h = valid_header(FrameType::kData, false);
    h.offset = offset;
    h.payload_len = n;
    h.msg_len = msg_len;
    return h;
  };
  const uint32_t max_chunk = uint32_t(kLim.max_chunk_bytes);
  const uint64_t max_msg = kLim.max_message_bytes;
  expect_reject(data(0, max_chunk + 1, max_msg), kLim, "chunk length", "chunk one byte over the limit");
  expect_reject(data(0, kU32Max, max_msg), kLim, "chunk length", "chunk of 2^32-1 bytes");
  expect_reject(data(0, 0, 1), kLim, "chunk length", "zero-length chunk of a 1-byte message");
  expect_reject(data(4096, 0, max_msg), kLim, "chunk length", "zero-length chunk of a non-empty message");
  expect_reject(data(0, 1, max_msg + 1), kLim, "message length", "msg_len one over max_message_bytes");
  expect_reject(data(0, 1, kU64Max), kLim, "message length", "msg_len 2^64-1");
  expect_reject(data(0, 0, max_msg + 1), kLim, "", "empty chunk of a message over the limit");
  // Outside the message, including values where offset + len overflows.
  struct Outside {
    uint64_t offset;
    uint32_t n;
    uint64_t msg_len;
    WireLimits lim;
    const char* what;
  };
  const Outside outs[] = {
      {0, 2, 1, kLim, "chunk longer than its message"},
      {1, 1, 1, kLim, "offset == msg_len, non-empty chunk"},
      {2, 1, 1, kLim, "offset past msg_len"},
      {1, 0, 0, kLim, "offset 1 in an empty message"},
      {max_msg - 100, 101, max_msg, kLim, "last chunk one byte too long"},
      {kU64Max, 1, 100, kLim, "offset 2^64-1, 1 byte (offset+len wraps to 0)"},
      {kU64Max, 1, max_msg, kLim, "offset 2^64-1 in a max-size message"},
      {kU64Max - 15, 32, 16, kLim, "offset 2^64-16, 32 bytes (wraps to 16)"},
      {kU64Max - 100, max_chunk, max_msg, kLim, "offset near 2^64, max chunk"},
      {kU64Max, 1, kU64Max, kLimHuge, "offset 2^64-1 of a 2^64-1 message"},
      {kU64Max, kU32Max, kU64Max, kLimHuge, "offset 2^64-1, 2^32-1 bytes, 2^64-1 message"},
      {kU64Max - kU32Max + 1, kU32Max, kU64Max, kLimHuge, "chunk one byte past 2^64-1"},
      {1ull << 63, 1u << 31, (1ull << 63) + (1u << 30), kLimHuge, "offset 2^63, past the end"},
  };
  for (const auto& o : outs) {
    expect_reject(data(o.offset, o.n, o.msg_len), o.lim, "outside", std::string("data ") + o.what);
  }
}

// A random 64-byte header, or a valid one given random fields: decode must never crash, and
// anything it accepts must satisfy the protocol's invariants and re-encode to the same bytes.
void check_accepted_invariants(const Bytes& b, const FrameHeader& h, const WireLimits& lim, const char* what) {
  const int t = static_cast<int>(h.type);
  bool ok = t >= 1 && t <= 10 && (h.flags & ~kKnownFlags) == 0 &&
            (!(h.flags & kFlagAbort) || h.type == FrameType::kData) &&
            (!(h.flags & kFlagAbortMismatch) || (h.flags & kFlagAbort)) &&
            (!(h.flags & kFlagAckAsk) || h.type == FrameType::kData) &&
            (!(h.flags & kFlagResting) || h.type == FrameType::kHeartbeat || h.type == FrameType::kHeartbeatAck);
  switch (h.type) {
    case FrameType::kData:
      ok = ok && h.payload_len <= lim.max_chunk_bytes && h.msg_len <= lim.max_message_bytes &&
           h.offset <= h.msg_len && h.payload_len <= h.msg_len - h.offset &&
           ((h.flags & kFlagAbort) ? h.payload_len == 0 : (h.payload_len > 0 || h.msg_len == 0));
      break;
    case FrameType::kAck:
      ok = ok && h.seq >= 1 && h.seq <= kMaxAckRanges && h.payload_len == h.seq * kAckRangeBytes;
      break;
    default:
      ok = ok && h.payload_len == fixed_len(h.type);
  }
  check(ok, std::string(what) + ": accepted a header that breaks an invariant: " + describe(h));
  check(encode(h) == b, std::string(what) + ": accepted header re-encodes to other bytes");
}

void test_robustness() {
  constexpr int kIters = 200000;
  FrameHeader h;
  int accepted = 0;
  // Fully random bytes: almost all fail on the magic.
  for (int i = 0; i < kIters; ++i) {
    Bytes b(kHeaderBytes);
    for (size_t j = 0; j < kHeaderBytes; j += 8) store_le64(b.data() + j, rnd());
    if (decode_header(b.data(), kLim, &h).empty()) check_accepted_invariants(b, h, kLim, "random bytes");
  }
  // Random bytes behind a valid magic, version and CRC, with a plausible type and flags half the
  // time: this reaches the per-type checks with arbitrary lengths and offsets.
  for (int i = 0; i < kIters; ++i) {
    Bytes b(kHeaderBytes);
    for (size_t j = 0; j < kHeaderBytes; j += 8) store_le64(b.data() + j, rnd());
    store_le32(b.data(), kWireMagic);
    b[4] = uint8_t(kWireVersion & 0xff);
    b[5] = uint8_t(kWireVersion >> 8);
    if (rnd() & 1) {
      b[6] = uint8_t(1 + rnd() % 9);
      b[7] &= kFlagPayloadCrc;
      const uint64_t r = rnd();
      if (r % 4 == 0) store_le32(b.data() + 8, uint32_t(rnd() % 80));
      if (b[6] == uint8_t(FrameType::kAck) && r % 3 == 0) store_le64(b.data() + 16, rnd() % (kMaxAckRanges + 2));
      if (b[6] == uint8_t(FrameType::kData) && r % 5 == 0) {
        store_le64(b.data() + 48, rnd() % (kLim.max_message_bytes + 2));
        store_le64(b.data() + 40, rnd() % (load_le64(b.data() + 48) + 2));
      }
    }
    reseal(b);
    const WireLimits& lim = (i & 1) ? kLim : kLimHuge;
    if (decode_header(b.data(), lim, &h).empty()) {
      ++accepted;
      check_accepted_invariants(b, h, lim, "random fields");
    }
  }
  check(accepted > 0, "random fields: no header was ever accepted (the generator is too weak)");
  std::printf("robustness: %d random headers, %d random-field headers (%d accepted), ", kIters, kIters, accepted);

  // Single-bit flips of valid headers of every type: the CRC covers all 512 bits, so each must
  // be rejected.
  int flip_failures = 0;
  for (int i = 0; i < kIters; ++i) {
    const FrameType t = kAllTypes[rnd() % 9];
    const FrameHeader v = valid_header(t, true);
    Bytes b = encode(v);
    FrameHeader got;
    const std::string before = decode_header(b.data(), kLim, &got);
    if (!before.empty()) {
      check(false, "generated header " + describe(v) + " rejected: " + before);
      continue;
    }
    const unsigned bit = unsigned(rnd() % (kHeaderBytes * 8));
    b[bit / 8] ^= uint8_t(1u << (bit % 8));
    if (decode_header(b.data(), kLim, &got).empty()) {
      if (++flip_failures <= 10)
        check(false, "bit " + std::to_string(bit) + " flipped in " + describe(v) + " was accepted");
    }
  }
  check(flip_failures == 0, std::to_string(flip_failures) + " single-bit flips accepted");
  std::printf("%d single-bit flips\n", kIters);
  std::fflush(stdout);
  // And exhaustively, every bit of one header of each type.
  for (FrameType t : kAllTypes) {
    const Bytes good = encode(valid_header(t, false));
    for (unsigned bit = 0; bit < kHeaderBytes * 8; ++bit) {
      Bytes b = good;
      b[bit / 8] ^= uint8_t(1u << (bit % 8));
      FrameHeader got;
      if (decode_header(b.data(), kLim, &got).empty())
        check(false, "exhaustive flip of bit " + std::to_string(bit) + " in " + type_name(t) + " accepted");
    }
  }
}

void test_hello() {
  HelloBody h{};
  h.job_id = 0x0123456789ABCDEFull;
  h.from_rank = 3;
  h.to_rank = 0x7FFFFFFFu;
  h.rail = 2;
  h.epoch = 0xFEDCBA98u;
  for (size_t i = 0; i < kNonceBytes; ++i) h.nonce[i] = uint8_t(0xA0 + i);
  Bytes b(kHelloBytes);
  encode_hello(h, b.data());
  check(b.size() == 56, "hello body is 56 bytes");
  check(b[0] == 0xEF && b[7] == 0x01, "hello job_id little-endian at 0");
  check(load_le32(b.data() + 8) == 3 && load_le32(b.data() + 12) == 0x7FFFFFFFu &&
            load_le32(b.data() + 16) == 2 && load_le32(b.data() + 20) == 0xFEDCBA98u,
        "hello ranks, rail, epoch at 8/12/16/20");
  check(std::memcmp(b.data() + 24, h.nonce.data(), kNonceBytes) == 0, "hello nonce at 24");
  const HelloBody got = decode_hello(b.data());
  check(got.job_id == h.job_id && got.from_rank == h.from_rank && got.to_rank == h.to_rank &&
            got.rail == h.rail && got.epoch == h.epoch && got.nonce == h.nonce,
        "hello round trip");
  for (int rep = 0; rep < 1000; ++rep) {
    HelloBody r{};
    r.job_id = rnd();
    r.from_rank = uint32_t(rnd());
    r.to_rank = uint32_t(rnd());
    r.rail = uint32_t(rnd());
    r.epoch = uint32_t(rnd());
    for (auto& x : r.nonce) x = uint8_t(rnd());
    Bytes rb(kHelloBytes);
    encode_hello(r, rb.data());
    const HelloBody g = decode_hello(rb.data());
    if (!(g.job_id == r.job_id && g.from_rank == r.from_rank && g.to_rank == r.to_rank && g.rail == r.rail &&
          g.epoch == r.epoch && g.nonce == r.nonce))
      check(false, "random hello round trip #" + std::to_string(rep));
    Bytes again(kHelloBytes);
    encode_hello(g, again.data());
    if (again != rb) check(false, "random hello re-encodes to other bytes #" + std::to_string(rep));
  }
}

}  // namespace

int main() {
  test_layout();
  test_round_trip();
  test_corrupt_fields();
  test_robustness();
  test_hello();
  return checks_passed("test_wire");
}
