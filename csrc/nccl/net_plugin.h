// The NCCL net plugin's engine room, one per process: the endpoint whose rails carry every
// NCCL connection, the devices NCCL sees, and the comms and requests it hands out. The tables
// NCCL loads (nccl/tables.cc) are thin adapters over it, one per plugin version. Host memory
// only (NCCL_PTR_HOST): NCCL's kernels read and write pinned host buffers it registered once,
// and its proxy thread calls isend/irecv/test on them; GPUDirect is a later issue.
//
// Threads: NCCL calls init/devices/getProperties from the thread creating a communicator,
// listen/connect/accept/regMr/close from its proxy service thread, isend/irecv/test from its
// progress thread, for many communicators at once. Every method is safe from any of them.
//
// Errors: a rail's failure never reaches NCCL (NCCL ends the communicator on any error);
// only a connection whose every rail stayed down past R2CCL_TIMEOUT, or whose peer is gone,
// fails its requests, and the text through NCCL's logger names the cause and the rails.
//
// Close: every comm has one lifecycle (docs/design.md §12's table): closeSend/closeRecv return
// at once and never lose a send test() reported done (the engine delivers it, bounded by
// R2CCL_TIMEOUT); a comm closed before its handshake still tells the listener, whose accept
// then returns it at once (its receives fail, peer_gone); an orderly close logs at INFO.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "core/endpoint.h"
#include "monitor/monitor.h"
#include "nccl/handle.h"
#include "nccl/net_abi.h"
#include "nccl/plugin_identity.h"

namespace r2ccl::nccl {

// The name NCCL matches NCCL_NET against (case-insensitive) and logs.
inline constexpr char kPluginName[] = "r2ccl";

// What getProperties reports of a device, whatever the table's version.
struct DeviceInfo {
  std::string name;        // fused: "r2ccl"; per NIC: "r2ccl:<interface or address>"
  std::string pci_path;    // sysfs path of the NIC's PCI device ("" if none: loopback, veth); fused: the first NIC's
  uint64_t guid = 0;       // distinct per device (NCCL takes devices of one guid for ports of one NIC)
  int speed_mbps = 0;      // the NIC's link speed; fused: every NIC's added up (it stripes over all of them)
  int max_comms = 0;
};

class NetPlugin {
 public:
  // The process's plugin (never destroyed: NCCL may call in from any thread until exit).
  static NetPlugin& instance();

  // A communicator starts using the plugin (v11, v12: every init; v10: once). The first brings
  // the endpoint up from the R2CCL_* environment (R2CCL_NICS, R2CCL_SECRET, ...).
  abi::Result init(abi::Logger log);
  // A communicator is done with it; the last one closes the endpoint (a later init opens a new one).
  abi::Result finalize();
  abi::Result devices(int* n);
  abi::Result device(int dev, DeviceInfo* out);

  abi::Result listen(int dev, void* handle, void** listen_comm);
  abi::Result connect(int dev, void* handle, void** send_comm);
  abi::Result accept(void* listen_comm, void** recv_comm);
  // regMr, and regMrDmaBuf where `dmabuf_fd` >= 0 (host memory only until device memory
  // moves: ptrSupport never says CUDA or DMABUF yet, so NCCL hands none; docs/design.md §10).
  abi::Result reg_mr(void* comm, void* data, size_t size, int type, void** mhandle, int dmabuf_fd = -1,
                     uint64_t dmabuf_offset = 0);
  abi::Result dereg_mr(void* comm, void* mhandle);
  abi::Result isend(void* send_comm, void* data, size_t size, void** request);
  abi::Result irecv(void* recv_comm, int n, void** data, size_t* sizes, void** request);
  abi::Result test(void* request, int* done, int* sizes);
  abi::Result close_send(void* send_comm);
  abi::Result close_recv(void* recv_comm);
  abi::Result close_listen(void* listen_comm);

  // Logs through NCCL's logger when NCCL gave one (else the core's, on stderr). From the first
  // init with a logger, the core's own lines (rails failing, recovering; R2CCL_DEBUG) go there too.
  void log(abi::LogLevel level, const std::string& line);

  // The endpoint (null before init).
  std::shared_ptr<Endpoint> endpoint();
  // The health monitor's snapshot of the plugin's rails, NICs and latest events as JSON
  // (monitor/health_json.h), with "devices" (fused or nic) and "monitor" (on, off or
  // "not initialized": before the first init or after the last finalize).
  std::string health_json();

  // Test-only fault injection from outside NCCL (docs/design.md §12): when
  // R2CCL_TEST_FAULT_FILE names a file, a thread reads it whenever it changes and applies each
  // line to the running plugin: "close R", "stall R", "heal R" (rail R of every connection),
  // "nic_down N", "nic_up N" (local NIC N, as the health monitor declares it), "throw" (the
  // engine thread throws while handling each connection open now: they fail, the process and
  // later connections go on; Engine::testing_throw_on). Each applied
  // line is logged ("test fault: ...") through NCCL's logger.
  static constexpr char kFaultFileEnv[] = "R2CCL_TEST_FAULT_FILE";

 private:
  NetPlugin() = default;
  struct Comm;
  struct Request;
  abi::Result fail(abi::Result r, const std::string& why);
  int device_count();
  void watch_faults(std::string path);
  void apply_fault(const std::string& line);
  abi::Result post(Comm* c, bool recv, void* data, size_t size, void** request);

  std::mutex mu_;
  std::atomic<abi::Logger> logger_{nullptr};   // (atomic: the core's log sink reads it on any thread)
  int users_ = 0;
  std::shared_ptr<Endpoint> ep_;
  std::shared_ptr<monitor::Monitor> monitor_;   // link events, weights, black holes (R2CCL_MONITOR_MS > 0)
  PluginIdentity* identity_ = nullptr;   // owned by ep_'s engine
  std::thread fault_watcher_;
  std::mutex fault_mu_;
  std::condition_variable fault_cv_;
  bool fault_stop_ = false;
  double accept_timeout_s_ = 0;          // R2CCL_BOOTSTRAP_TIMEOUT: a listen nobody connects to fails then
  // The devices NCCL sees (R2CCL_NCCL_DEVICES): one fused device, or one per NIC.
  bool per_nic_ = false;
  std::vector<DeviceInfo> devs_;
};

}  // namespace r2ccl::nccl
