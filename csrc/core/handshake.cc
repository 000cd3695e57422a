#include "core/handshake.h"

#include <cstring>

#include "core/digest.h"

namespace r2ccl {

Mac handshake_mac(const std::string& secret, const char* label, const uint8_t hello[kHelloBytes],
                  const uint8_t nonce[kNonceBytes]) {
  ByteSpan parts[3] = {{label, std::strlen(label)}, {hello, kHelloBytes}, {nonce, kNonceBytes}};
  return hmac_sha256(secret.data(), secret.size(), parts, 3);
}

// ---------------------------------------------------------------- acceptor

std::string AcceptorHandshake::on_header(const FrameHeader& h) const {
  if (stage_ == 0 && h.type == FrameType::kHello) return {};
  if (stage_ == 2 && h.type == FrameType::kAuth) return {};
  return "unexpected frame type during handshake";
}

std::string AcceptorHandshake::on_hello(const uint8_t body[kHelloBytes]) {
  if (stage_ != 0) return "a second hello";
  HelloBody h = decode_hello(body);
  const HelloIds ids{h.job_id, h.from_rank, h.to_rank};
  const std::string* key = nullptr;
  std::string why = identity_->accept_hello(ids, &peer_, &key, &add_with_nics_);
  if (!why.empty()) return why;
  key_ = *key;
  std::memcpy(hello_, body, kHelloBytes);
  hb_ = h;
  stage_ = 1;
  return {};
}

std::vector<uint8_t> AcceptorHandshake::challenge(const uint8_t nonce[kNonceBytes]) {
  std::memcpy(nonce_, nonce, kNonceBytes);
  const Mac mac = handshake_mac(key_, kAcceptorLabel, hello_, nonce_);
  std::vector<uint8_t> body(nonce_, nonce_ + kNonceBytes);
  body.insert(body.end(), mac.begin(), mac.end());
  stage_ = 2;
  return body;
}

bool AcceptorHandshake::on_auth(const uint8_t body[kAuthBytes]) {
  if (stage_ != 2) return false;
  Mac got;
  std::memcpy(got.data(), body, kMacBytes);
  if (!mac_equal(handshake_mac(key_, kConnectorLabel, hello_, nonce_), got)) return false;
  stage_ = 3;
  return true;
}

// ---------------------------------------------------------------- connector

std::vector<uint8_t> ConnectorHandshake::hello(const HelloBody& h) {
  encode_hello(h, hello_);
  stage_ = 1;
  return std::vector<uint8_t>(hello_, hello_ + kHelloBytes);
}

ConnectorHandshake::Step ConnectorHandshake::on_frame(const FrameHeader& h, const std::vector<uint8_t>& body,
                                                      Mac* auth, std::string* why) {
  if (stage_ == 1 && h.type == FrameType::kChallenge && body.size() == kChallengeBytes) {
    Mac got;
    std::memcpy(got.data(), body.data() + kNonceBytes, kMacBytes);
    if (!mac_equal(handshake_mac(*key_, kAcceptorLabel, hello_, body.data()), got)) {
      *why = "listener failed to prove the job secret";
      return Step::kFail;
    }
    *auth = handshake_mac(*key_, kConnectorLabel, hello_, body.data());
    stage_ = 2;
    return Step::kSendAuth;
  }
  // A welcome only after the listener proved the secret: one that skips the challenge could
  // be anyone who answered on the peer's address.
  if (stage_ == 2 && h.type == FrameType::kWelcome) {
    stage_ = 3;
    return Step::kUp;
  }
  *why = stage_ == 1 && h.type == FrameType::kWelcome ? "a welcome before the listener proved the job secret"
                                                      : "unexpected frame during the handshake";
  return Step::kFail;
}

}  // namespace r2ccl
