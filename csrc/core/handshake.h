// The handshake, both sides, as pure state machines: a decoded frame in, a decision out. The
// key each side proves is its identity's (core/identity.h: the job secret, or a plugin
// listen handle's nonce). The engine runs them over any FrameLink (engine_handshake.cc,
// engine_rail_io.cc); the fuzz harnesses (tests/fuzz/) feed them a stranger's bytes.
//
//   connector -> hello     (domain, from id, to id, rail, epoch, connector nonce)
//   acceptor  -> challenge (acceptor nonce, HMAC(key, "acceptor" | hello | nonce))
//   connector -> auth      (HMAC(key, "connector" | hello | nonce))
//   acceptor  -> welcome   (the rail is up)
//
// Each side proves the key before the other sends it anything of the job's: the acceptor
// admits no rail before a valid auth, the connector takes no welcome before a valid challenge.
// What this proves and what it does not: docs/security.md. Knows nothing of sockets.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/identity.h"
#include "core/wire.h"

namespace r2ccl {

using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256(secret, label | hello | nonce): the proofs both sides exchange.
Mac handshake_mac(const std::string& secret, const char* label, const uint8_t hello[kHelloBytes],
                  const uint8_t nonce[kNonceBytes]);
inline constexpr char kAcceptorLabel[] = "r2ccl-v1-acceptor";
inline constexpr char kConnectorLabel[] = "r2ccl-v1-connector";

// The listener's side of one accepted connection.
class AcceptorHandshake {
 public:
  explicit AcceptorHandshake(PeerIdentity* identity = nullptr) : identity_(identity) {}

  // A header arrived (decode_header accepted it): empty when its payload is to be read, else
  // why the connection is refused (a frame other than the one this stage expects).
  std::string on_header(const FrameHeader& h) const;
  // The hello's body: empty when the identity accepts it (hello() and peer() then hold it),
  // else why not. Which rails the peer has is the engine's to check.
  std::string on_hello(const uint8_t body[kHelloBytes]);
  // The challenge's body (our nonce and our proof); `nonce` is fresh random bytes.
  std::vector<uint8_t> challenge(const uint8_t nonce[kNonceBytes]);
  // The auth's body: true when it proves the key (then the rail may be admitted).
  bool on_auth(const uint8_t body[kAuthBytes]);

  bool awaits_hello() const { return stage_ == 0; }
  bool admitted() const { return stage_ == 3; }
  const HelloBody& hello() const { return hb_; }
  int peer() const { return peer_; }   // the peer the identity named (after a valid hello)
  int add_with_nics() const { return add_with_nics_; }   // PeerIdentity::accept_hello

 private:
  PeerIdentity* identity_;
  // A copy: the identity may drop its key while this handshake is pending (the NCCL plugin's
  // listen is closed right after its first connection is accepted, its other rails still here).
  std::string key_;
  int peer_ = -1;
  int add_with_nics_ = 0;
  int stage_ = 0;   // 0: await hello, 1: hello valid (challenge to send), 2: await auth, 3: admitted
  uint8_t hello_[kHelloBytes] = {};
  HelloBody hb_{};
  uint8_t nonce_[kNonceBytes] = {};
};

// The dialler's side of one connection attempt.
class ConnectorHandshake {
 public:
  // `key`: the identity's key for the peer (PeerIdentity::key).
  explicit ConnectorHandshake(const std::string* key = nullptr) : key_(key) {}

  // Starts an attempt: the hello's body for `h` (its nonce is the caller's fresh random bytes).
  std::vector<uint8_t> hello(const HelloBody& h);

  enum class Step { kFail, kSendAuth, kUp };
  // A frame during the handshake (decode_header accepted its header; `body` is its payload).
  // kSendAuth: `auth` is the body to send; kUp: the listener admitted the rail; kFail: `why`.
  Step on_frame(const FrameHeader& h, const std::vector<uint8_t>& body, Mac* auth, std::string* why);

 private:
  const std::string* key_;
  int stage_ = 0;   // 0: not started, 1: await challenge, 2: await welcome, 3: up
  uint8_t hello_[kHelloBytes] = {};
};

}  // namespace r2ccl
