// The NCCL net plugin ABI that NCCL 2.26 to 2.32 load (tables v10, v11, v12), declared here
// as the facts it is: our own declarations, matched member for member and byte for byte to
// NVIDIA/nccl v2.30.7-1 (commit 73cf1122) src/include/plugin/nccl_net.h,
// src/include/plugin/net/net_v10.h, net_v11.h, net_v12.h, src/include/nccl_device/net_device.h,
// src/include/nccl_common.h and src/nccl.h.in, and checked against the DWARF of libnccl.so.2 in
// the nvidia-nccl-cu12 2.32.3 wheel (same layouts). The static_asserts at the end pin every
// size and the offsets NCCL reads. Which NCCL accepts which table: docs/design.md §12.
// Knows nothing of the core: only C types.
#pragma once
#include <cstddef>
#include <cstdint>

namespace r2ccl::nccl::abi {

// ncclResult_t (nccl.h.in).
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
  kTimeout = 8,
};

// ncclDebugLogLevel and the ncclDebugLogSubSys bit NCCL's net transport logs under (nccl_common.h).
enum LogLevel : int { kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogAbort = 4, kLogTrace = 5 };
inline constexpr unsigned long kSubsysNet = 0x10;   // NCCL_NET
inline constexpr unsigned long kSubsysInit = 0x1;   // NCCL_INIT

using Logger = void (*)(LogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...);
using ProfilerCallback = Result (*)(void** event, int type, void* phandle, int64_t plugin_id, void* ext);

// ncclNetDeviceType (net_device.h): HOST is what a host-memory plugin offers.
enum DeviceType : int { kDeviceHost = 0, kDeviceUnpack = 1 };

inline constexpr size_t kHandleMaxBytes = 128;        // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kPtrHost = 0x1;                  // NCCL_PTR_HOST
inline constexpr int kPtrCuda = 0x2;                  // NCCL_PTR_CUDA
inline constexpr int kPtrDmabuf = 0x4;                // NCCL_PTR_DMABUF
inline constexpr int kMaxRequests = 32;               // NCCL_NET_MAX_REQUESTS: outstanding per comm
inline constexpr uintptr_t kOptionalRecvCompletion = 0x1;   // NCCL_NET_OPTIONAL_RECV_COMPLETION (preset *request)
inline constexpr int kTestSizes = 64;                 // test()'s sizes array on the receive side (NCCL_PROXY_MAX_SUBS)
inline constexpr size_t kMaxNetSizeBytes = 1ull << 40;   // NCCL_MAX_NET_SIZE_BYTES: bound of maxP2pBytes
inline constexpr int16_t kIdUndef = -1;               // NCCL_NET_ID_UNDEF (railId, planeId)

// ncclNetDeviceHandle_v7_t (the same struct through v12).
struct DeviceHandle {
  DeviceType type;
  int version;
  void* handle;
  size_t size;
  int needs_proxy_progress;
};

struct CommConfig {   // ncclNetCommConfig_v10/v11/v12_t
  int traffic_class;
};

struct CommAttr {   // ncclNetCommAttr_v11/v12_t
  int32_t max_concurrent_peers, min_concurrent_peers, max_flows_per_peer, min_flows_per_peer;
};
struct NetAttr {   // ncclNetAttr_v11/v12_t
  CommAttr send, recv;
  uint32_t op, algo, proto;
};

template <int MaxDevs>
struct VDeviceProps {   // ncclNetVDeviceProps_v10/v11 (4 devices) and _v12 (8)
  int ndevs;
  int devs[MaxDevs];
};

// The fields every version shares, in the order NCCL lays them out (offsets 0..63).
struct PropertiesHead {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed_mbps;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  DeviceType device_type;
  int device_version;
};

struct PropertiesV10 {   // ncclNetProperties_v10_t
  PropertiesHead head;
  VDeviceProps<4> vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
};
struct PropertiesV11 {   // ncclNetProperties_v11_t
  PropertiesHead head;
  VDeviceProps<4> vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
};
struct PropertiesV12 {   // ncclNetProperties_v12_t
  PropertiesHead head;
  VDeviceProps<8> vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
  int16_t rail_id;
  int16_t plane_id;
};

// The data-path members, identical in every version (offsets 48..151).
struct DataPath {
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*reg_mr_dmabuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  Result (*dereg_mr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                  void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*close_send)(void* send_comm);
  Result (*close_recv)(void* recv_comm);
  Result (*close_listen)(void* listen_comm);
  Result (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecv_consumed)(void* recv_comm, int n, void* request);
};

