// The NCCL net plugin's engine room (nccl/net_plugin.h).
#include "nccl/net_plugin.h"

#include <arpa/inet.h>
#include <sys/random.h>

#include <climits>
#include <cstring>
#include <cstdarg>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <set>
#include <sys/stat.h>

#include "base/error.h"
#include "base/log.h"
#include "base/settings.h"
#include "monitor/health_json.h"
#include "net/registry.h"
#include "net/transport.h"

namespace r2ccl::nccl {

// A listen, send or receive comm as NCCL holds it. A send or receive comm is one peer of the
// endpoint (one NCCL connection): its messages are tagged 0, 1, 2, ... in posting order, so
// the i-th receive takes the i-th send (NCCL's per-connection FIFO).
struct NetPlugin::Comm {
  enum Kind { kListen, kSend, kRecv };
  Comm(Kind k, std::shared_ptr<Endpoint> e) : kind(k), ep(std::move(e)) {}
  const Kind kind;
  const std::shared_ptr<Endpoint> ep;
  uint64_t listen_id = 0;         // kListen
  std::atomic<int64_t> listen_since_ns{0};   // kListen: when accept() was first asked (threads may share a listen)
  int peer = -1;                  // kSend, kRecv
  std::atomic<uint64_t> next_tag{0};
  std::mutex mu;
  std::set<Request*> open;        // requests not yet finished by test(): freed at close
};

struct NetPlugin::Request {
  Comm* comm;
  std::shared_ptr<r2ccl::Request> req;
};

namespace {

// NCCL's registration of one of its buffers (regMr): registered with the endpoint (every NIC's
// transport; RDMA: every device), so sends from it and receives into it move with no copy.
struct MemHandle {
  void* data;
  size_t size;
  std::shared_ptr<Endpoint> ep;
  uint64_t id;
};

uint64_t random_u64() {
  uint64_t v = 0;
  while (v == 0)
    if (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) v = 0;
  return v;
}

std::vector<std::string> split_nics(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string n = text.substr(i, j - i);
    n.erase(0, n.find_first_not_of(" \t"));
    n.erase(n.find_last_not_of(" \t") + 1);
    if (!n.empty()) out.push_back(n);
    i = j + 1;
  }
  return out;
}

std::string hex_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// A NIC's link speed in Mbit/s from sysfs; 10 Gbit/s where the kernel reports none (loopback,
// veth, some virtual NICs).
int nic_speed_mbps(const std::string& ifname) {
  std::ifstream f("/sys/class/net/" + ifname + "/speed");
  long v = 0;
  if (!ifname.empty() && (f >> v) && v > 0 && v < INT_MAX) return static_cast<int>(v);
  return 10000;
}

// The PCI device of a NIC (its sysfs path, as NCCL's topology reads them); "" if it has none.
std::string nic_pci_path(const std::string& ifname) {
  if (ifname.empty()) return {};
  char* real = realpath(("/sys/class/net/" + ifname + "/device").c_str(), nullptr);
  if (!real) return {};
  std::string p = real;
  free(real);
  return p.find("/pci") != std::string::npos ? p : std::string();
}

abi::Result result_of(Cause c) {
  switch (c) {
    case Cause::kAllRailsDown:
    case Cause::kPeerGone:
    case Cause::kTimeout:
    case Cause::kMismatch:
    case Cause::kProtocol:
      return abi::kRemoteError;
    case Cause::kInvalidArgument:
      return abi::kInvalidArgument;
    default:
      return abi::kInternalError;
  }
}

}  // namespace

NetPlugin& NetPlugin::instance() {
  static NetPlugin* p = new NetPlugin();   // never destroyed: NCCL's threads may outlive static destruction
  return *p;
}

namespace {
// The core's lines through NCCL's logger, at NCCL's levels (NCCL_DEBUG filters them further).
void core_line_to_nccl(LogLevel level, const char* line) {
  const abi::LogLevel to = level == LogLevel::kInfo ? abi::kLogInfo : level == LogLevel::kTrace ? abi::kLogTrace
                                                                                                : abi::kLogWarn;
  NetPlugin::instance().log(to, line);
}
}  // namespace

void NetPlugin::log(abi::LogLevel level, const std::string& line) {
  const abi::Logger logger = logger_.load();
  if (logger) {
    logger(level, abi::kSubsysNet, __FILE__, __LINE__, "NET/r2ccl: %s", line.c_str());
  } else {
    log_write(level == abi::kLogWarn ? LogLevel::kWarn : LogLevel::kInfo, "NET/r2ccl: %s", line.c_str());
  }
}

