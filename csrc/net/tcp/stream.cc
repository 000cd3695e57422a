// The TCP stream (stream.h): every connection bound to its NIC's source address (and, when
// allowed, the device itself), nonblocking, TCP_NODELAY, large buffers, and TCP_USER_TIMEOUT so
// a dead path errors in bounded time. Knows nothing of rails, frames or verbs.
#include "net/tcp/stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"

namespace r2ccl {
namespace tcp {
namespace {

[[noreturn]] void throw_sys(const std::string& what) {
  throw Error(Cause::kSystem, -1, what + ": " + std::strerror(errno));
}

void set_options(int fd, const Nic& nic, const LinkOptions& opt) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (opt.buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt.buffer_bytes, sizeof opt.buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &opt.buffer_bytes, sizeof opt.buffer_bytes);
  }
  if (opt.user_timeout_ms > 0) {
    unsigned t = static_cast<unsigned>(opt.user_timeout_ms);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &t, sizeof t);
  }
  // Binding to the device keeps traffic on this NIC even where routing would pick another.
  if (opt.bind_device && !nic.ifname.empty() && nic.ifname != "lo") {
    if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, nic.ifname.c_str(),
                   static_cast<socklen_t>(nic.ifname.size())) != 0) {
      static bool warned = false;
      if (!warned) {
        warned = true;
        R2_INFO("SO_BINDTODEVICE(%s) not permitted (%s); binding to the source address only",
                nic.ifname.c_str(), std::strerror(errno));
      }
    }
  }
}

int new_socket() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_sys("socket");
  return fd;
}

}  // namespace

StreamSocket::StreamSocket(int fd, std::string desc, int immediate_err)
    : fd_(fd), desc_(std::move(desc)), immediate_err_(immediate_err) {}
StreamSocket::~StreamSocket() { ::close(fd_); }

IoResult StreamSocket::finish_connect() {
  if (immediate_err_ != 0) return {IoResult::kError, 0, immediate_err_};
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == EINPROGRESS || err == EALREADY) return {IoResult::kWouldBlock, 0, 0};
  if (err != 0) return {IoResult::kError, 0, err};
  // SO_ERROR is 0 both when connected and while still pending: ask the peer name.
  sockaddr_in peer{};
  socklen_t plen = sizeof peer;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &plen) != 0)
    return errno == ENOTCONN ? IoResult{IoResult::kWouldBlock, 0, 0} : IoResult{IoResult::kError, 0, errno};
  return {IoResult::kOk, 0, 0};
}

IoResult StreamSocket::writev(const iovec* iov, int iovcnt) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return {IoResult::kOk, static_cast<size_t>(n), 0};
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {IoResult::kWouldBlock, 0, 0};
  return {IoResult::kError, 0, errno};
}

IoResult StreamSocket::read(void* buf, size_t len) {
  ssize_t n = ::recv(fd_, buf, len, MSG_DONTWAIT);
  if (n > 0) return {IoResult::kOk, static_cast<size_t>(n), 0};
  if (n == 0) return {IoResult::kEof, 0, 0};
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {IoResult::kWouldBlock, 0, 0};
  return {IoResult::kError, 0, errno};
}

void StreamSocket::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

static std::string sock_desc(int fd) {
  sockaddr_in a{}, b{};
  socklen_t la = sizeof a, lb = sizeof b;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la);
  getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb);
  NetAddr x, y;
  x.sa = a;
  y.sa = b;
  return x.str() + "->" + y.str();
}

NetAddr local_addr_of(int fd) {
  NetAddr a;
  socklen_t len = sizeof a.sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a.sa), &len);
  return a;
}

int listen_socket(const Nic& nic, int port, const LinkOptions& opt) {
  int fd = new_socket();
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Accepted sockets inherit buffer sizes from the listener; they must be set before listen().
  if (opt.buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt.buffer_bytes, sizeof opt.buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &opt.buffer_bytes, sizeof opt.buffer_bytes);
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = nic.addr;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    throw_sys("listen on " + nic.addr_str() + ":" + std::to_string(port) + " (NIC " + nic.name + ")");
  }
  return fd;
}

std::unique_ptr<StreamSocket> accept_socket(int lfd, const Nic& nic, const LinkOptions& opt) {
  int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return nullptr;   // EAGAIN, or a connection that died while queued
  set_options(fd, nic, opt);
  return std::make_unique<StreamSocket>(fd, sock_desc(fd));
}

std::unique_ptr<StreamSocket> connect_socket(const Nic& local, const NetAddr& remote, const LinkOptions& opt) {
  int fd = new_socket();
  set_options(fd, local, opt);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr = local.addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    throw_sys("bind to " + local.addr_str() + " (NIC " + local.name + ")");
  }
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&remote.sa), sizeof remote.sa);
  // Refused or unreachable right away: a socket whose finish reports it.
  const int err = rc != 0 && errno != EINPROGRESS ? errno : 0;
  return std::make_unique<StreamSocket>(fd, local.addr_str() + "->" + remote.str(), err);
}

LinkError classify_errno(int err) {
  switch (err) {
    case EPIPE:
    case ECONNRESET: return LinkError::kClosedByPeer;
    case ECONNREFUSED: return LinkError::kRefused;
    case ETIMEDOUT: return LinkError::kTimedOut;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EADDRNOTAVAIL:
    case EINVAL: return LinkError::kUnreachable;
    default: return LinkError::kIo;
  }
}

}  // namespace tcp
}  // namespace r2ccl
