// The TCP stream both backends use: a nonblocking socket bound to its NIC, the calls that
// make one, and what an errno means for a link. It carries the socket backend's frames and the
// verbs backend's setup and peer-death signal. Knows sockets; nothing of frames or verbs.
#pragma once
#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>

#include "net/transport.h"

namespace r2ccl {
namespace tcp {

// The outcome of one nonblocking transfer.
struct IoResult {
  enum Kind { kOk, kWouldBlock, kEof, kError } kind;
  size_t bytes;    // bytes moved when kOk
  int err;         // errno when kError
};

class StreamSocket {
 public:
  // `immediate_err`: connect() itself failed with this errno (no route, EINVAL, refused at
  // once); finish_connect() reports it, since the socket's SO_ERROR never will.
  StreamSocket(int fd, std::string desc, int immediate_err = 0);
  ~StreamSocket();
  StreamSocket(const StreamSocket&) = delete;
  StreamSocket& operator=(const StreamSocket&) = delete;
  int fd() const { return fd_; }
  // kOk once established, kWouldBlock while pending, kError with the errno when it failed.
  IoResult finish_connect();
  IoResult writev(const iovec* iov, int iovcnt);
  IoResult read(void* buf, size_t len);
  void shutdown();
  const std::string& describe() const { return desc_; }

 private:
  int fd_;
  std::string desc_;
  int immediate_err_;
};

// A listening socket on `nic` (port 0: any); throws Error(kSystem) naming the NIC.
int listen_socket(const Nic& nic, int port, const LinkOptions& opt);
// One pending connection of listener `fd`, or null when none is pending.
std::unique_ptr<StreamSocket> accept_socket(int fd, const Nic& nic, const LinkOptions& opt);
// A nonblocking connect from `local` to `remote`; an immediate failure is kept for
// finish_connect. Throws Error(kSystem) when no socket can be made or bound.
std::unique_ptr<StreamSocket> connect_socket(const Nic& local, const NetAddr& remote, const LinkOptions& opt);
NetAddr local_addr_of(int fd);

// The link error a failed socket call's errno stands for.
LinkError classify_errno(int err);

}  // namespace tcp
}  // namespace r2ccl