abi::Result NetPlugin::fail(abi::Result r, const std::string& why) {
  log(abi::kLogWarn, why);
  return r;
}

std::string NetPlugin::health_json() {
  std::shared_ptr<Endpoint> ep;
  std::shared_ptr<monitor::Monitor> mon;
  bool per_nic;
  {
    std::lock_guard<std::mutex> g(mu_);
    ep = ep_;
    mon = monitor_;
    per_nic = per_nic_;
  }
  const std::string head = std::string("{\"plugin\": \"") + kPluginName + "\", \"devices\": \"" +
                           (per_nic ? "nic" : "fused") + "\", \"monitor\": \"";
  if (!ep) return head + "not initialized\", \"rails\": [], \"nics\": [], \"events\": []}";
  if (!mon) return head + "off\", \"rails\": [], \"nics\": [], \"events\": []}";
  return head + "on\", " + monitor::health_json(*mon, *ep).substr(1);
}

std::shared_ptr<Endpoint> NetPlugin::endpoint() {
  std::lock_guard<std::mutex> g(mu_);
  return ep_;
}

abi::Result NetPlugin::init(abi::Logger logger) {
  std::string opened;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (logger) {
      logger_ = logger;
      log_set_sink(&core_line_to_nccl);
    }
    if (users_++ > 0) return abi::kSuccess;
    try {
      Config cfg = config_from_environment();
      std::vector<std::string> nics = cfg.nics.empty() ? default_nics() : split_nics(cfg.nics);
      if (nics.size() > kHandleMaxNics)
        throw Error(Cause::kInvalidArgument, -1,
                    "R2CCL_NICS names " + std::to_string(nics.size()) + " NICs; the plugin stripes over at most " +
                        std::to_string(kHandleMaxNics));
      auto identity = std::make_unique<PluginIdentity>(hex_bytes(cfg.secret));
      identity_ = identity.get();
      ep_ = std::make_shared<Endpoint>(cfg, 0, 1, nics, std::move(identity));
      if (cfg.monitor_ms > 0) monitor_ = std::make_shared<monitor::Monitor>(ep_, cfg);
      accept_timeout_s_ = cfg.bootstrap_timeout_s;
      // The devices: one per NIC (each with its own PCI path and speed) or one fused.
      std::vector<DeviceInfo> per_nic;
      bool all_pci = true;
      for (const NicInfo& n : ep_->nics()) {
        DeviceInfo d;
        d.name = std::string(kPluginName) + ":" + (n.ifname.empty() ? n.name : n.ifname);
        d.pci_path = nic_pci_path(n.ifname);
        d.speed_mbps = nic_speed_mbps(n.ifname);
        d.guid = 0x7232636300000000ull + per_nic.size() + 1;   // "r2cc" | device + 1
        d.max_comms = 65536;
        all_pci = all_pci && !d.pci_path.empty();
        per_nic.push_back(d);
      }
      per_nic_ = cfg.nccl_devices == "nic" || (cfg.nccl_devices == "auto" && per_nic.size() >= 2 && all_pci);
      if (per_nic_) {
        devs_ = per_nic;
      } else {
        DeviceInfo fused;
        fused.name = kPluginName;
        fused.guid = 0x7232636300000000ull;
        fused.max_comms = 65536;
        for (const DeviceInfo& d : per_nic) {
          fused.speed_mbps += d.speed_mbps;
          if (fused.pci_path.empty()) fused.pci_path = d.pci_path;
        }
        devs_ = {fused};
      }
      for (const std::string& a : ep_->addresses()) opened += (opened.empty() ? "" : ", ") + a;
      if (const char* f = std::getenv(kFaultFileEnv)) {
        fault_stop_ = false;
        fault_watcher_ = std::thread(&NetPlugin::watch_faults, this, std::string(f));
      }
    } catch (const std::exception& e) {
      users_ = 0;
      identity_ = nullptr;
      monitor_.reset();
      ep_.reset();
      opened = e.what();
      logger = logger_.load();
      if (logger) logger(abi::kLogWarn, abi::kSubsysInit | abi::kSubsysNet, __FILE__, __LINE__, "NET/r2ccl: %s", opened.c_str());
      return abi::kInternalError;
    }
  }
  log(abi::kLogInfo, "listening on " + opened + " (" +
                         (per_nic_ ? "one device per NIC, the others its backups" : "one device striped over every NIC") +
                         ", R2CCL_NCCL_DEVICES; health monitor " +
                         std::string(monitor_ ? "on" : "off: R2CCL_MONITOR_MS=0") + ")");
  return abi::kSuccess;
}