struct NetV10 {   // ncclNet_v10_t
  const char* name;
  Result (*init)(Logger log, ProfilerCallback prof);
  Result (*devices)(int* ndev);
  Result (*get_properties)(int dev, PropertiesV10* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, CommConfig* config, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  DataPath data;
  Result (*make_vdevice)(int* dev, VDeviceProps<4>* props);
};

template <class Props, int MaxDevs>
struct NetV11Shape {   // ncclNet_v11_t and ncclNet_v12_t
  const char* name;
  Result (*init)(void** ctx, uint64_t comm_id, CommConfig* config, Logger log, ProfilerCallback prof);
  Result (*devices)(int* ndev);
  Result (*get_properties)(int dev, Props* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  Result (*connect)(void* ctx, int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  DataPath data;
  Result (*make_vdevice)(int* dev, VDeviceProps<MaxDevs>* props);
  Result (*finalize)(void* ctx);
  Result (*set_net_attr)(void* ctx, NetAttr* attr);
};
using NetV11 = NetV11Shape<PropertiesV11, 4>;
using NetV12 = NetV11Shape<PropertiesV12, 8>;

#if defined(__x86_64__) || defined(__aarch64__)
static_assert(sizeof(Result) == 4 && sizeof(LogLevel) == 4 && sizeof(DeviceType) == 4, "NCCL's enums are ints");
static_assert(sizeof(DeviceHandle) == 32 && offsetof(DeviceHandle, handle) == 8 && offsetof(DeviceHandle, size) == 16 &&
              offsetof(DeviceHandle, needs_proxy_progress) == 24, "ncclNetDeviceHandle_v7_t");
static_assert(sizeof(CommConfig) == 4, "ncclNetCommConfig_t");
static_assert(sizeof(CommAttr) == 16 && sizeof(NetAttr) == 44 && offsetof(NetAttr, recv) == 16 &&
              offsetof(NetAttr, op) == 32 && offsetof(NetAttr, proto) == 40, "ncclNetAttr_v11/v12_t");
static_assert(sizeof(PropertiesHead) == 64 && offsetof(PropertiesHead, guid) == 16 &&
              offsetof(PropertiesHead, ptr_support) == 24 && offsetof(PropertiesHead, speed_mbps) == 36 &&
              offsetof(PropertiesHead, latency_us) == 44 && offsetof(PropertiesHead, max_recvs) == 52 &&
              offsetof(PropertiesHead, device_type) == 56 && offsetof(PropertiesHead, device_version) == 60,
              "the head of ncclNetProperties_v10/v11/v12_t");
static_assert(sizeof(VDeviceProps<4>) == 20 && sizeof(VDeviceProps<8>) == 36, "ncclNetVDeviceProps_t");
static_assert(sizeof(PropertiesV10) == 104 && offsetof(PropertiesV10, vprops) == 64 &&
              offsetof(PropertiesV10, max_p2p_bytes) == 88 && offsetof(PropertiesV10, max_coll_bytes) == 96,
              "ncclNetProperties_v10_t");
static_assert(sizeof(PropertiesV11) == 112 && offsetof(PropertiesV11, max_p2p_bytes) == 88 &&
              offsetof(PropertiesV11, max_multi_request_size) == 104, "ncclNetProperties_v11_t");
static_assert(sizeof(PropertiesV12) == 128 && offsetof(PropertiesV12, max_p2p_bytes) == 104 &&
              offsetof(PropertiesV12, max_coll_bytes) == 112 && offsetof(PropertiesV12, max_multi_request_size) == 120 &&
              offsetof(PropertiesV12, rail_id) == 124 && offsetof(PropertiesV12, plane_id) == 126,
              "ncclNetProperties_v12_t");
static_assert(sizeof(DataPath) == 13 * 8, "the data-path members");
static_assert(sizeof(NetV10) == 160 && offsetof(NetV10, init) == 8 && offsetof(NetV10, connect) == 40 &&
              offsetof(NetV10, data) + offsetof(DataPath, isend) == 80 &&
              offsetof(NetV10, data) + offsetof(DataPath, irecv) == 88 &&
              offsetof(NetV10, data) + offsetof(DataPath, test) == 104 &&
              offsetof(NetV10, data) + offsetof(DataPath, close_listen) == 128 && offsetof(NetV10, make_vdevice) == 152,
              "ncclNet_v10_t");
static_assert(sizeof(NetV11) == 176 && offsetof(NetV11, data) == 48 && offsetof(NetV11, make_vdevice) == 152 &&
              offsetof(NetV11, finalize) == 160 && offsetof(NetV11, set_net_attr) == 168, "ncclNet_v11_t");
static_assert(sizeof(NetV12) == 176 && offsetof(NetV12, data) == 48 && offsetof(NetV12, make_vdevice) == 152 &&
              offsetof(NetV12, finalize) == 160 && offsetof(NetV12, set_net_attr) == 168, "ncclNet_v12_t");
#endif

}  // namespace r2ccl::nccl::abi
