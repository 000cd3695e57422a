// The tables NCCL looks up in this library (ncclNetPlugin_v12, _v11, _v10: NCCL 2.30+ takes
// v12, 2.28-2.29 v11, 2.26-2.27 v10; src/plugin/net.cc), each a thin adapter over NetPlugin.
// The only symbols the library exports (the link's version script hides the rest: nothing of
// ours for NCCL or the program to collide with).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "nccl/net_abi.h"
#include "nccl/net_plugin.h"

namespace r2ccl::nccl {
namespace {

using namespace abi;

NetPlugin& P() { return NetPlugin::instance(); }

// Every field of NCCL's properties: NCCL passes an uninitialised struct.
// The strings live as long as the process: NCCL may keep the pointers (its topology holds a
// device's name and pciPath), and a device's strings are few and fixed.
const char* interned(const std::string& s) {
  static std::mutex mu;
  static auto* strings = new std::set<std::string>();   // never freed (NCCL's threads may outlive exit's destructors)
  std::lock_guard<std::mutex> g(mu);
  return strings->insert(s).first->c_str();
}

void fill_head(const DeviceInfo& d, PropertiesHead* h) {
  h->name = const_cast<char*>(interned(d.name));
  h->pci_path = d.pci_path.empty() ? nullptr : const_cast<char*>(interned(d.pci_path));
  h->guid = d.guid;
  h->ptr_support = kPtrHost;
  h->reg_is_global = 0;
  h->force_flush = 0;
  h->speed_mbps = d.speed_mbps;
  h->port = 0;
  h->latency_us = 0;   // NCCL's default for a network
  h->max_comms = d.max_comms;
  h->max_recvs = 1;
  h->device_type = kDeviceHost;
  h->device_version = 0;
}

template <class Props>
Result get_properties(int dev, Props* p) {
  DeviceInfo d;
  Result r = P().device(dev, &d);
  if (r != kSuccess) return r;
  std::memset(p, 0, sizeof *p);
  fill_head(d, &p->head);
  p->vprops.ndevs = 1;
  p->vprops.devs[0] = dev;
  p->max_p2p_bytes = 1ull << 30;    // NCCL's own MAX_NET_SIZE (1 GiB per message)
  p->max_coll_bytes = 1ull << 30;
  if constexpr (sizeof(Props) >= sizeof(PropertiesV11)) p->max_multi_request_size = 1;
  if constexpr (sizeof(Props) == sizeof(PropertiesV12)) p->rail_id = p->plane_id = kIdUndef;
  return kSuccess;
}

Result devices(int* n) { return P().devices(n); }
Result accept(void* l, void** rc, DeviceHandle** rdc) {
  if (rdc) *rdc = nullptr;
  return P().accept(l, rc);
}
Result reg_mr(void* c, void* d, size_t s, int t, void** m) { return P().reg_mr(c, d, s, t, m); }
Result reg_mr_dmabuf(void* c, void* d, size_t s, int t, uint64_t offset, int fd, void** m) {
  if (fd < 0) {   // NCCL never does; a plugin harness might
    *m = nullptr;
    return kInvalidArgument;
  }
  return P().reg_mr(c, d, s, t, m, fd, offset);
}
Result dereg_mr(void* c, void* m) { return P().dereg_mr(c, m); }
Result isend(void* sc, void* d, size_t s, int, void*, void*, void** r) { return P().isend(sc, d, s, r); }
Result irecv(void* rc, int n, void** d, size_t* s, int*, void**, void**, void** r) { return P().irecv(rc, n, d, s, r); }
Result iflush(void*, int, void**, int*, void**, void** r) {
  *r = nullptr;   // host memory: nothing to flush (NCCL calls this only with GPUDirect)
  return kSuccess;
}
Result test(void* r, int* done, int* sizes) { return P().test(r, done, sizes); }
Result close_send(void* c) { return P().close_send(c); }
Result close_recv(void* c) { return P().close_recv(c); }
Result close_listen(void* c) { return P().close_listen(c); }

constexpr DataPath kDataPath = {accept, reg_mr, reg_mr_dmabuf, dereg_mr, isend, irecv, iflush, test,
                                close_send, close_recv, close_listen, nullptr, nullptr};

// v11, v12: init and finalize per communicator; the context is unused (one endpoint per process).
Result init_v11(void** ctx, uint64_t, CommConfig*, Logger log, ProfilerCallback) {
  *ctx = &P();
  return P().init(log);
}
Result finalize_v11(void*) { return P().finalize(); }
Result listen_v11(void*, int dev, void* h, void** l) { return P().listen(dev, h, l); }
Result connect_v11(void*, int dev, void* h, void** sc, DeviceHandle** sdc) {
  if (sdc) *sdc = nullptr;
  return P().connect(dev, h, sc);
}

// v10: init once per process (NCCL counts communicators itself and never finalizes).
Result init_v10(Logger log, ProfilerCallback) { return P().init(log); }
Result listen_v10(int dev, void* h, void** l) { return P().listen(dev, h, l); }
Result connect_v10(int dev, CommConfig*, void* h, void** sc, DeviceHandle** sdc) {
  if (sdc) *sdc = nullptr;
  return P().connect(dev, h, sc);
}

}  // namespace
}  // namespace r2ccl::nccl

using namespace r2ccl::nccl;

// (extern "C" on each definition: a namespace-scope const would otherwise have internal linkage.)
extern "C" __attribute__((visibility("default"))) const abi::NetV12 ncclNetPlugin_v12 = {
    kPluginName, init_v11, devices, get_properties<abi::PropertiesV12>, listen_v11, connect_v11, kDataPath,
    nullptr, finalize_v11, nullptr};
extern "C" __attribute__((visibility("default"))) const abi::NetV11 ncclNetPlugin_v11 = {
    kPluginName, init_v11, devices, get_properties<abi::PropertiesV11>, listen_v11, connect_v11, kDataPath,
    nullptr, finalize_v11, nullptr};
extern "C" __attribute__((visibility("default"))) const abi::NetV10 ncclNetPlugin_v10 = {
    kPluginName, init_v10, devices, get_properties<abi::PropertiesV10>, listen_v10, connect_v10, kDataPath, nullptr};

// The plugin's health for jax_r2ccl.health() in the same process (jax_r2ccl/transport/nccl.py
// finds it with dlopen(RTLD_NOLOAD): only once NCCL loaded the plugin). Writes the JSON of
// NetPlugin::health_json() into buf (at most cap - 1 bytes and a NUL) and returns its full
// length: a caller whose buffer was too small calls again with a larger one.
extern "C" __attribute__((visibility("default"))) size_t r2ccl_nccl_plugin_health_v1(char* buf, size_t cap) {
  const std::string j = r2ccl::nccl::NetPlugin::instance().health_json();
  if (buf && cap > 0) {
    const size_t n = std::min(cap - 1, j.size());
    std::memcpy(buf, j.data(), n);
    buf[n] = '\0';
  }
  return j.size();
}

