// The NCCL plugin harness's common part (the sequences and their NCCL source lines are in
// plugin_harness.cc's header): the table behind one face, handles passed through files in
// --dir, the ring's connections, checks that end the process with "FAIL: ...". Shared by the
// cases' files (plugin_harness.cc, close_race.cc); knows nothing of the plugin's insides.
#pragma once
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl/net_abi.h"

namespace harness {

using namespace r2ccl::nccl::abi;

inline int g_rank = 0, g_world = 2, g_table = 12;
inline int g_dev = 0;        // --dev: the device every listen and connect uses
inline int g_devices = 1;    // --devices: how many devices() must report
inline std::string g_dir, g_plugin;
inline double g_timeout_s = 60;

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "FAIL: rank %d: %s\n", g_rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

inline void check(bool ok, const std::string& what) {
  if (!ok) die(what);
}

// A plugin call that failed, while the case expects failures (the loop's fatal cells).
struct NetFailure {
  std::string what;
  Result r;
};
inline bool g_errors_expected = false;

inline void ok(Result r, const std::string& what) {
  if (r == kSuccess) return;
  if (g_errors_expected) throw NetFailure{what, r};
  die(what + " returned " + std::to_string(r));
}

inline std::atomic<int> g_faults_logged{0};   // "test fault:" lines the plugin logged (applied faults)

// The plugin's last WARN line, and its last line for a request test() failed ("send on NCCL
// connection N failed (cause): ..."; other threads' WARN lines may come between), under a mutex.
inline std::mutex g_warn_mu;
inline std::string g_last_warn, g_last_failure;
inline std::string last_warn() {
  std::lock_guard<std::mutex> g(g_warn_mu);
  return g_last_warn;
}
inline std::string last_failure() {
  std::lock_guard<std::mutex> g(g_warn_mu);
  return g_last_failure;
}

inline void logger(LogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (std::strstr(buf, "test fault: ") && !std::strstr(buf, "unknown") && !std::strstr(buf, "failed")) g_faults_logged++;
  if (level <= kLogWarn) {
    std::lock_guard<std::mutex> g(g_warn_mu);
    g_last_warn = buf;
    if (std::strstr(buf, " on NCCL connection ") && std::strstr(buf, " failed (")) g_last_failure = buf;
  }
  if (level > kLogWarn && !std::getenv("HARNESS_VERBOSE")) return;
  std::fprintf(stderr, "[rank %d nccl-log %d] %s\n", g_rank, static_cast<int>(level), buf);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One table, whatever its version: the calls the harness makes, with v10's init/listen/connect
// and v11/v12's ctx forms behind one face (as NCCL's own wrappers do, src/plugin/net/net_v1x.cc).
struct Net {
  void* lib = nullptr;
  const NetV10* v10 = nullptr;
  const NetV11* v11 = nullptr;
  const NetV12* v12 = nullptr;
  std::vector<void*> ctxs;

  const DataPath& d() const { return v12 ? v12->data : v11 ? v11->data : v10->data; }
  const char* name() const { return v12 ? v12->name : v11 ? v11->name : v10->name; }

  void open() {
    lib = dlopen(g_plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) die(std::string("dlopen: ") + dlerror());
    const std::string sym = "ncclNetPlugin_v" + std::to_string(g_table);
    void* t = dlsym(lib, sym.c_str());
    check(t != nullptr, "no symbol " + sym);
    v10 = nullptr, v11 = nullptr, v12 = nullptr;
    if (g_table == 12) v12 = static_cast<const NetV12*>(t);
    else if (g_table == 11) v11 = static_cast<const NetV11*>(t);
    else v10 = static_cast<const NetV10*>(t);
  }
  void close() {
    check(dlclose(lib) == 0, "dlclose");
    lib = nullptr;
  }
  void init() {
    void* ctx = nullptr;
    CommConfig cfg{-1};
    Result r = v12 ? v12->init(&ctx, 0x1234 + ctxs.size(), &cfg, logger, nullptr)
               : v11 ? v11->init(&ctx, 0x1234 + ctxs.size(), &cfg, logger, nullptr)
                     : v10->init(logger, nullptr);
    check(r == kSuccess, "init returned " + std::to_string(r));
    ctxs.push_back(ctx);
  }
  void finalize() {
    check(!ctxs.empty(), "finalize without init");
    void* ctx = ctxs.back();
    ctxs.pop_back();
    if (v12) check(v12->finalize(ctx) == kSuccess, "finalize");
    if (v11) check(v11->finalize(ctx) == kSuccess, "finalize");
  }
  int devices() {
    int n = -1;
    Result r = v12 ? v12->devices(&n) : v11 ? v11->devices(&n) : v10->devices(&n);
    check(r == kSuccess, "devices");
    return n;
  }
  void listen(void* handle, void** lc, int dev = g_dev) {
    void* ctx = ctxs.empty() ? nullptr : ctxs.back();
    Result r = v12 ? v12->listen(ctx, dev, handle, lc) : v11 ? v11->listen(ctx, dev, handle, lc) : v10->listen(dev, handle, lc);
    check(r == kSuccess && *lc, "listen");
  }
  Result connect_once(void* handle, void** sc, int dev = g_dev) {
    void* ctx = ctxs.empty() ? nullptr : ctxs.back();
    DeviceHandle* dh = nullptr;
    CommConfig cfg{-1};
    return v12 ? v12->connect(ctx, dev, handle, sc, &dh)
               : v11 ? v11->connect(ctx, dev, handle, sc, &dh) : v10->connect(dev, &cfg, handle, sc, &dh);
  }
};

inline Net net;

// ------------------------------------------------------------------ out-of-band handles

inline std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; i++) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

inline void unhex(const std::string& h, uint8_t* out) {
  check(h.size() == 2 * kHandleMaxBytes, "a handle of the wrong length");
  for (size_t i = 0; i < kHandleMaxBytes; i++) out[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
}

inline double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline void publish(const std::string& name, const std::string& value) {
  const std::string path = g_dir + "/" + name, tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp);
    f << value;
  }
  check(std::rename(tmp.c_str(), path.c_str()) == 0, "publish " + name);
}

