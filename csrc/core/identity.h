// Who an engine's peers are and what a rail must prove to join one: the seam between the
// engine and the host program that owns it. The engine keys peers by an int it does not
// interpret; an identity says which side dials, what a hello says and which key both ends'
// proofs use (core/handshake.h). The job's (JobIdentity, for Endpoint): peers are ranks, the
// higher rank dials, every rail proves the job secret. The NCCL net plugin's: peers are
// connections, the sender dials, a rail proves the nonce of the listen handle it was given.
// Knows nothing of sockets.
#pragma once
#include <cstdint>
#include <string>

namespace r2ccl {

// What a hello names besides its rail: a domain (the job; a plugin's listen handle) and the
// two ends' ids in it.
struct HelloIds {
  uint64_t domain = 0;
  uint32_t from = 0, to = 0;
};

// Called on the engine's thread, except check_peer, dials and peer_name, which add_peer also
// calls from the caller's; an implementation's state must outlive the engine.
class PeerIdentity {
 public:
  virtual ~PeerIdentity() = default;
  // How logs and errors name a peer ("rank 3").
  virtual std::string peer_name(int peer) const = 0;
  // "" when `peer` may be added, else why not.
  virtual std::string check_peer(int peer) const = 0;
  // Whether this side dials (and re-dials) the peer's rails; the other side listens.
  virtual bool dials(int peer) const = 0;
  // What this side's hellos to `peer` say.
  virtual HelloIds hello_to(int peer) const = 0;
  // The key of both ends' proofs on a rail with `peer` (at least 16 bytes).
  virtual const std::string& key(int peer) const = 0;
  // An acceptor's check of a hello: "" with the peer it comes from and the key its proofs use,
  // or why the connection is refused. A peer not added yet is parked until it is. An identity
  // whose peers are not announced (the NCCL plugin's accepting side: no bootstrap tells it)
  // sets *peer = -1 and *add_with_nics to the dialler's NIC count: once the dialler has proved
  // the key, the engine asks admit_new for the peer and adds it as the listening side.
  virtual std::string accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) = 0;
  // The peer of a proven hello that accept_hello named none for: the same for every rail of one
  // dialler's connection (same domain and from), a new one for its first (-1: refuse).
  virtual int admit_new(const HelloIds&) { return -1; }
  // Whether an admitted peer is still wanted; false: the engine closes it in order at once (the
  // NCCL plugin: a dialler whose listen was closed before its first rail came: it hears goodbye).
  virtual bool wanted(int) const { return true; }
  // The engine has forgotten `peer` (its close finished): an identity may drop what it keeps.
  virtual void peer_removed(int) {}
};

// The job's identity: ranks 0..world-1, the job id derived from the secret.
class JobIdentity final : public PeerIdentity {
 public:
  JobIdentity(std::string secret, uint64_t job_id, int rank, int world)
      : secret_(std::move(secret)), job_id_(job_id), rank_(rank), world_(world) {}
  // The job id every rank derives from the same secret (a stranger's job differs).
  static uint64_t job_id_of(const std::string& secret);

  std::string peer_name(int peer) const override { return "rank " + std::to_string(peer); }
  std::string check_peer(int peer) const override;
  bool dials(int peer) const override { return rank_ > peer; }   // the higher rank dials
  HelloIds hello_to(int peer) const override {
    return {job_id_, static_cast<uint32_t>(rank_), static_cast<uint32_t>(peer)};
  }
  const std::string& key(int) const override { return secret_; }
  std::string accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) override;

 private:
  std::string secret_;
  uint64_t job_id_;
  int rank_, world_;
};

}  // namespace r2ccl
