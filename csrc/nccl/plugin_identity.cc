// The NCCL net plugin's identity (nccl/plugin_identity.h).
#include "nccl/plugin_identity.h"

#include <sys/random.h>

namespace r2ccl::nccl {

namespace {
// Most NICs a dialler may claim (a hello's `to`): the handle's limit.
constexpr uint32_t kMaxDiallerNics = 8;
}  // namespace

std::string PluginIdentity::key_for(const uint8_t* nonce, size_t n) const {
  return std::string(reinterpret_cast<const char*>(nonce), n) + secret_;
}

void PluginIdentity::open_listen(uint64_t listen_id, std::string key) {
  std::lock_guard<std::mutex> g(mu_);
  listens_[listen_id].key = std::move(key);
}

std::deque<int> PluginIdentity::close_listen(uint64_t listen_id) {
  std::lock_guard<std::mutex> g(mu_);
  std::deque<int> left;
  auto it = listens_.find(listen_id);
  if (it == listens_.end() || it->second.closed) return left;
  left = std::move(it->second.arrived);
  it->second.arrived.clear();
  it->second.closed = true;
  for (int peer : left) {
    auto c = conns_.find(peer);
    if (c != conns_.end()) c->second.wanted = false;
  }
  closed_order_.push_back(listen_id);
  while (closed_order_.size() > kClosedListensKept) {
    listens_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
  return left;
}

int PluginIdentity::next_arrival(uint64_t listen_id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = listens_.find(listen_id);
  if (it == listens_.end() || it->second.closed || it->second.arrived.empty()) return -1;
  const int peer = it->second.arrived.front();
  it->second.arrived.pop_front();
  return peer;
}

int PluginIdentity::add_dialled(uint64_t listen_id, std::string key, uint32_t local_nics) {
  uint32_t conn_id = 0;
  while (getrandom(&conn_id, sizeof conn_id, 0) != static_cast<ssize_t>(sizeof conn_id)) {
  }
  std::lock_guard<std::mutex> g(mu_);
  const int peer = next_peer_++;
  conns_[peer] = Conn{true, listen_id, conn_id, local_nics, std::move(key)};
  return peer;
}

void PluginIdentity::forget(int peer) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = conns_.find(peer);
  if (it == conns_.end()) return;
  if (!it->second.dials) accepted_.erase({it->second.listen_id, it->second.conn_id});
  conns_.erase(it);
}

std::string PluginIdentity::peer_name(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = conns_.find(peer);
  if (it == conns_.end()) return "NCCL connection " + std::to_string(peer);
  return std::string(it->second.dials ? "NCCL send connection " : "NCCL receive connection ") + std::to_string(peer);
}

std::string PluginIdentity::check_peer(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  return conns_.count(peer) ? std::string() : "no NCCL connection " + std::to_string(peer);
}

bool PluginIdentity::dials(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = conns_.find(peer);
  return it != conns_.end() && it->second.dials;
}

HelloIds PluginIdentity::hello_to(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  const Conn& c = conns_.at(peer);
  return HelloIds{c.listen_id, c.conn_id, c.nics};
}

const std::string& PluginIdentity::key(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  return conns_.at(peer).key;   // (a map node: the reference outlives the lock)
}

std::string PluginIdentity::accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) {
  std::lock_guard<std::mutex> g(mu_);
  *add_with_nics = 0;
  auto a = accepted_.find({h.domain, h.from});
  if (a != accepted_.end()) {   // another rail of an admitted connection (or a re-dial)
    *peer = a->second;
    *key = &conns_.at(a->second).key;
    return {};
  }
  auto l = listens_.find(h.domain);
  if (l == listens_.end()) return "hello for no listen of this process (another process's, or closed long ago)";
  if (h.to < 1 || h.to > kMaxDiallerNics) return "hello from a dialler with " + std::to_string(h.to) + " NICs";
  *peer = -1;   // known once it proved the key (admit_new)
  *key = &l->second.key;
  *add_with_nics = static_cast<int>(h.to);
  return {};
}

int PluginIdentity::admit_new(const HelloIds& h) {
  std::lock_guard<std::mutex> g(mu_);
  auto a = accepted_.find({h.domain, h.from});
  if (a != accepted_.end()) return a->second;
  auto l = listens_.find(h.domain);
  if (l == listens_.end()) return -1;   // closed long ago (forgotten) while the handshake ran
  const int peer = next_peer_++;
  conns_[peer] = Conn{false, h.domain, h.from, h.to, l->second.key, !l->second.closed};
  accepted_[{h.domain, h.from}] = peer;
  if (!l->second.closed) l->second.arrived.push_back(peer);
  return peer;
}

bool PluginIdentity::wanted(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = conns_.find(peer);
  return it != conns_.end() && it->second.wanted;
}

}  // namespace r2ccl::nccl
