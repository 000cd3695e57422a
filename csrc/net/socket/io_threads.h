// The socket backend's I/O threads: frames over TCP whose send and receive syscalls run on a
// pool of threads, one set of NICs per thread, so that a process moves bytes on several cores
// while its progress thread keeps the channel logic. Internal to net/socket: tcp_link.cc makes
// these links when the transport was asked for I/O threads (R2CCL_IO_THREADS).
//
// A link's state is shared by the poster (the progress thread, or a caller on the caller's
// path; never two at once) and the link's I/O thread, under one mutex per link that neither
// holds across a syscall. Payload memory is guarded by a second mutex per direction, which the
// I/O thread holds across each syscall that reads or writes it; the poster takes it only to
// move a payload, drop a receive or close the link, so neither waits for the other on the
// per-chunk path and no lock is shared between links. Completions are announced on the link's
// eventfd (wait_fd), readable while any completion waits: the poller watches it for readable
// only (needs_writable_watch() is false).
#pragma once
#include <memory>

#include "net/tcp/stream.h"
#include "net/transport.h"

namespace r2ccl {
namespace socket_detail {

class IoPool;

// `threads` I/O threads; NICs are dealt to them in the order they are first used (NIC k to
// thread k mod threads), and a thread whose NICs all sit on one known NUMA node runs there.
std::shared_ptr<IoPool> make_io_pool(int threads);
int io_pool_threads(const IoPool& pool);

// A link over `s` driven by `pool`'s thread for `nic`.
std::unique_ptr<FrameLink> make_threaded_link(const std::shared_ptr<IoPool>& pool, const Nic& nic,
                                              std::unique_ptr<tcp::StreamSocket> s, size_t header_bytes,
                                              bool connecting);

}  // namespace socket_detail
}  // namespace r2ccl