abi::Result NetPlugin::finalize() {
  std::shared_ptr<Endpoint> closing;
  std::shared_ptr<monitor::Monitor> stopping;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (users_ == 0) return abi::kSuccess;
    if (--users_ > 0) return abi::kSuccess;
    closing = std::move(ep_);
    stopping = std::move(monitor_);
    identity_ = nullptr;
  }
  if (stopping) stopping->close();   // before the endpoint (monitor.h)
  if (fault_watcher_.joinable()) {
    {
      std::lock_guard<std::mutex> g(fault_mu_);
      fault_stop_ = true;
    }
    fault_cv_.notify_all();
    fault_watcher_.join();
  }
  if (closing) closing->close();
  return abi::kSuccess;
}

void NetPlugin::watch_faults(std::string path) {
  name_this_thread("r2ccl-faults");
  struct timespec seen {};
  for (;;) {
    {
      std::unique_lock<std::mutex> g(fault_mu_);
      if (fault_cv_.wait_for(g, std::chrono::milliseconds(10), [this] { return fault_stop_; })) return;
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;
    if (st.st_mtim.tv_sec == seen.tv_sec && st.st_mtim.tv_nsec == seen.tv_nsec) continue;
    seen = st.st_mtim;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line))
      if (!line.empty()) apply_fault(line);
  }
}

void NetPlugin::apply_fault(const std::string& line) {
  auto ep = endpoint();
  if (!ep) return;
  std::istringstream in(line);
  std::string what;
  int index = -1;
  in >> what >> index;
  int hit = 0;
  try {
    if (what == "nic_down" || what == "nic_up") {
      ep->set_nic_state(index, what == "nic_up", "test fault (" + std::string(kFaultFileEnv) + ")");
      hit = 1;
    } else if (what == "throw") {
      for (int peer : ep->peers()) {
        try {
          ep->testing_throw_on(peer);
          hit++;
        } catch (const Error&) {
        }
      }
    } else {
      const Fault fault = what == "close" ? Fault::kClose : what == "stall" ? Fault::kStall : Fault::kNone;
      if (what != "close" && what != "stall" && what != "heal") {
        log(abi::kLogWarn, "test fault: unknown line '" + line + "'");
        return;
      }
      for (int peer : ep->peers()) {
        try {
          ep->inject(peer, index, fault, 0);
          hit++;
        } catch (const Error&) {   // a connection closed meanwhile, or no such rail
        }
      }
    }
  } catch (const Error& e) {
    log(abi::kLogWarn, "test fault: '" + line + "' failed: " + e.what());
    return;
  }
  log(abi::kLogWarn, "test fault: " + line + " (" + std::to_string(hit) + " connection(s))");
}

abi::Result NetPlugin::devices(int* n) {
  std::lock_guard<std::mutex> g(mu_);
  *n = ep_ ? static_cast<int>(devs_.size()) : 0;
  return abi::kSuccess;
}

abi::Result NetPlugin::device(int dev, DeviceInfo* out) {
  std::lock_guard<std::mutex> g(mu_);
  if (!ep_ || dev < 0 || dev >= static_cast<int>(devs_.size())) return abi::kInvalidArgument;
  *out = devs_[static_cast<size_t>(dev)];
  return abi::kSuccess;
}

int NetPlugin::device_count() {
  std::lock_guard<std::mutex> g(mu_);
  return ep_ ? static_cast<int>(devs_.size()) : 0;
}

abi::Result NetPlugin::listen(int dev, void* handle, void** listen_comm) {
  *listen_comm = nullptr;
  auto ep = endpoint();
  const int ndev = device_count();
  if (!ep || dev < 0 || dev >= ndev)
    return fail(abi::kInvalidArgument, "listen on device " + std::to_string(dev) + " of " + std::to_string(ndev) +
                                           " (before init, or past the devices)");
  ListenHandle h;
  h.listen_id = random_u64();
  h.dev = static_cast<uint8_t>(dev);
  if (getrandom(h.nonce.data(), h.nonce.size(), 0) != static_cast<ssize_t>(h.nonce.size()))
    return fail(abi::kSystemError, "no random bytes for a listen handle");
  for (const std::string& a : ep->addresses()) {
    const PeerAddress pa = parse_address(a);
    h.addrs.push_back(HandleAddr{pa.addr.sa.sin_addr.s_addr, ntohs(pa.addr.sa.sin_port), pa.backend->wire_id});
  }
  std::string key;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!identity_) return fail(abi::kInternalError, "listen after finalize");
    key = identity_->key_for(h.nonce.data(), h.nonce.size());
    identity_->open_listen(h.listen_id, key);
  }
  h.encode(static_cast<uint8_t*>(handle));
  auto* c = new Comm(Comm::kListen, ep);
  c->listen_id = h.listen_id;
  *listen_comm = c;
  return abi::kSuccess;
}

