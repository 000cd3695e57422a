// The socket backend's registry entry (socket_backend.h) and its I/O thread count.
#include "net/socket/socket_backend.h"

#include <sched.h>

#include <algorithm>
#include <string>
#include <thread>

#include "base/log.h"

namespace r2ccl {

namespace {
// The CPUs this process may run on.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

// R2CCL_IO_THREADS: -1 (auto) gives one thread per NIC where there are two NICs or more and
// the process may run on at least kIoCpusPerNic CPUs per NIC, else 0 (measured: 8 loopback
// rails on 16 CPUs, 4.1 GB/s on the progress thread alone, 14.6 GB/s with 8 I/O threads, and 1
// I/O thread slower than none; on 2 CPUs no gain, and striping skews as the threads compete
// for the cores; BENCHMARKS.md).
int resolve_io_threads(int setting, size_t nics) {
  if (setting >= 0) return setting;
  const size_t cpus = static_cast<size_t>(usable_cpus());
  if (nics < 2 || cpus < static_cast<size_t>(kIoCpusPerNic) * nics) return 0;
  return static_cast<int>(std::min<size_t>(nics, static_cast<size_t>(kIoThreadsMax)));
}

const TransportBackend& socket_backend() {
  static const TransportBackend b{
      "socket", "", 0,
      [](const std::vector<Nic>& nics, const Config&) { return std::vector<std::string>(nics.size()); },
      [](const Config& cfg, size_t nics) {
        const int threads = resolve_io_threads(cfg.io_threads, nics);
        R2_INFO("socket I/O: %s", threads ? (std::to_string(threads) + " I/O thread(s)").c_str() : "on the progress thread");
        return make_socket_transport(threads);
      }};
  return b;
}

}  // namespace r2ccl
