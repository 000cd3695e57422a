// NIC and address resolution, shared by every backend.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "base/error.h"
#include "net/transport.h"

namespace r2ccl {

const char* link_error_name(LinkError e) {
  switch (e) {
    case LinkError::kNone: return "none";
    case LinkError::kRefused: return "refused";
    case LinkError::kUnreachable: return "unreachable";
    case LinkError::kTimedOut: return "timed_out";
    case LinkError::kClosedByPeer: return "closed_by_peer";
    case LinkError::kIo: return "io";
    case LinkError::kAbandoned: return "abandoned";
  }
  return "?";
}

void Transport::throw_no_dmabuf() const {
  throw Error(Cause::kInvalidArgument, -1,
              std::string("registering a dma-buf (GPUDirect) over ") + name() + ": " + dmabuf_support());
}

std::string Nic::addr_str() const {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr, buf, sizeof buf);
  return buf;
}

std::vector<std::string> default_nics() {
  std::vector<std::string> out;
  if (struct if_nameindex* list = if_nameindex()) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    for (struct if_nameindex* i = list; fd >= 0 && i->if_index != 0; i++) {
      const std::string name = i->if_name;
      if (name == "lo") continue;
      std::ifstream f("/sys/class/net/" + name + "/operstate");
      std::string state;
      if (!(f >> state) || (state != "up" && state != "unknown")) continue;
      struct ifreq req {};
      std::strncpy(req.ifr_name, name.c_str(), IFNAMSIZ - 1);
      if (::ioctl(fd, SIOCGIFADDR, &req) == 0) out.push_back(name);
    }
    if (fd >= 0) ::close(fd);
    if_freenameindex(list);
  }
  if (out.empty()) out.push_back("127.0.0.1");
  return out;
}

Nic resolve_nic(const std::string& name) {
  Nic nic;
  nic.name = name;
  in_addr want{};
  bool is_addr = inet_pton(AF_INET, name.c_str(), &want) == 1;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    throw Error(Cause::kSystem, -1, std::string("getifaddrs failed: ") + std::strerror(errno));
  bool found = false;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    in_addr a = reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr;
    if (is_addr ? a.s_addr == want.s_addr : name == it->ifa_name) {
      nic.ifname = it->ifa_name;
      nic.addr = a;
      found = true;
      break;
    }
  }
  freeifaddrs(list);
  if (!found && is_addr && (ntohl(want.s_addr) >> 24) == 127) {
    // Every 127/8 address is local on Linux even when only 127.0.0.1 is listed.
    nic.ifname = "lo";
    nic.addr = want;
    found = true;
  }
  if (!found)
    throw Error(Cause::kInvalidArgument, -1,
                "NIC '" + name + "' is neither a local interface with an IPv4 address nor a local IPv4 address");
  return nic;
}

std::string NetAddr::str() const {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

NetAddr NetAddr::parse(const std::string& ip_port) {
  NetAddr a;
  auto colon = ip_port.rfind(':');
  if (colon == std::string::npos)
    throw Error(Cause::kInvalidArgument, -1, "address '" + ip_port + "' is not IP:PORT");
  std::string ip = ip_port.substr(0, colon);
  std::string port = ip_port.substr(colon + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p <= 0 || p > 65535 || inet_pton(AF_INET, ip.c_str(), &a.sa.sin_addr) != 1)
    throw Error(Cause::kInvalidArgument, -1, "address '" + ip_port + "' is not IPv4:PORT");
  a.sa.sin_family = AF_INET;
  a.sa.sin_port = htons(static_cast<uint16_t>(p));
  return a;
}

}  // namespace r2ccl