abi::Result NetPlugin::connect(int dev, void* handle, void** send_comm) {
  *send_comm = nullptr;
  auto ep = endpoint();
  const int ndev = device_count();
  if (!ep || dev < 0 || dev >= ndev)
    return fail(abi::kInvalidArgument, "connect on device " + std::to_string(dev) + " of " + std::to_string(ndev) +
                                           " (before init, or past the devices)");
  ListenHandle h;
  const std::string bad = ListenHandle::decode(static_cast<const uint8_t*>(handle), &h);
  if (!bad.empty()) return fail(abi::kInvalidArgument, "connect: " + bad);
  int peer;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!identity_) return fail(abi::kInternalError, "connect after finalize");
    peer = identity_->add_dialled(h.listen_id, identity_->key_for(h.nonce.data(), h.nonce.size()),
                                  static_cast<uint32_t>(ep->addresses().size()));
  }
  try {
    // The rails dial now; sends queue until one is up (and fail past R2CCL_TIMEOUT if none comes).
    ep->add_peer(peer, h.address_strings(), true);
    // Per-NIC devices: the rails over this device's NIC (and over the listener's, when NCCL
    // paired different devices) carry the connection; the others are backups.
    if (per_nic_)
      for (const RailStats& s : ep->rail_stats(peer))
        if (s.local_nic != dev && s.local_nic != h.dev) ep->set_rail_standby(peer, s.rail, true);
  } catch (const Error& e) {
    std::lock_guard<std::mutex> g(mu_);
    if (identity_) identity_->forget(peer);
    return fail(result_of(e.cause()), std::string("connect: ") + e.what());
  }
  auto* c = new Comm(Comm::kSend, ep);
  c->peer = peer;
  *send_comm = c;
  return abi::kSuccess;
}

abi::Result NetPlugin::accept(void* listen_comm, void** recv_comm) {
  *recv_comm = nullptr;
  auto* l = static_cast<Comm*>(listen_comm);
  int peer;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!identity_) return fail(abi::kInternalError, "accept after finalize");
    peer = identity_->next_arrival(l->listen_id);
  }
  if (peer < 0) {
    const int64_t now = now_ns();
    int64_t since = 0;
    if (!l->listen_since_ns.compare_exchange_strong(since, now)) since = l->listen_since_ns.load();
    else since = now;
    if (static_cast<double>(now - since) / 1e9 > accept_timeout_s_)
      return fail(abi::kRemoteError, "accept: no connection came for " + std::to_string(accept_timeout_s_) +
                                         " s (R2CCL_BOOTSTRAP_TIMEOUT); is the sender's plugin reaching these addresses?");
    return abi::kSuccess;   // not yet: NCCL calls again
  }
  auto* c = new Comm(Comm::kRecv, l->ep);
  c->peer = peer;
  *recv_comm = c;
  return abi::kSuccess;
}

abi::Result NetPlugin::reg_mr(void* comm, void* data, size_t size, int type, void** mhandle, int dmabuf_fd,
                              uint64_t dmabuf_offset) {
  *mhandle = nullptr;
  const bool dmabuf = dmabuf_fd >= 0;
  const std::string call = dmabuf ? "regMrDmaBuf" : "regMr";
  if (type != abi::kPtrHost)
    return fail(abi::kInvalidArgument, call + " of GPU memory (type " + std::to_string(type) +
                                           "): this plugin moves host memory only (GPUDirect is not offered yet)");
  auto ep = static_cast<Comm*>(comm)->ep;
  try {
    const uint64_t id = dmabuf ? ep->register_dmabuf(data, size, dmabuf_fd, dmabuf_offset)
                               : ep->register_memory(data, size);
    *mhandle = new MemHandle{data, size, ep, id};
  } catch (const Error& e) {
    return fail(e.cause() == Cause::kInvalidArgument ? abi::kInvalidArgument : abi::kSystemError,
                call + " of " + std::to_string(size) + " bytes: " + e.what());
  }
  return abi::kSuccess;
}

