// The socket backend as the registry sees it (net/registry.h): frames as bytes on TCP
// streams, serving every NIC. Also its factory, for tests that drive the seam directly.
#pragma once
#include <cstddef>
#include <memory>

#include "net/registry.h"
#include "net/transport.h"

namespace r2ccl {

const TransportBackend& socket_backend();

// io_threads 0: a link's syscalls run on the thread that polls it; N > 0: on N I/O threads
// the NICs are dealt to (net/socket/io_threads.h).
std::unique_ptr<Transport> make_socket_transport(int io_threads);

// R2CCL_IO_THREADS resolved for a process with `nics` NICs (-1: auto).
int resolve_io_threads(int setting, size_t nics);

}  // namespace r2ccl
