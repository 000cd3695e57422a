// Tests for the job-secret handshake's two sides, csrc/core/handshake.{h,cc}: the honest
// exchange, and each way a stranger tries to skip or forge a step (another job, another
// rank, a wrong proof, a proof for another nonce, frames out of order, a welcome with no
// challenge before it). Standalone: exits non-zero and names each failing check.
#include "core/handshake.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "check.h"

using namespace r2ccl;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";
constexpr uint64_t kJob = 42;

FrameHeader header(FrameType t, size_t len) {
  FrameHeader h;
  h.type = t;
  h.payload_len = static_cast<uint32_t>(len);
  return h;
}

HelloBody hello_for(uint64_t job, uint32_t from, uint32_t to) {
  HelloBody h{job, from, to, 1, 7, {}};
  for (size_t i = 0; i < kNonceBytes; i++) h.nonce[i] = static_cast<uint8_t>(i * 3);
  return h;
}

void honest_exchange() {
  JobIdentity acc_id(kSecret, kJob, 0, 4);
  AcceptorHandshake acc(&acc_id);
  ConnectorHandshake con(&kSecret);
  const std::vector<uint8_t> hello = con.hello(hello_for(kJob, 2, 0));
  check(acc.on_header(header(FrameType::kHello, kHelloBytes)).empty(), "acceptor takes a hello first");
  check(acc.on_hello(hello.data()).empty(), "a valid hello is accepted");
  check(acc.hello().from_rank == 2 && acc.hello().rail == 1 && acc.hello().epoch == 7, "the hello is decoded");
  uint8_t nonce[kNonceBytes];
  std::memset(nonce, 0xA5, sizeof nonce);
  const std::vector<uint8_t> ch = acc.challenge(nonce);
  check(ch.size() == kChallengeBytes, "challenge size");
  check(acc.on_header(header(FrameType::kAuth, kAuthBytes)).empty(), "acceptor then takes an auth");
  check(!acc.on_header(header(FrameType::kHello, kHelloBytes)).empty(), "acceptor refuses a second hello");
  Mac auth;
  std::string why;
  check(con.on_frame(header(FrameType::kChallenge, ch.size()), ch, &auth, &why) == ConnectorHandshake::Step::kSendAuth,
        "the connector answers a valid challenge: " + why);
  check(!acc.admitted(), "not admitted before the auth");
  check(acc.on_auth(auth.data()), "the right auth is admitted");
  check(acc.admitted(), "admitted");
  check(con.on_frame(header(FrameType::kWelcome, 0), {}, &auth, &why) == ConnectorHandshake::Step::kUp,
        "the welcome after a proven challenge brings the rail up");
}

void acceptor_refusals() {
  {
    JobIdentity acc_id(kSecret, kJob, 0, 4);
    AcceptorHandshake acc(&acc_id);
    uint8_t b[kHelloBytes];
    encode_hello(hello_for(kJob + 1, 2, 0), b);
    check(acc.on_hello(b).find("another job") != std::string::npos, "a hello of another job is refused");
    encode_hello(hello_for(kJob, 2, 1), b);
    JobIdentity acc2_id(kSecret, kJob, 0, 4);
    AcceptorHandshake acc2(&acc2_id);
    check(acc2.on_hello(b).find("meant for rank 1") != std::string::npos, "a hello for another rank is refused");
    for (uint32_t from : {0u, 4u, 0xffffffffu}) {
      JobIdentity a_id(kSecret, kJob, 0, 4);
      AcceptorHandshake a(&a_id);
      encode_hello(hello_for(kJob, from, 0), b);
      check(a.on_hello(b).find("invalid rank") != std::string::npos, "a hello from rank " + std::to_string(from));
    }
  }
  {
    JobIdentity acc_id(kSecret, kJob, 0, 4);
    AcceptorHandshake acc(&acc_id);
    check(!acc.on_header(header(FrameType::kAuth, kAuthBytes)).empty(), "an auth before the hello is refused");
    uint8_t zero[kAuthBytes] = {};
    check(!acc.on_auth(zero), "an auth before any challenge admits nobody");
  }
  {
    // A proof made with another secret, and a right proof replayed for another nonce.
    JobIdentity acc_id(kSecret, kJob, 0, 4);
    AcceptorHandshake acc(&acc_id);
    uint8_t hello[kHelloBytes];
    encode_hello(hello_for(kJob, 3, 0), hello);
    check(acc.on_hello(hello).empty(), "hello");
    uint8_t nonce[kNonceBytes] = {1};
    acc.challenge(nonce);
    const std::string other = "another secret of the same length";
    Mac forged = handshake_mac(other, kConnectorLabel, hello, nonce);
    check(!acc.on_auth(forged.data()), "a proof with another secret is refused");
    uint8_t old_nonce[kNonceBytes] = {2};
    Mac replay = handshake_mac(kSecret, kConnectorLabel, hello, old_nonce);
    check(!acc.on_auth(replay.data()), "a proof for another nonce (a replay) is refused");
    Mac mirrored = handshake_mac(kSecret, kAcceptorLabel, hello, nonce);
    check(!acc.on_auth(mirrored.data()), "the acceptor's own proof sent back is refused");
    check(!acc.admitted(), "nobody admitted");
  }
}

