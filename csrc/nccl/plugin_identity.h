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
  // closeListen(): none will be accepted any more (those admitted and not accepted are
  // returned, for the caller to close). The listen is remembered as closed (the last
  // kClosedListensKept): a dialler still on its way is admitted and closed at once, so it hears
  // goodbye instead of re-dialling a listen that is gone until its timeout.
  std::deque<int> close_listen(uint64_t listen_id);
  // accept(): the next connection admitted for the listen, or -1.
  int next_arrival(uint64_t listen_id);
  // connect(): a new peer id for a connection this side dials to `listen_id`.
  int add_dialled(uint64_t listen_id, std::string key, uint32_t local_nics);
  // The peer's entry goes (its id is never reused): a connect that failed, or the engine
  // forgot it (peer_removed, once its close finished).
  void forget(int peer);

  std::string peer_name(int peer) const override;
  std::string check_peer(int peer) const override;
  bool dials(int peer) const override;
  HelloIds hello_to(int peer) const override;
  const std::string& key(int peer) const override;
  std::string accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) override;
  int admit_new(const HelloIds& h) override;
  bool wanted(int peer) const override;
  void peer_removed(int peer) override { forget(peer); }

  // How many closed listens are remembered (each: its key, about 50 bytes).
  static constexpr size_t kClosedListensKept = 4096;

 private:
  struct Conn {
    bool dials = false;
    uint64_t listen_id = 0;
    uint32_t conn_id = 0;      // the dialler's random id for the connection (the hello's `from`)
    uint32_t nics = 0;         // the dialler's NIC count (the hello's `to`)
    std::string key;
    bool wanted = true;        // false: its listen closed before accept took it
  };
  struct Listen {
    std::string key;
    std::deque<int> arrived;   // admitted, not yet accepted
    bool closed = false;       // closeListen() came (kept among closed_order_)
  };
  const std::string secret_;
  mutable std::mutex mu_;
  int next_peer_ = 1;
  std::map<int, Conn> conns_;                                // std::map: a Conn's key stays put
  std::map<uint64_t, Listen> listens_;
  std::deque<uint64_t> closed_order_;                        // closed listens, oldest first
  std::map<std::pair<uint64_t, uint32_t>, int> accepted_;    // (listen, conn id) -> peer
};

}  // namespace r2ccl::nccl
