// The verbs backend's parts that need no RDMA device: the sysfs map of NICs to RDMA ports
// (over a fake sysfs tree: a Soft-RoCE port with its RoCEv2 GID of an IPv4 address, an
// InfiniBand port serving an IPoIB interface, empty GID slots, a port that is DOWN), the
// option checks, and that a host where the backend cannot run gets a reason, not a crash.
// The backend itself runs in tests/test_verbs.py, on Soft-RoCE guests. Standalone: exits
// non-zero and names each failing check.
#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"
#include "net/ibverbs/rdma_ports.h"
#include "net/ibverbs/verbs_transport.h"

using namespace r2ccl;

static int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    g_failures++;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

void mkdirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); i++)
    if (i == path.size() || path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
}

void put(const std::string& path, const std::string& text) {
  mkdirs(path.substr(0, path.rfind('/')));
  std::ofstream(path) << text << "\n";
}

Nic nic(const char* ip, const char* ifname) {
  Nic n;
  n.name = ifname;
  n.ifname = ifname;
  inet_pton(AF_INET, ip, &n.addr);
  return n;
}

int main() {
  char tmpl[] = "/tmp/r2ccl-sysfs-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  const std::string ib = root + "/class/infiniband";
  // Soft-RoCE on eth1: slot 0 a link-local GID (RoCE v1), slot 1 the IPv4 one (RoCE v2),
  // slot 2 the same address as RoCE v1, slots 3.. empty.
  const std::string rxe = ib + "/rxe_eth1/ports/1";
  put(rxe + "/state", "4: ACTIVE");
  put(rxe + "/link_layer", "Ethernet");
  put(rxe + "/rate", "2.5 Gb/sec (1X SDR)");
  put(rxe + "/gids/0", "fe80:0000:0000:0000:5054:00ff:fe72:0100");
  put(rxe + "/gid_attrs/types/0", "IB/RoCE v1");
  put(rxe + "/gids/1", "0000:0000:0000:0000:0000:ffff:c612:0101");
  put(rxe + "/gid_attrs/types/1", "RoCE v2");
  put(rxe + "/gid_attrs/ndevs/1", "eth1");
  put(rxe + "/gids/2", "0000:0000:0000:0000:0000:ffff:c612:0101");
  put(rxe + "/gid_attrs/types/2", "IB/RoCE v1");
  for (int i = 3; i < 12; i++) put(rxe + "/gids/" + std::to_string(i), "0000:0000:0000:0000:0000:0000:0000:0000");
  // A RoCE port that is DOWN, on eth2.
  const std::string down = ib + "/rxe_eth2/ports/1";
  put(down + "/state", "1: DOWN");
  put(down + "/link_layer", "Ethernet");
  put(down + "/gids/1", "0000:0000:0000:0000:0000:ffff:c612:0201");
  put(down + "/gid_attrs/types/1", "RoCE v2");
  put(down + "/gid_attrs/ndevs/1", "eth2");
  // InfiniBand: mlx5_0 port 1 serves ib0 (IPoIB); its GIDs are not IPv4-mapped.
  const std::string mlx = ib + "/mlx5_0";
  put(mlx + "/ports/1/state", "4: ACTIVE");
  put(mlx + "/ports/1/link_layer", "InfiniBand");
  put(mlx + "/ports/1/gids/0", "fe80:0000:0000:0000:0002:c903:00a1:b2c3");
  mkdirs(mlx + "/device/net/ib0");

  const auto ports = rdma_ports(root);
  check(ports.size() == 3, "three ports found, got " + std::to_string(ports.size()));
  if (ports.size() == 3) {
    const RdmaPort& m = ports[0];   // sorted by device name: mlx5_0, rxe_eth1, rxe_eth2
    check(m.device == "mlx5_0" && m.port == 1 && m.link_layer == "InfiniBand" && m.active() && m.netdev == "ib0" &&
              m.roce_v2_ipv4.empty(),
          "the InfiniBand port, its IPoIB netdev and no RoCEv2 GIDs");
    const RdmaPort& r = ports[1];
    check(r.device == "rxe_eth1" && r.state == 4 && r.state_name == "ACTIVE" && r.active() && r.netdev == "eth1",
          "the Soft-RoCE port: ACTIVE, serving eth1 (state '" + r.state_name + "', netdev '" + r.netdev + "')");
    check(r.roce_v2_ipv4.size() == 1 && r.roce_v2_ipv4[0].index == 1 && r.roce_v2_ipv4[0].ipv4 == "198.18.1.1",
          "only the RoCE v2 GID of 198.18.1.1 (index 1) is taken: not the link-local one, not the v1 twin");
    check(!ports[2].active() && ports[2].state_name == "DOWN", "a DOWN port reads as not active");
  }

  RdmaPort got;
  int gid = -1;
  std::string why;
  check(rdma_port_for(nic("198.18.1.1", "eth1"), ports, -1, &got, &gid, &why) && got.device == "rxe_eth1" && gid == 1,
        "198.18.1.1 maps to rxe_eth1:1, GID 1");
  check(rdma_port_for(nic("198.18.1.1", "eth1"), ports, 3, &got, &gid, &why) && gid == 3,
        "R2CCL_IB_GID_INDEX overrides the GID index found");
  check(rdma_port_for(nic("10.0.0.7", "ib0"), ports, -1, &got, &gid, &why) && got.device == "mlx5_0" && gid == 0,
        "an IPoIB interface maps to its InfiniBand port, GID 0");
  why.clear();
  check(!rdma_port_for(nic("192.0.2.9", "eth9"), ports, -1, &got, &gid, &why) &&
            why.find("192.0.2.9") != std::string::npos,
        "a NIC no port serves: false, and the reason names its address (" + why + ")");
  why.clear();
  check(!rdma_port_for(nic("192.0.2.9", "eth9"), {}, -1, &got, &gid, &why) && why.find("no RDMA device") != std::string::npos,
        "no ports at all: the reason says the host has no RDMA device (" + why + ")");
  check(rdma_ports(root + "/nothing-here").empty(), "a sysfs without class/infiniband: no ports, no error");

  // auto mode refuses a mapped port that is not ACTIVE (whatever the host's libibverbs).
  why.clear();
  check(!verbs_serves(nic("198.18.2.1", "eth2"), VerbsOptions{}, ports, &why) && !why.empty(),
        "a NIC whose port is DOWN is not served by verbs (" + why + ")");

  VerbsOptions o;
  check(o.problem() == nullptr, "the default options have no problem");
  check(o.timeout >= 10 && o.timeout <= 18 && o.retry_count == 7, "timeout 10..18 with 7 retries: a dead path errors in ~0.03-8 s, not NCCL's 34 s");
  o.timeout = 0;
  check(o.problem() && std::string(o.problem()).find("R2CCL_IB_TIMEOUT") != std::string::npos, "timeout 0 (infinite) is refused, naming the setting");
  o = VerbsOptions{};
  o.retry_count = 8;
  check(o.problem() && std::string(o.problem()).find("R2CCL_IB_RETRY_COUNT") != std::string::npos, "retry_count 8 is refused");
  o = VerbsOptions{};
  o.recv_buffers = 2;
  check(o.problem() != nullptr, "fewer than 4 receive buffers is refused");

  // Where the backend cannot run (no rdma-core, no device, or built without the headers),
  // making it throws Error(kSystem) carrying that reason.
  const std::string reason = verbs_unavailable_reason();
  if (!reason.empty()) {
    try {
      make_verbs_transport(VerbsOptions{});
      check(false, "make_verbs_transport succeeded where the backend is unavailable: " + reason);
    } catch (const Error& e) {
      check(e.cause() == Cause::kSystem && std::string(e.what()).find(reason) != std::string::npos,
            std::string("the error carries the reason: ") + e.what());
    }
  }
  std::printf("verbs here: %s\n", reason.empty() ? "available" : reason.c_str());

  std::string rm = "rm -rf '" + root + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", root.c_str());
  if (g_failures) {
    std::fprintf(stderr, "test_verbs_host: %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("test_verbs_host: all checks passed\n");
  return 0;
}
