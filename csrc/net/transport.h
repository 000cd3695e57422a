// The transport interface: a NIC, a listener on it, and byte-stream connections that are
// bound to it. Nonblocking throughout; readiness is reported through a pollable fd so one
// progress engine can drive many connections. Knows nothing of rails, collectives or JAX.
#pragma once
#include <netinet/in.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace r2ccl {

// A NIC as the user named it (interface name or IPv4 address), resolved to an address.
struct Nic {
  std::string name;     // as given: "eth1", "nic0" or "127.0.0.2"
  std::string ifname;   // kernel interface name; empty if it could not be resolved
  in_addr addr{};       // the IPv4 address traffic on this NIC uses as its source
  std::string addr_str() const;
};

// Resolves "nic0", "eth1" or "198.18.0.1" to a Nic; throws Error(kInvalidArgument) naming the
// input when no such interface or local address exists.
Nic resolve_nic(const std::string& name);

struct NetAddr {
  sockaddr_in sa{};
  std::string str() const;                            // "ip:port"
  static NetAddr parse(const std::string& ip_port);   // throws Error(kInvalidArgument)
};

// The outcome of one nonblocking transfer.
struct IoResult {
  enum Kind { kOk, kWouldBlock, kEof, kError } kind;
  size_t bytes;    // bytes moved when kOk
  int err;         // errno when kError
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual int fd() const = 0;
  // Finishes a nonblocking connect: kOk once established, kWouldBlock while pending, kError
  // with the errno when it failed (also when connect() itself failed at once).
  virtual IoResult finish_connect() = 0;
  virtual IoResult writev(const iovec* iov, int iovcnt) = 0;
  virtual IoResult read(void* buf, size_t len) = 0;
  // Ends traffic in both directions now (the peer sees EOF or a reset).
  virtual void shutdown() = 0;
  virtual std::string describe() const = 0;           // "198.18.0.1:40000->198.18.0.2:5000"
};

class Listener {
 public:
  virtual ~Listener() = default;
  virtual int fd() const = 0;
  virtual NetAddr local_addr() const = 0;
  // Accepts one pending connection, or returns null when none is pending.
  virtual std::unique_ptr<Connection> accept() = 0;
};

struct SocketOptions {
  int buffer_bytes = 0;          // SO_SNDBUF/SO_RCVBUF when > 0
  int user_timeout_ms = 0;       // TCP_USER_TIMEOUT when > 0
  bool bind_device = true;       // SO_BINDTODEVICE when the NIC has an interface name
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual std::unique_ptr<Listener> listen(const Nic& nic, int port, const SocketOptions& opt) = 0;
  // Starts a nonblocking connect from `local` to `remote`; finish with finish_connect().
  virtual std::unique_ptr<Connection> connect(const Nic& local, const NetAddr& remote,
                                              const SocketOptions& opt) = 0;
};

std::unique_ptr<Transport> make_socket_transport();

}  // namespace r2ccl