// `poll_us`: how often to look (the close race's many short iterations look more often).
inline std::string fetch(const std::string& name, int poll_us = 5000) {
  const double until = now_s() + g_timeout_s;
  for (;;) {
    std::ifstream f(g_dir + "/" + name);
    std::string v;
    if (f >> v) return v;
    check(now_s() < until, "no " + name + " within the timeout");
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
  }
}

inline void barrier(const std::string& what) {
  publish("barrier." + what + "." + std::to_string(g_rank), "1");
  for (int r = 0; r < g_world; r++) fetch("barrier." + what + "." + std::to_string(r));
}

// ------------------------------------------------------------------ connections

struct Conn {
  void* send = nullptr;   // to rank+1
  void* recv = nullptr;   // from rank-1
};

// The ring's two connections, named `tag` (several may exist at once): listen, publish, connect
// and accept polled until both are ready, closeListen after accept, as NCCL's proxy does.
inline Conn connect_ring(const std::string& tag, int dev = g_dev) {
  uint8_t handle[kHandleMaxBytes];
  std::memset(handle, 0xcc, sizeof handle);
  void* lc = nullptr;
  net.listen(handle, &lc, dev);
  publish("handle." + tag + "." + std::to_string(g_rank), hex(handle, sizeof handle));
  const std::string peer_hex = fetch("handle." + tag + "." + std::to_string((g_rank + 1) % g_world));
  uint8_t peer[kHandleMaxBytes];
  unhex(peer_hex, peer);
  Conn c;
  const double until = now_s() + g_timeout_s;
  int calls = 0;
  while (!c.send || !c.recv) {
    if (!c.send) check(net.connect_once(peer, &c.send, dev) == kSuccess, "connect failed");
    if (!c.recv) {
      DeviceHandle* dh = nullptr;
      check(net.d().accept(lc, &c.recv, &dh) == kSuccess, "accept failed");
    }
    calls++;
    check(now_s() < until, "connect/accept not done within the timeout");
    if (!c.send || !c.recv) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  check(net.d().close_listen(lc) == kSuccess, "closeListen");
  return c;
}

// A connection to and from every other rank, named `tag` (an all-to-all's: NCCL's p2p connects
// these): one listen per peer, so that accept on it yields that peer's connection; conns[me]
// stays empty.
inline std::vector<Conn> connect_mesh(const std::string& tag) {
  std::vector<Conn> conns(g_world);
  std::vector<void*> lcs(g_world, nullptr);
  std::vector<std::vector<uint8_t>> peer(g_world, std::vector<uint8_t>(kHandleMaxBytes));
  for (int p = 0; p < g_world; p++) {
    if (p == g_rank) continue;
    uint8_t handle[kHandleMaxBytes];
    std::memset(handle, 0xcc, sizeof handle);
    net.listen(handle, &lcs[p]);
    publish("handle." + tag + "." + std::to_string(p) + "to" + std::to_string(g_rank), hex(handle, sizeof handle));
  }
  for (int p = 0; p < g_world; p++)
    if (p != g_rank) unhex(fetch("handle." + tag + "." + std::to_string(g_rank) + "to" + std::to_string(p)), peer[p].data());
  const double until = now_s() + g_timeout_s;
  for (bool all = false; !all;) {
    all = true;
    for (int p = 0; p < g_world; p++) {
      if (p == g_rank) continue;
      if (!conns[p].send) check(net.connect_once(peer[p].data(), &conns[p].send) == kSuccess, "connect failed");
      if (!conns[p].recv) {
        DeviceHandle* dh = nullptr;
        check(net.d().accept(lcs[p], &conns[p].recv, &dh) == kSuccess, "accept failed");
      }
      all = all && conns[p].send && conns[p].recv;
    }
    check(now_s() < until, "the mesh's connect/accept not done within the timeout");
    if (!all) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (int p = 0; p < g_world; p++)
    if (p != g_rank) check(net.d().close_listen(lcs[p]) == kSuccess, "closeListen");
  return conns;
}

inline void close_conn(Conn& c) {
  check(net.d().close_send(c.send) == kSuccess, "closeSend");
  check(net.d().close_recv(c.recv) == kSuccess, "closeRecv");
}

// Polls test() until done; returns the size it reports.
inline int wait_req(void* req, const char* what) {
  const double until = now_s() + g_timeout_s;
  int done = 0;
  int sizes[kTestSizes] = {};
  while (!done) {
    Result r = net.d().test(req, &done, sizes);
    check(r == kSuccess, std::string(what) + ": test returned " + std::to_string(r));
    check(done || now_s() < until, std::string(what) + ": not done within the timeout");
  }
  return sizes[0];
}

inline uint8_t pattern(int rank, uint64_t msg, size_t i) {
  return static_cast<uint8_t>((rank * 131 + msg * 31 + i * 7 + (i >> 8)) & 0xff);
}

// The cases of close_race.cc (its header says what each checks).
void case_close_race(uint64_t seed, int iters, double bound_s, double accept_bound_s);
void case_many(uint64_t seed, int threads, int comms, int rounds, double accept_bound_s);
void case_contain(uint64_t seed);
void case_spin(uint64_t seed, double accept_bound_s);

}  // namespace harness
