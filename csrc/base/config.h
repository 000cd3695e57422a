// The one configuration struct of the C++ core and the source of its defaults. Every field is
// an R2CCL_* setting; base/settings.h names each one's variable and doc and reads the
// environment (once, here in C++: a process that never imports Python, such as NCCL loading
// the net plugin, gets the same settings). jax_r2ccl/config.py derives its table from that one.
// tests/test_parity.py checks both. Knows nothing of sockets, collectives or JAX.
#pragma once
#include <cstdint>
#include <string>

namespace r2ccl {

// Bounds of R2CCL_CHUNK_BYTES. The maximum is also the receiver's cap on one frame's payload
// (a sender never cuts a chunk larger than its chunk_bytes), so the two must move together.
// Exported to Python as _core.constants().
inline constexpr uint64_t kChunkBytesMin = 1024;
inline constexpr uint64_t kChunkBytesMax = 64ull << 20;

// Sends and receives up to this size take the caller's path (R2CCL_POLL_US): a send leaves
// from the caller's thread when the progress thread is idle, a wait polls the network itself.
// Exported to Python as _core.constants().
inline constexpr uint64_t kCallerPathMaxBytes = 32 << 10;

// Largest R2CCL_EAGER_BYTES (an eager send is copied at submit), and what one peer's eager
// sends may hold in copies not yet acknowledged: past it a small send completes when
// acknowledged again, so a sender that outruns its peer is held back instead of buffering.
inline constexpr uint64_t kEagerBytesMax = 1 << 20;
inline constexpr uint64_t kEagerHeldBytes = 4 << 20;

// Bounds of R2CCL_STAGING_CHUNK_BYTES (one step of the device <-> host staging pipeline).
inline constexpr uint64_t kStagingChunkMin = 4096;
inline constexpr uint64_t kStagingChunkMax = 1ull << 30;

// Collectives of at most this many bytes are small: they exchange everything in one step
// (latency rules, not bandwidth) and XLA's thread may wait for them (R2CCL_SYNC_WAIT_US).
// coll/ (kSmallCollectiveBytes) and the setting's doc read it here.
inline constexpr uint64_t kSmallCollectiveBytes = 64 << 10;

// Most socket I/O threads one endpoint runs (R2CCL_IO_THREADS).
inline constexpr int kIoThreadsMax = 64;
// R2CCL_IO_THREADS=-1 (auto) runs one I/O thread per NIC only where there are at least two
// NICs and the process may use at least this many CPUs per NIC; elsewhere none (the progress
// thread makes every socket call). With fewer cores the I/O threads compete for them, gain
// nothing and skew striping (the rail whose thread runs first takes more of the chunks); with
// one NIC a thread only adds a hand-over (BENCHMARKS.md, issue 14).
inline constexpr int kIoCpusPerNic = 2;

// R2CCL_TRANSPORT's values. auto: verbs on every NIC that maps to an ACTIVE RDMA port,
// sockets elsewhere. Exported to Python as _core.names()["transports"].
inline constexpr const char* kTransportNames[] = {"socket", "ibverbs", "auto"};

// R2CCL_NIC_AFFINITY's values.
inline constexpr const char* kNicAffinityNames[] = {"auto", "off"};

// R2CCL_NCCL_DEVICES's values: the devices the NCCL net plugin shows NCCL. fused: one device
// striped over every NIC; nic: one device per NIC, its connections' other rails backups;
// auto: nic where there are >= 2 NICs and each has a PCI device (NCCL places GPUs on the
// NICs nearest them), else fused.
inline constexpr const char* kNcclDevicesNames[] = {"auto", "fused", "nic"};

struct Config {
  std::string nics;                          // R2CCL_NICS: NICs to stripe over (empty: every interface that is up)
  std::string nic_affinity = "auto";         // R2CCL_NIC_AFFINITY: default NICs nearest the GPUs first (kNicAffinityNames)
  std::string nccl_devices = "auto";         // R2CCL_NCCL_DEVICES: the NCCL plugin's devices (kNcclDevicesNames)
  uint64_t chunk_bytes = 256 << 10;          // R2CCL_CHUNK_BYTES: largest payload per data frame
  uint64_t rail_window_bytes = 4 << 20;      // R2CCL_RAIL_WINDOW_BYTES: most unacked bytes one rail may hold
  int rail_queue_ms = 10;                    // R2CCL_RAIL_QUEUE_MS: a rail's window = its bandwidth x this (+ its RTT)
  int conns_per_nic = 1;                     // R2CCL_CONNS_PER_NIC: TCP connections per NIC pair
  std::string transport = "auto";            // R2CCL_TRANSPORT: socket, ibverbs or auto (kTransportNames)
  int ib_timeout = 14;                       // R2CCL_IB_TIMEOUT: verbs ACK timeout exponent (4.096 us x 2^this per try)
  int ib_retry_count = 7;                    // R2CCL_IB_RETRY_COUNT: verbs transport retries before a QP errors
  int ib_gid_index = -1;                     // R2CCL_IB_GID_INDEX: RoCE GID index (-1: the NIC's IPv4 RoCEv2 GID)
  int io_threads = -1;                       // R2CCL_IO_THREADS: socket I/O threads (-1: auto, 0: the progress thread)
  double timeout_s = 30.0;                   // R2CCL_TIMEOUT: all rails down / no progress -> error
  int mismatch_ms = 2000;                    // R2CCL_MISMATCH_MS: a peer evidently in another collective this long -> mismatch
  double bootstrap_timeout_s = 300.0;        // R2CCL_BOOTSTRAP_TIMEOUT: every rank's addresses and rails at start
  int heartbeat_ms = 100;                    // R2CCL_HEARTBEAT_MS: idle-rail heartbeat period
  int heartbeat_misses = 3;                  // R2CCL_HEARTBEAT_MISSES: silent periods before a rail fails
  int rest_heartbeat_ms = 1000;              // R2CCL_REST_HEARTBEAT_MS: heartbeat period of an idle connection (0: off)
  int stall_ms = 250;                        // R2CCL_STALL_MS: busy rail without acks while siblings progress
  int reprobe_ms = 200;                      // R2CCL_REPROBE_MS: retry period for a failed rail (failback)
  int connect_timeout_ms = 2000;             // R2CCL_CONNECT_TIMEOUT_MS: one connect + handshake attempt
  int tcp_user_timeout_ms = 5000;            // R2CCL_TCP_USER_TIMEOUT_MS: kernel bound on unacked data
  int socket_buffer_bytes = 4 << 20;         // R2CCL_SOCKET_BUFFER_BYTES: SO_SNDBUF / SO_RCVBUF
  bool crc = false;                          // R2CCL_CRC: CRC32C over every payload
  bool bind_device = true;                   // R2CCL_BIND_DEVICE: SO_BINDTODEVICE when a NIC has a name
  int port = 0;                              // R2CCL_PORT: first listen port (0: any free port)
  uint64_t max_message_bytes = 1ull << 36;   // R2CCL_MAX_MESSAGE_BYTES: largest message accepted
  int monitor_ms = 50;                       // R2CCL_MONITOR_MS: health monitor sampling period (0: no monitor)
  bool adaptive_weights = true;              // R2CCL_ADAPTIVE_WEIGHTS: rail weights follow measured bandwidth
  int link_holddown_ms = 100;                // R2CCL_LINK_HOLDDOWN_MS: a NIC back up waits this long (x2 per recent flap)
  std::string plan = "auto";                 // R2CCL_PLAN: all-reduce plan (coll::kPlanNames; checked there)
  std::string algo = "auto";                 // R2CCL_ALGO: collective algorithm (coll::kAlgoNames; checked there)
  int max_peers = 16;                        // R2CCL_MAX_PEERS: auto runs the ring past this many direct peers
  uint64_t eager_bytes = 32 << 10;           // R2CCL_EAGER_BYTES: sends up to this size complete when copied (0: when acked)
  int advert_wait_ms = 2;                    // R2CCL_ADVERT_WAIT_MS: a registered send waits this long for its receive's advert
  int poll_us = 250;                         // R2CCL_POLL_US: a small request's waiter polls the network itself this long
  int sync_wait_us = 1000;                   // R2CCL_SYNC_WAIT_US: XLA's thread waits this long for a lone small collective
  uint64_t staging_bytes = 32 << 20;         // R2CCL_STAGING_BYTES: pinned host staging per GPU (bound of its pool)
  uint64_t staging_chunk_bytes = 4 << 20;    // R2CCL_STAGING_CHUNK_BYTES: one step of the device<->host pipeline
  std::string secret;                        // R2CCL_SECRET: the job secret in hex (empty: rank 0 makes one)
  int debug_level = 1;                       // R2CCL_DEBUG: 0 ERROR, 1 WARN, 2 INFO, 3 TRACE

  // Returns an empty string when every field is in range, else a sentence naming the field.
  // The plan's and algorithm's names are not checked here: they belong to coll/
  // (coll::plan_setting_error, coll::algo_setting_error).
  std::string validate() const;
};

}  // namespace r2ccl
