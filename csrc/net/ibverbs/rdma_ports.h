// Which RDMA device and port serve a NIC, read from sysfs: the one map of netdev <-> RDMA
// device, port and RoCEv2 GID, used by the verbs backend to open a NIC's port and by
// `jax-r2ccl doctor` (through _core.rdma_ports) to show it. Needs no libibverbs: a host
// without rdma-core has no /sys/class/infiniband and gets an empty list.
// Knows sysfs and NICs; nothing of queue pairs, rails or frames.
#pragma once
#include <string>
#include <vector>

#include "net/transport.h"

namespace r2ccl {

struct RdmaPort {
  std::string device;        // "mlx5_0", "rxe_eth1"
  int port = 0;              // 1-based
  int state = 0;             // ibv_port_state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
  std::string state_name;    // "ACTIVE"
  std::string link_layer;    // "Ethernet" (RoCE) or "InfiniBand"
  std::string rate;          // "100 Gb/sec (4X EDR)", as sysfs says it
  // The netdev this port serves: the ndev of its GIDs (RoCE), or the device's net/ entry (IB).
  std::string netdev;
  // RoCEv2 GIDs of IPv4 addresses on this port: index and the address ("198.18.1.1").
  struct Gid {
    int index = 0;
    std::string ipv4;
  };
  std::vector<Gid> roce_v2_ipv4;
  bool active() const { return state == 4 || state == 5; }
};

// Every port of every device under `sys_root`/class/infiniband ("" -> "/sys").
std::vector<RdmaPort> rdma_ports(const std::string& sys_root = "");

// The port serving `nic` and its GID index: the port whose RoCEv2 GID table holds the NIC's
// IPv4 address (RoCE), else an InfiniBand port whose netdev is the NIC's interface (IPoIB,
// GID 0). `gid_index` >= 0 overrides the index found. Returns false, with `why` saying so,
// when no port serves the NIC.
bool rdma_port_for(const Nic& nic, const std::vector<RdmaPort>& ports, int gid_index, RdmaPort* port, int* gid,
                   std::string* why);

}  // namespace r2ccl
