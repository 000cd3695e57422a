// The wire protocol, version 1: a fixed 64-byte little-endian header before every payload,
// and the handshake bodies. Everything read from the network is parsed here, defensively:
// a frame that fails any check is rejected with a sentence saying which field was wrong.
// Knows nothing of sockets, collectives or JAX.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace r2ccl {

constexpr uint32_t kWireMagic = 0x43433252;  // "R2CC" on the wire
constexpr uint16_t kWireVersion = 4;   // 2: kFlagAckAsk; 3: kFlagAbortMismatch, kFlagResting; 4: kAdvert, kFlagWritten
constexpr size_t kHeaderBytes = 64;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;

enum class FrameType : uint8_t {
  kHello = 1,         // connector -> acceptor: who I am, which rail, my nonce
  kChallenge = 2,     // acceptor -> connector: its nonce and its proof of the secret
  kAuth = 3,          // connector -> acceptor: my proof of the secret
  kWelcome = 4,       // acceptor -> connector: rail admitted
  kData = 5,          // one chunk of one message
  kAck = 6,           // ranges of chunk sequence numbers received and applied
  kHeartbeat = 7,     // idle-rail liveness probe
  kHeartbeatAck = 8,  // its echo
  kBye = 9,           // the endpoint is closing on purpose
  kRailState = 10,    // the sender's end of a rail lost (or regained) its link: fail it now
  kAdvert = 11,       // receiver -> sender: a posted receive's memory, writable by one-sided writes
};
constexpr uint8_t kMaxFrameType = 11;
constexpr uint8_t kFlagPayloadCrc = 1;
constexpr uint8_t kFlagAbort = 2;   // data, empty: the sender abandoned this message (send cancelled)
constexpr uint8_t kFlagEager = 4;   // data: an eager send (complete at the sender): its ack may wait
// data: the sender asks for this chunk's ack at the end of the receiver's read pass (its
// window is half full, the message ends here, or it is a resend). Other chunks are acked
// once read_pass_bytes of them wait, or at the tick.
constexpr uint8_t kFlagAckAsk = 8;
// data, with kFlagAbort: the sender abandoned it because its collective did not match (the
// receiver fails its receive with kMismatch, not kTimeout: a bystander of a mismatch names it).
constexpr uint8_t kFlagAbortMismatch = 16;
// heartbeat and its echo: the sender's connection is at rest and beats every
// R2CCL_REST_HEARTBEAT_MS from now on (its peer waits that much longer before calling it silent)
constexpr uint8_t kFlagResting = 32;
// data: the chunk's payload was written by a one-sided write into the receive the receiver
// advertised (kAdvert), at the chunk's offset, before this header (the link orders the two);
// the frame carries none (link_payload_len). payload_len is the chunk's length.
constexpr uint8_t kFlagWritten = 64;
constexpr uint8_t kKnownFlags =
    kFlagPayloadCrc | kFlagAbort | kFlagEager | kFlagAckAsk | kFlagAbortMismatch | kFlagResting | kFlagWritten;

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint8_t flags = 0;
  uint32_t payload_len = 0;
  uint64_t seq = 0;       // data: chunk sequence number; ack: number of ranges
  uint64_t msg_id = 0;    // data: message number on this channel and direction
  uint64_t tag = 0;       // data: user tag of the message
  uint64_t offset = 0;    // data: byte offset of this chunk in the message
  uint64_t msg_len = 0;   // data: total message bytes
  uint32_t tag_seq = 0;   // data: k-th message with this tag (matching key with tag)
  uint32_t payload_crc = 0;
};

// The payload bytes a frame carries on its link: a written chunk's are already in place.
inline uint32_t link_payload_len(const FrameHeader& h) {
  return h.type == FrameType::kData && (h.flags & kFlagWritten) ? 0 : h.payload_len;
}

// Limits a receiver enforces before it trusts a header's lengths.
struct WireLimits {
  uint64_t max_chunk_bytes;
  uint64_t max_message_bytes;
};

void encode_header(const FrameHeader& h, uint8_t out[kHeaderBytes]);
// Returns an empty string and fills `h` when the header is valid, else says what is wrong.
std::string decode_header(const uint8_t in[kHeaderBytes], const WireLimits& lim, FrameHeader* h);

// Handshake bodies (fixed sizes, validated by length before use).
struct HelloBody {
  uint64_t job_id;      // which job (hash of the secret's public id), rejects cross-job dials
  uint32_t from_rank, to_rank, rail, epoch;
  std::array<uint8_t, kNonceBytes> nonce;
};
constexpr size_t kHelloBytes = 8 + 16 + kNonceBytes;
void encode_hello(const HelloBody& b, uint8_t out[kHelloBytes]);
HelloBody decode_hello(const uint8_t in[kHelloBytes]);

constexpr size_t kChallengeBytes = kNonceBytes + kMacBytes;
constexpr size_t kAuthBytes = kMacBytes;
constexpr size_t kHeartbeatBytes = 16;   // sender clock (ns), echoed clock (ns)
constexpr size_t kAckRangeBytes = 16;    // [first, last+1) of chunk sequence numbers
constexpr size_t kRailStateBytes = 8;    // rail index (u32), link up (u32: 0 or 1)
constexpr size_t kMaxAckRanges = 1024;

// An advert (kAdvert body): tag u64 | tag_seq u32 | key count u32 | addr u64 | len u64, then one
// remote key u32 per NIC of the receiver (by its NIC index; 0: not writable through that NIC).
// The sender may write [addr, addr + len) of the receiver's memory through those keys, for the
// message (tag, tag_seq) only, and only until it is complete.
struct AdvertBody {
  uint64_t tag = 0;
  uint32_t tag_seq = 0;
  uint64_t addr = 0, len = 0;
  std::vector<uint32_t> keys;
};
constexpr size_t kAdvertFixedBytes = 32;
constexpr size_t kMaxAdvertKeys = 64;
std::vector<uint8_t> encode_advert(const AdvertBody& a);
// "" and `a` filled, or what is wrong with the body.
std::string decode_advert(const std::vector<uint8_t>& body, AdvertBody* a);

inline void store_le64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = uint8_t(v >> (8 * i)); }
inline void store_le32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = uint8_t(v >> (8 * i)); }
inline uint64_t load_le64(const uint8_t* p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }
inline uint32_t load_le32(const uint8_t* p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }

}  // namespace r2ccl
