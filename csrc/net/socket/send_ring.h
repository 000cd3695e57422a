// The socket backend's send queue: the sends posted on one link, in order, and how much of the
// next one a write takes. Internal to net/socket (tcp_link.cc and io_threads.cc keep their
// posts in one); the stream under it is net/tcp.
#pragma once
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "net/transport.h"

namespace r2ccl {
namespace socket_detail {

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

}  // namespace socket_detail
}  // namespace r2ccl
