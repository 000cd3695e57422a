// sysfs -> RdmaPort (rdma_ports.h).
#include "net/ibverbs/rdma_ports.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>

#include "base/sysfs.h"

namespace r2ccl {
namespace {

bool numeric(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "0000:0000:0000:0000:0000:ffff:c612:0101" -> "198.18.1.1"; "" when not an IPv4-mapped GID.
std::string mapped_ipv4(const std::string& gid) {
  std::string hex;
  for (char c : gid)
    if (c != ':') hex += c;
  if (hex.size() != 32 || hex.compare(0, 24, "00000000000000000000ffff") != 0) return "";
  unsigned long v = std::strtoul(hex.substr(24).c_str(), nullptr, 16);
  in_addr a{};
  a.s_addr = htonl(static_cast<uint32_t>(v));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace

std::vector<RdmaPort> rdma_ports(const std::string& sys_root) {
  const std::string base = (sys_root.empty() ? std::string("/sys") : sys_root) + "/class/infiniband";
  std::vector<RdmaPort> out;
  auto devs = list_dir(base);
  std::sort(devs.begin(), devs.end());
  for (const auto& dev : devs) {
    auto ports = list_dir(base + "/" + dev + "/ports");
    std::sort(ports.begin(), ports.end(), [](const std::string& a, const std::string& b) {
      return std::atoi(a.c_str()) < std::atoi(b.c_str());
    });
    auto dev_net = list_dir(base + "/" + dev + "/device/net");
    for (const auto& p : ports) {
      if (!numeric(p)) continue;
      const std::string pd = base + "/" + dev + "/ports/" + p;
      RdmaPort r;
      r.device = dev;
      r.port = std::atoi(p.c_str());
      std::string st = read_first_line(pd + "/state");   // "4: ACTIVE"
      r.state = std::atoi(st.c_str());
      auto colon = st.find(':');
      r.state_name = colon == std::string::npos ? st : st.substr(colon + 1 + (colon + 1 < st.size() && st[colon + 1] == ' '));
      r.link_layer = read_first_line(pd + "/link_layer");
      r.rate = read_first_line(pd + "/rate");
      auto gids = list_dir(pd + "/gids");
      std::sort(gids.begin(), gids.end(), [](const std::string& a, const std::string& b) {
        return std::atoi(a.c_str()) < std::atoi(b.c_str());
      });
      for (const auto& g : gids) {
        if (!numeric(g)) continue;
        // A GID table has up to hundreds of slots, mostly empty (all zeros): the type and netdev
        // are read only for IPv4-mapped ones, so a scan costs one read per slot.
        std::string ip = mapped_ipv4(read_first_line(pd + "/gids/" + g));
        if (ip.empty()) continue;
        // Unset GID slots (and some providers) answer EINVAL for the type: skip those.
        if (read_first_line(pd + "/gid_attrs/types/" + g) != "RoCE v2") continue;
        r.roce_v2_ipv4.push_back({std::atoi(g.c_str()), ip});
        if (r.netdev.empty()) r.netdev = read_first_line(pd + "/gid_attrs/ndevs/" + g);
      }
      if (r.netdev.empty() && dev_net.size() == 1) r.netdev = dev_net[0];
      out.push_back(std::move(r));
    }
  }
  return out;
}

bool rdma_port_for(const Nic& nic, const std::vector<RdmaPort>& ports, int gid_index, RdmaPort* port, int* gid,
                   std::string* why) {
  const std::string ip = nic.addr_str();
  for (const auto& p : ports)
    for (const auto& g : p.roce_v2_ipv4)
      if (g.ipv4 == ip) {
        *port = p;
        *gid = gid_index >= 0 ? gid_index : g.index;
        return true;
      }
  for (const auto& p : ports)
    if (p.link_layer == "InfiniBand" && !nic.ifname.empty() && p.netdev == nic.ifname) {
      *port = p;
      *gid = gid_index >= 0 ? gid_index : 0;
      return true;
    }
  if (why)
    *why = ports.empty() ? "this host has no RDMA device (/sys/class/infiniband is empty or absent)"
                         : "no RDMA port has a RoCEv2 GID for " + ip + (nic.ifname.empty() ? "" : " (" + nic.ifname + ")") +
                               " and no InfiniBand port serves that interface";
  return false;
}

}  // namespace r2ccl
