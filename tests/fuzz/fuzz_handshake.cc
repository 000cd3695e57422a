// libFuzzer harness: the job-secret handshake, both sides (core/handshake.h), driven frame
// by frame the way the engine drives it: each header through decode_header, then the side's
// on_header, then its payload. The input plays the stranger. Sometimes it is given the
// right proof (the harness computes it, as a peer holding the secret would), so the paths
// past each check are reached too. Properties: the acceptor admits only a connector that
// sent the right auth for its own challenge; the connector goes up only after the listener
// proved the secret.
//
// Inputs whose first byte is 0x81 or 0x80 are captured handshakes (capture_corpus.py): the
// bytes one side received from a real peer holding kSecret, read as a stream of frames:
//   0x81 | job id (8) | rank (1) | world (1) | the acceptor's nonce (32) | hello, auth
//   0x80 | the connector's hello body (56) | challenge, welcome
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/handshake.h"
#include "fuzz_check.h"

using namespace r2ccl;

namespace {

// The secret of the capture jobs (capture_corpus.py's SECRET, hex there).
const std::string kSecret = "secret-of-the-fusecret-of-the-fu";
constexpr uint64_t kJob = 0x6a6f622d69642d31ull;
const WireLimits kLimits{1u << 20, 1u << 30};

// One frame from the input: mostly well formed (a valid header of a chosen type, its payload
// from the input, `forced` if given), sometimes raw header bytes.
bool next_frame(FuzzedDataProvider& in, FrameHeader* h, std::vector<uint8_t>* body, const std::vector<uint8_t>& forced,
                FrameType forced_type) {
  uint8_t hdr[kHeaderBytes] = {};
  const int how = in.ConsumeIntegralInRange<int>(0, 3);
  if (how == 0) {
    in.ConsumeData(hdr, kHeaderBytes);
  } else {
    FrameHeader f;
    f.type = how == 1 && !forced.empty() ? forced_type : static_cast<FrameType>(in.ConsumeIntegralInRange<int>(1, 10));
    f.flags = in.ConsumeBool() ? in.ConsumeIntegral<uint8_t>() : 0;
    const size_t want = f.type == FrameType::kHello       ? kHelloBytes
                        : f.type == FrameType::kChallenge ? kChallengeBytes
                        : f.type == FrameType::kAuth      ? kAuthBytes
                                                          : 0;
    f.payload_len = in.ConsumeBool() ? static_cast<uint32_t>(want) : in.ConsumeIntegralInRange<uint32_t>(0, 256);
    f.seq = in.ConsumeIntegralInRange<uint64_t>(0, 4);
    encode_header(f, hdr);
  }
  if (!decode_header(hdr, kLimits, h).empty()) return false;
  if (h->payload_len > 4096) return false;   // the limits allow it; a stranger cannot send it cheaply here
  if (how == 1 && !forced.empty() && h->type == forced_type && forced.size() == h->payload_len) {
    *body = forced;
  } else {
    *body = in.ConsumeBytes<uint8_t>(h->payload_len);
    body->resize(h->payload_len);
  }
  return true;
}

void acceptor(FuzzedDataProvider& in) {
  const int world = in.ConsumeIntegralInRange<int>(2, 8);
  const int rank = in.ConsumeIntegralInRange<int>(0, world - 1);
  JobIdentity hs_id(kSecret, kJob, rank, world);
  AcceptorHandshake hs(&hs_id);
  // What an honest connector would send: a hello for this job and rank, then the right auth.
  HelloBody good{kJob, static_cast<uint32_t>(world - 1), static_cast<uint32_t>(rank), 0, 0, {}};
  uint8_t hello[kHelloBytes];
  encode_hello(good, hello);
  std::vector<uint8_t> forced_hello(hello, hello + kHelloBytes);
  uint8_t nonce[kNonceBytes] = {};
  uint8_t hello_seen[kHelloBytes] = {};
  for (int frames = 0; frames < 6 && in.remaining_bytes() > 0; frames++) {
    std::vector<uint8_t> forced;
    FrameType ft = FrameType::kHello;
    if (!hs.awaits_hello()) {
      const Mac right = handshake_mac(kSecret, kConnectorLabel, hello_seen, nonce);
      forced.assign(right.begin(), right.end());
      ft = FrameType::kAuth;
    } else if (in.ConsumeBool()) {
      forced = forced_hello;
    }
    FrameHeader h;
    std::vector<uint8_t> body;
    if (!next_frame(in, &h, &body, forced, ft)) return;   // the engine rejects the connection
    if (!hs.on_header(h).empty()) return;
    CHECK(body.size() == h.payload_len);
    if (hs.awaits_hello()) {
      CHECK(body.size() == kHelloBytes);
      if (!hs.on_hello(body.data()).empty()) return;
      const HelloBody& hb = hs.hello();
      CHECK(hb.job_id == kJob && hb.to_rank == static_cast<uint32_t>(rank));
      CHECK(hb.from_rank > static_cast<uint32_t>(rank) && hb.from_rank < static_cast<uint32_t>(world));
      std::memcpy(hello_seen, body.data(), kHelloBytes);
      in.ConsumeData(nonce, kNonceBytes);
      std::vector<uint8_t> ch = hs.challenge(nonce);
      CHECK(ch.size() == kChallengeBytes && std::memcmp(ch.data(), nonce, kNonceBytes) == 0);
    } else {
      CHECK(body.size() == kAuthBytes);
      const bool ok = hs.on_auth(body.data());
      const Mac right = handshake_mac(kSecret, kConnectorLabel, hello_seen, nonce);
      CHECK(ok == (std::memcmp(right.data(), body.data(), kMacBytes) == 0));
      if (!ok) return;
      CHECK(hs.admitted());
      return;
    }
  }
}

void connector(FuzzedDataProvider& in) {
  ConnectorHandshake hs(&kSecret);
  HelloBody hb{kJob, 3, 1, in.ConsumeIntegralInRange<uint32_t>(0, 3), in.ConsumeIntegral<uint32_t>(), {}};
  in.ConsumeData(hb.nonce.data(), kNonceBytes);
  const std::vector<uint8_t> hello = hs.hello(hb);
  bool proven = false;
  for (int frames = 0; frames < 6 && in.remaining_bytes() > 0; frames++) {
    // The listener's right challenge for a nonce from the input, offered now and then.
    uint8_t nonce[kNonceBytes] = {};
    in.ConsumeData(nonce, kNonceBytes);
    const Mac right = handshake_mac(kSecret, kAcceptorLabel, hello.data(), nonce);
    std::vector<uint8_t> forced(nonce, nonce + kNonceBytes);
    forced.insert(forced.end(), right.begin(), right.end());
    FrameHeader h;
    std::vector<uint8_t> body;
    if (!next_frame(in, &h, &body, in.ConsumeBool() ? forced : std::vector<uint8_t>{}, FrameType::kChallenge)) return;
    Mac auth;
    std::string why;
    switch (hs.on_frame(h, body, &auth, &why)) {
      case ConnectorHandshake::Step::kFail:
        CHECK(!why.empty());
        return;
      case ConnectorHandshake::Step::kSendAuth: {
        CHECK(h.type == FrameType::kChallenge && body.size() == kChallengeBytes);
        const Mac want = handshake_mac(kSecret, kAcceptorLabel, hello.data(), body.data());
        CHECK(std::memcmp(want.data(), body.data() + kNonceBytes, kMacBytes) == 0);
        const Mac mine = handshake_mac(kSecret, kConnectorLabel, hello.data(), body.data());
        CHECK(mine == auth);
        proven = true;
        break;
      }
      case ConnectorHandshake::Step::kUp:
        CHECK(proven && h.type == FrameType::kWelcome);
        return;
    }
  }
}

// One frame of a captured stream: false at its end or at a header the engine would refuse.
bool stream_frame(const uint8_t*& p, const uint8_t* end, FrameHeader* h, std::vector<uint8_t>* body) {
  if (end - p < static_cast<ptrdiff_t>(kHeaderBytes)) return false;
  if (!decode_header(p, kLimits, h).empty()) return false;
  p += kHeaderBytes;
  if (static_cast<size_t>(end - p) < h->payload_len) return false;
  body->assign(p, p + h->payload_len);
  p += h->payload_len;
  return true;
}

void captured_acceptor(const uint8_t* p, const uint8_t* end) {
  if (end - p < 8 + 2 + static_cast<ptrdiff_t>(kNonceBytes)) return;
  const uint64_t job = load_le64(p);
  const int rank = p[8], world = p[9];
  const uint8_t* nonce = p + 10;
  p += 10 + kNonceBytes;
  JobIdentity hs_id(kSecret, job, rank, world);
  AcceptorHandshake hs(&hs_id);
  FrameHeader h;
  std::vector<uint8_t> body;
  uint8_t hello[kHelloBytes] = {};
  while (stream_frame(p, end, &h, &body)) {
    if (!hs.on_header(h).empty()) return;
    if (hs.awaits_hello()) {
      if (!hs.on_hello(body.data()).empty()) return;
      std::memcpy(hello, body.data(), kHelloBytes);
      hs.challenge(nonce);
    } else {
      const Mac right = handshake_mac(kSecret, kConnectorLabel, hello, nonce);
      CHECK(hs.on_auth(body.data()) == (std::memcmp(right.data(), body.data(), kMacBytes) == 0));
      return;
    }
  }
}

void captured_connector(const uint8_t* p, const uint8_t* end) {
  if (end - p < static_cast<ptrdiff_t>(kHelloBytes)) return;
  ConnectorHandshake hs(&kSecret);
  const std::vector<uint8_t> hello = hs.hello(decode_hello(p));
  CHECK(std::memcmp(hello.data(), p, kHelloBytes) == 0);
  p += kHelloBytes;
  FrameHeader h;
  std::vector<uint8_t> body;
  bool proven = false;
  while (stream_frame(p, end, &h, &body)) {
    Mac auth;
    std::string why;
    switch (hs.on_frame(h, body, &auth, &why)) {
      case ConnectorHandshake::Step::kFail: return;
      case ConnectorHandshake::Step::kSendAuth: proven = true; break;
      case ConnectorHandshake::Step::kUp: CHECK(proven); return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 0x81) return captured_acceptor(data + 1, data + size), 0;
  if (size > 0 && data[0] == 0x80) return captured_connector(data + 1, data + size), 0;
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) acceptor(in);
  else connector(in);
  return 0;
}
