// libibverbs, loaded at run time (dlopen "libibverbs.so.1"), so one build of the package
// runs on hosts with and without rdma-core. Only the verbs backend includes this header; it
// needs rdma-core's <infiniband/verbs.h> at build time (the build defines
// R2CCL_HAVE_IBVERBS when it found it). The data-path calls (ibv_post_send, ibv_post_recv,
// ibv_poll_cq, ibv_req_notify_cq) are inline in that header and go through the device's
// own function table, so they need no symbol from the library; every other call goes
// through the table below. Knows verbs; nothing of rails or frames.
#pragma once
#include <infiniband/verbs.h>

#include <string>

namespace r2ccl {

struct VerbsApi {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);   // the exported (compat) entry point
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroy_qp)(ibv_qp*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned int);
  int (*get_async_event)(ibv_context*, ibv_async_event*);
  void (*ack_async_event)(ibv_async_event*);
  const char* (*event_type_str)(ibv_event_type);
  const char* (*wc_status_str)(ibv_wc_status);
  // Optional (rdma-core 34+): registering a dmabuf, the GPUDirect path for device memory
  // without nvidia-peermem. Null where the library lacks it.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
};

// The loaded library's table, loaded once per process; null when libibverbs cannot be
// loaded or lacks a symbol, with the reason in *why.
const VerbsApi* verbs_api(std::string* why);

}  // namespace r2ccl
