// The socket backend's byte stream: a nonblocking TCP socket bound to its NIC, and the calls
// that make one (listen, accept, connect). Internal to net/socket: the rest of the project
// sees only the frame seam (net/transport.h), which tcp_link.cc builds on this.
#pragma once
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "net/transport.h"

namespace r2ccl {
namespace socket_detail {

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

// Payload a link drops (the rest of a cancelled receive) is read in steps of this.
inline constexpr size_t kDropBytes = 256 << 10;

// The sends posted on one link, oldest first: both socket links (tcp_link.cc, io_threads.cc)
// keep theirs in one. Not thread-safe: its owner guards it.
struct SendRing {
  static constexpr size_t kSlots = 8;
  struct Out {
    uint8_t hdr[kMaxLinkHeaderBytes];
    const uint8_t* payload = nullptr;
    size_t len = 0;      // payload bytes
    size_t done = 0;     // header and payload bytes written
    uint64_t cookie = 0;
  };
  Out ring[kSlots];
  size_t head = 0, count = 0;

  bool full() const { return count == kSlots; }
  Out& at(size_t i) { return ring[(head + i) % kSlots]; }   // the i-th oldest
  const Out& at(size_t i) const { return ring[(head + i) % kSlots]; }
  void push(const SendPost& p, size_t header_bytes) {
    Out& o = at(count);
    std::memcpy(o.hdr, p.header, header_bytes);
    o.payload = static_cast<const uint8_t*>(p.payload);
    o.len = p.payload_len;
    o.cookie = p.cookie;
    o.done = 0;
    count++;
  }
  void pop() {
    head = (head + 1) % kSlots;
    count--;
  }
  // The unfinished post with `cookie` now reads its payload from `payload` (a finished one
  // reads nothing any more).
  void move_payload(uint64_t cookie, const void* payload) {
    for (size_t i = 0; i < count; i++)
      if (at(i).cookie == cookie) at(i).payload = static_cast<const uint8_t*>(payload);
  }
};

// The iovecs of the next write of `o` (a frame with a header of `header_bytes`), at most
// `budget` bytes; returns how many (1 or 2).
inline int next_write(const SendRing::Out& o, size_t header_bytes, size_t budget, iovec iov[2]) {
  const size_t left = std::min(header_bytes + o.len - o.done, budget);
  if (o.done >= header_bytes) {
    iov[0] = {const_cast<uint8_t*>(o.payload) + (o.done - header_bytes), left};
    return 1;
  }
  iov[0] = {const_cast<uint8_t*>(o.hdr) + o.done, std::min(header_bytes - o.done, left)};
  const size_t rest = left - iov[0].iov_len;
  if (rest == 0) return 1;
  iov[1] = {const_cast<uint8_t*>(o.payload), rest};
  return 2;
}

// A listening socket on `nic` (port 0: any); throws Error(kSystem) naming the NIC.
int listen_socket(const Nic& nic, int port, const LinkOptions& opt);
// One pending connection of listener `fd`, or null when none is pending.
std::unique_ptr<StreamSocket> accept_socket(int fd, const Nic& nic, const LinkOptions& opt);
// A nonblocking connect from `local` to `remote`; an immediate failure is kept for
// finish_connect. Throws Error(kSystem) when no socket can be made or bound.
std::unique_ptr<StreamSocket> connect_socket(const Nic& local, const NetAddr& remote, const LinkOptions& opt);
NetAddr local_addr_of(int fd);

}  // namespace socket_detail
}  // namespace r2ccl