void connector_refusals() {
  Mac auth;
  std::string why;
  {
    ConnectorHandshake con(&kSecret);
    con.hello(hello_for(kJob, 2, 0));
    // A listener that skips the challenge: anyone answering on the peer's address.
    check(con.on_frame(header(FrameType::kWelcome, 0), {}, &auth, &why) == ConnectorHandshake::Step::kFail,
          "a welcome before any challenge is refused");
    check(why.find("before the listener proved") != std::string::npos, "and says why: " + why);
  }
  {
    ConnectorHandshake con(&kSecret);
    const std::vector<uint8_t> hello = con.hello(hello_for(kJob, 2, 0));
    std::vector<uint8_t> ch(kChallengeBytes, 0);
    const std::string other = "another secret of the same length";
    const Mac m = handshake_mac(other, kAcceptorLabel, hello.data(), ch.data());
    std::memcpy(ch.data() + kNonceBytes, m.data(), kMacBytes);
    check(con.on_frame(header(FrameType::kChallenge, ch.size()), ch, &auth, &why) == ConnectorHandshake::Step::kFail,
          "a challenge proven with another secret is refused");
    check(con.on_frame(header(FrameType::kWelcome, 0), {}, &auth, &why) == ConnectorHandshake::Step::kFail,
          "and no welcome brings the rail up after it");
  }
  {
    ConnectorHandshake con(&kSecret);
    const std::vector<uint8_t> hello = con.hello(hello_for(kJob, 2, 0));
    std::vector<uint8_t> ch(kChallengeBytes, 9);
    const Mac m = handshake_mac(kSecret, kConnectorLabel, hello.data(), ch.data());   // our own label reflected
    std::memcpy(ch.data() + kNonceBytes, m.data(), kMacBytes);
    check(con.on_frame(header(FrameType::kChallenge, ch.size()), ch, &auth, &why) == ConnectorHandshake::Step::kFail,
          "a challenge carrying the connector's label (a reflection) is refused");
  }
  {
    ConnectorHandshake con(&kSecret);
    con.hello(hello_for(kJob, 2, 0));
    check(con.on_frame(header(FrameType::kData, 0), {}, &auth, &why) == ConnectorHandshake::Step::kFail,
          "a data frame during the handshake is refused");
  }
}

}  // namespace

// An identity other than the job's (the NCCL plugin's shape): each domain (a listen handle) has
// its own key, any id may dial, and the peer is whatever the identity maps the hello to.
class KeyPerDomain final : public PeerIdentity {
 public:
  std::string key_a = "key-of-listen-handle-a-32-bytes!", key_b = "key-of-listen-handle-b-32-bytes!";
  std::string peer_name(int peer) const override { return "connection " + std::to_string(peer); }
  std::string check_peer(int) const override { return {}; }
  bool dials(int) const override { return true; }
  HelloIds hello_to(int peer) const override { return {0xA, 77, static_cast<uint32_t>(peer)}; }
  const std::string& key(int) const override { return key_a; }
  std::string accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) override {
    *add_with_nics = 2;
    if (h.domain != 0xA && h.domain != 0xB) return "no such listen handle";
    *peer = 1000 + static_cast<int>(h.from);
    *key = h.domain == 0xA ? &key_a : &key_b;
    return {};
  }
};

void identity_decides_peer_and_key() {
  KeyPerDomain id;
  for (const bool right_key : {true, false}) {
    AcceptorHandshake acc(&id);
    ConnectorHandshake con(right_key ? &id.key_a : &id.key_b);
    HelloIds ids = id.hello_to(5);
    const std::vector<uint8_t> hello = con.hello(hello_for(ids.domain, ids.from, ids.to));
    check(acc.on_hello(hello.data()).empty(), "the identity accepts the hello");
    check(acc.peer() == 1077, "the peer is the identity's, not the hello's rank");
    check(acc.add_with_nics() == 2, "and whether the engine adds it on this hello");
    uint8_t nonce[kNonceBytes] = {9};
    const std::vector<uint8_t> ch = acc.challenge(nonce);
    Mac auth;
    std::string why;
    const auto step = con.on_frame(header(FrameType::kChallenge, ch.size()), ch, &auth, &why);
    if (right_key) {
      check(step == ConnectorHandshake::Step::kSendAuth, "the domain's key proves the listener: " + why);
      check(acc.on_auth(auth.data()), "and the connector");
    } else {
      check(step == ConnectorHandshake::Step::kFail, "a connector holding another domain's key refuses the listener");
      Mac forged = handshake_mac(id.key_b, kConnectorLabel, hello.data(), nonce);
      check(!acc.on_auth(forged.data()), "and the listener refuses its proof");
    }
  }
  AcceptorHandshake acc(&id);
  uint8_t b[kHelloBytes];
  encode_hello(hello_for(0xC, 1, 0), b);
  check(acc.on_hello(b) == "no such listen handle", "the identity's refusal is the handshake's");
}

int main() {
  honest_exchange();
  identity_decides_peer_and_key();
  acceptor_refusals();
  connector_refusals();
  return checks_passed("test_handshake");
}
