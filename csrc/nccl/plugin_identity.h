// Who the NCCL net plugin's peers are (core/identity.h): every NCCL connection is a peer of
// its own, with its own channel and rails, so per-connection order, close and failure are the
// channel's. The sender dials (connect), naming the listen's id as the hello's domain, a
// random id for the connection and its NIC count; the receiver knows of it only once it has
// proved the listen's key (the handle's nonce, and R2CCL_SECRET when set), and then hands it
// to that listen's accept(). Thread-safe: NCCL's threads and the engine's call in.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/identity.h"

namespace r2ccl::nccl {

class PluginIdentity final : public PeerIdentity {
 public:
  explicit PluginIdentity(std::string secret) : secret_(std::move(secret)) {}

  // The key of a listen's rails: its nonce, and the job secret when one is set.
  std::string key_for(const uint8_t* nonce, size_t n) const;

  // listen(): connections naming `listen_id` and proving `key` may arrive.
  void open_listen(uint64_t listen_id, std::string key);
  // closeListen(): none may any more (those admitted and not accepted are returned).
  std::deque<int> close_listen(uint64_t listen_id);
  // accept(): the next connection admitted for the listen, or -1.
  int next_arrival(uint64_t listen_id);
  // connect(): a new peer id for a connection this side dials to `listen_id`.
  int add_dialled(uint64_t listen_id, std::string key, uint32_t local_nics);
  // close: the peer's entry goes (its id is never reused).
  void forget(int peer);

  std::string peer_name(int peer) const override;
  std::string check_peer(int peer) const override;
  bool dials(int peer) const override;
  HelloIds hello_to(int peer) const override;
  const std::string& key(int peer) const override;
  std::string accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) override;
  int admit_new(const HelloIds& h) override;

 private:
  struct Conn {
    bool dials = false;
    uint64_t listen_id = 0;
    uint32_t conn_id = 0;      // the dialler's random id for the connection (the hello's `from`)
    uint32_t nics = 0;         // the dialler's NIC count (the hello's `to`)
    std::string key;
  };
  struct Listen {
    std::string key;
    std::deque<int> arrived;   // admitted, not yet accepted
  };
  const std::string secret_;
  mutable std::mutex mu_;
  int next_peer_ = 1;
  std::map<int, Conn> conns_;                                // std::map: a Conn's key stays put
  std::map<uint64_t, Listen> listens_;
  std::map<std::pair<uint64_t, uint32_t>, int> accepted_;    // (listen, conn id) -> peer
};

}  // namespace r2ccl::nccl
