// dlopen of libibverbs (verbs_api.h).
#include "net/ibverbs/verbs_api.h"

#include <dlfcn.h>

#include <mutex>

namespace r2ccl {
namespace {

struct Loaded {
  VerbsApi api{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool bind(void* lib, const char* name, F* out, std::string* why) {
  void* p = dlsym(lib, name);
  if (!p) {
    *why = std::string("libibverbs.so.1 has no ") + name;
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

Loaded load() {
  Loaded l;
  // RTLD_LOCAL: the library's symbols stay out of the process's namespace (another copy of
  // rdma-core loaded by someone else keeps its own). Never unloaded: providers it loads
  // keep pointers into it.
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    l.why = std::string("libibverbs.so.1 could not be loaded (install rdma-core / libibverbs1): ") + (e ? e : "?");
    return l;
  }
  VerbsApi& a = l.api;
  std::string& w = l.why;
  l.ok = bind(lib, "ibv_get_device_list", &a.get_device_list, &w) &&
         bind(lib, "ibv_free_device_list", &a.free_device_list, &w) &&
         bind(lib, "ibv_get_device_name", &a.get_device_name, &w) && bind(lib, "ibv_open_device", &a.open_device, &w) &&
         bind(lib, "ibv_close_device", &a.close_device, &w) && bind(lib, "ibv_query_device", &a.query_device, &w) &&
         bind(lib, "ibv_query_port", &a.query_port, &w) && bind(lib, "ibv_query_gid", &a.query_gid, &w) &&
         bind(lib, "ibv_alloc_pd", &a.alloc_pd, &w) && bind(lib, "ibv_dealloc_pd", &a.dealloc_pd, &w) &&
         bind(lib, "ibv_reg_mr", &a.reg_mr, &w) && bind(lib, "ibv_dereg_mr", &a.dereg_mr, &w) &&
         bind(lib, "ibv_create_comp_channel", &a.create_comp_channel, &w) &&
         bind(lib, "ibv_destroy_comp_channel", &a.destroy_comp_channel, &w) &&
         bind(lib, "ibv_create_cq", &a.create_cq, &w) && bind(lib, "ibv_destroy_cq", &a.destroy_cq, &w) &&
         bind(lib, "ibv_create_qp", &a.create_qp, &w) && bind(lib, "ibv_modify_qp", &a.modify_qp, &w) &&
         bind(lib, "ibv_destroy_qp", &a.destroy_qp, &w) && bind(lib, "ibv_get_cq_event", &a.get_cq_event, &w) &&
         bind(lib, "ibv_ack_cq_events", &a.ack_cq_events, &w) &&
         bind(lib, "ibv_get_async_event", &a.get_async_event, &w) &&
         bind(lib, "ibv_ack_async_event", &a.ack_async_event, &w) &&
         bind(lib, "ibv_event_type_str", &a.event_type_str, &w) &&
         bind(lib, "ibv_wc_status_str", &a.wc_status_str, &w);
  a.reg_dmabuf_mr = reinterpret_cast<decltype(a.reg_dmabuf_mr)>(dlsym(lib, "ibv_reg_dmabuf_mr"));
  return l;
}

}  // namespace

const VerbsApi* verbs_api(std::string* why) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.ok) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace r2ccl