abi::Result NetPlugin::dereg_mr(void* comm, void* mhandle) {
  (void)comm;
  auto* h = static_cast<MemHandle*>(mhandle);
  if (!h) return abi::kSuccess;
  try {
    h->ep->deregister_memory(h->id);
  } catch (const Error& e) {
    delete h;
    return fail(abi::kInternalError, std::string("deregMr: ") + e.what());
  }
  delete h;
  return abi::kSuccess;
}

abi::Result NetPlugin::post(Comm* c, bool recv, void* data, size_t size, void** request) {
  {
    std::lock_guard<std::mutex> g(c->mu);
    if (c->open.size() >= static_cast<size_t>(abi::kMaxRequests)) {
      *request = nullptr;   // back-pressure: NCCL posts again later
      return abi::kSuccess;
    }
  }
  auto r = std::make_shared<r2ccl::Request>(recv ? r2ccl::Request::kRecv : r2ccl::Request::kSend, c->peer,
                                            c->next_tag.fetch_add(1), static_cast<uint8_t*>(data), size);
  r->tag_once = true;
  r->up_to_len = recv;   // NCCL's receive names its buffer's size; test() reports the message's
  auto* w = new Request{c, r};
  {
    std::lock_guard<std::mutex> g(c->mu);
    c->open.insert(w);
  }
  c->ep->post(r);
  *request = w;
  return abi::kSuccess;
}

abi::Result NetPlugin::isend(void* send_comm, void* data, size_t size, void** request) {
  auto* c = static_cast<Comm*>(send_comm);
  return post(c, false, data, size, request);
}

abi::Result NetPlugin::irecv(void* recv_comm, int n, void** data, size_t* sizes, void** request) {
  auto* c = static_cast<Comm*>(recv_comm);
  if (n != 1) {
    *request = nullptr;
    return fail(abi::kInvalidUsage, "irecv of " + std::to_string(n) + " buffers at once; the plugin reports maxRecvs 1");
  }
  return post(c, true, data[0], sizes[0], request);
}

abi::Result NetPlugin::test(void* request, int* done, int* sizes) {
  auto* w = static_cast<Request*>(request);
  Comm* c = w->comm;
  if (!c->ep->test(w->req)) {
    *done = 0;
    return abi::kSuccess;
  }
  *done = 1;
  abi::Result r = abi::kSuccess;
  if (w->req->failed()) {
    r = fail(result_of(w->req->error_cause()),
             std::string(w->req->kind == r2ccl::Request::kSend ? "send" : "receive") + " on NCCL connection " +
                 std::to_string(c->peer) + " failed (" + cause_name(w->req->error_cause()) +
                 "): " + w->req->error_message());
  } else if (sizes) {
    sizes[0] = static_cast<int>(w->req->received);
  }
  {
    std::lock_guard<std::mutex> g(c->mu);
    c->open.erase(w);
  }
  delete w;
  return r;
}

// A closed comm goes in order on the engine thread (Engine::close_peer): this returns once its
// requests no longer touch NCCL's buffers; sends test() reported done are still delivered.
abi::Result NetPlugin::close_send(void* send_comm) {
  auto* c = static_cast<Comm*>(send_comm);
  try {
    c->ep->close_peer(c->peer, c->kind == Comm::kSend ? "NCCL closed the send connection"
                                                       : "NCCL closed the receive connection");
  } catch (const Error& e) {   // the endpoint closed already (finalize first): nothing to touch
    log(abi::kLogInfo, "close of NCCL connection " + std::to_string(c->peer) + ": " + e.what());
  }
  for (Request* w : c->open) delete w;   // the endpoint no longer touches their buffers
  delete c;
  return abi::kSuccess;
}

abi::Result NetPlugin::close_recv(void* recv_comm) { return close_send(recv_comm); }

abi::Result NetPlugin::close_listen(void* listen_comm) {
  auto* c = static_cast<Comm*>(listen_comm);
  std::deque<int> never_accepted;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (identity_) never_accepted = identity_->close_listen(c->listen_id);
  }
  for (int peer : never_accepted) {
    try {
      c->ep->close_peer(peer, "its listen was closed before NCCL accepted it");
    } catch (const Error&) {
    }
  }
  delete c;
  return abi::kSuccess;
}

}  // namespace r2ccl::nccl
