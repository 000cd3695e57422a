// The R2CCL_* table: each setting's variable, kind, Config member and doc (its default is the
// member's initializer in base/config.h), and the one reader of the environment.
#include "base/settings.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <strings.h>

#include "base/error.h"
#include "base/log.h"

namespace r2ccl {

namespace {

// 65536 -> "64 KiB" (what a doc says of a size).
std::string size_text(uint64_t n) {
  const char* units[] = {"GiB", "MiB", "KiB"};
  const int shifts[] = {30, 20, 10};
  for (int i = 0; i < 3; ++i)
    if (n >= (1ull << shifts[i]) && n % (1ull << shifts[i]) == 0)
      return std::to_string(n >> shifts[i]) + " " + units[i];
  return std::to_string(n) + " bytes";
}

// {"a", "b", "c"} -> "a, b or c".
template <size_t N>
std::string one_of(const char* const (&names)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + names[i];
  return out;
}

std::vector<Setting> build_table() {
  return {
      {"R2CCL_NICS", "nics", SettingKind::kString, &Config::nics,
       std::string() + "Comma-separated NICs (interface names or IPv4 addresses) to stripe over; empty: every "
       "non-loopback interface that is up, else 127.0.0.1."},
      {"R2CCL_NIC_AFFINITY", "nic_affinity", SettingKind::kString, &Config::nic_affinity,
       std::string() + "Order of the default NICs. auto: nearest first (PCIe distance) to this process's GPUs "
       "(rail 0 = nearest; collectives still stripe over all of them); off: interface order. An "
       "explicit R2CCL_NICS is used exactly as given."},
      {"R2CCL_NCCL_DEVICES", "nccl_devices", SettingKind::kString, &Config::nccl_devices,
       std::string() + "The NCCL net plugin's devices. nic: one per NIC (its pciPath and speed; NCCL gives each "
       "GPU the nearest), each connection's own NIC its primary rail and the host's other NICs backups that "
       "carry its traffic only while the primary is down; fused: one device striped over every NIC; auto: nic "
       "where there are 2 or more NICs and each has a PCI device, else fused."},
      {"R2CCL_TRANSPORT", "transport", SettingKind::kString, &Config::transport,
       std::string() + "Transport per NIC: socket (TCP), ibverbs (RDMA verbs, RoCE or InfiniBand: every NIC must"
       " map to an ACTIVE RDMA port, else an error names it) or auto (ibverbs on the NICs that "
       "map to an ACTIVE RDMA port, sockets elsewhere). Every rank must reach the same choice "
       "for a NIC pair. `jax-r2ccl doctor` shows the NIC-to-port map."},
      {"R2CCL_IB_TIMEOUT", "ib_timeout", SettingKind::kInt, &Config::ib_timeout,
       std::string() + "Verbs ACK timeout exponent (1..31): 4.096 us x 2^this per try; with R2CCL_IB_RETRY_COUNT"
       " retries it bounds how long a dead path takes to error a queue pair (the default: about "
       "0.5 s; NCCL's 20 and 7 take 34 s). Heartbeats and port events usually find it first."},
      {"R2CCL_IB_RETRY_COUNT", "ib_retry_count", SettingKind::kInt, &Config::ib_retry_count,
       std::string() + "Verbs transport retries (0..7) before a queue pair errors."},
      {"R2CCL_IB_GID_INDEX", "ib_gid_index", SettingKind::kInt, &Config::ib_gid_index,
       std::string() + "RoCE GID index (-1: the RoCEv2 GID that holds the NIC's IPv4 address)."},
      {"R2CCL_CHUNK_BYTES", "chunk_bytes", SettingKind::kInt, &Config::chunk_bytes,
       std::string() + "Largest payload per chunk (" + size_text(kChunkBytesMin) + " to " + size_text(kChunkBytesMax) +
       "); a rail's chunks are a quarter of its "
       "window, at least 16 KiB (or this, when smaller), at most this."},
      {"R2CCL_RAIL_WINDOW_BYTES", "rail_window_bytes", SettingKind::kInt, &Config::rail_window_bytes,
       std::string() + "Most unacknowledged bytes one rail may carry (what a failure re-sends at most per rail)."
       " Below it each rail's window follows its own measured bandwidth x R2CCL_RAIL_QUEUE_MS "
       "(plus its round trip; at least 32 KiB), and its chunks are a quarter of that window."},
      {"R2CCL_RAIL_QUEUE_MS", "rail_queue_ms", SettingKind::kInt, &Config::rail_queue_ms,
       std::string() + "Target queueing delay per rail: its window holds its measured bandwidth x this. Small "
       "enough that NIC and switch queues shared by many peers do not overflow; large enough to "
       "cover the acks' turnaround. Stall detection allows each rail this drain time too."},
      {"R2CCL_CONNS_PER_NIC", "conns_per_nic", SettingKind::kInt, &Config::conns_per_nic,
       std::string() + "TCP connections per NIC pair (each is a rail of its own)."},
      {"R2CCL_IO_THREADS", "io_threads", SettingKind::kInt, &Config::io_threads,
       std::string() + "Threads that run the TCP send and receive calls, so one process moves bytes on several "
       "cores: the NICs are dealt to them in order (NIC k to thread k mod N), and a thread whose"
       " NICs share a known NUMA node runs on that node. Frames of at most " + size_text(kCallerPathMaxBytes) +
       " onto an idle "
       "connection are still moved by the thread that posts them (no hand-over). 0: the progress"
       " thread makes every socket call itself. -1 (auto): one per NIC where there are two NICs "
       "or more and this process may run on at least " + std::to_string(kIoCpusPerNic) +
       " CPUs per NIC, else 0 (with fewer cores "
       "the threads compete for them and striping skews) (at most " + std::to_string(kIoThreadsMax) + ")."},
      {"R2CCL_TIMEOUT", "timeout_s", SettingKind::kFloat, &Config::timeout_s,
       std::string() + "Seconds an operation may wait, and how long every rail to a peer may stay down, before "
       "it fails with an error naming the peer."},
      {"R2CCL_MISMATCH_MS", "mismatch_ms", SettingKind::kInt, &Config::mismatch_ms,
       std::string() + "A collective that has waited this long for a peer whose announcement of a different "
       "collective is already here (another program, or the same collectives in another order) "
       "fails with a mismatch naming both, instead of waiting for R2CCL_TIMEOUT."},
      {"R2CCL_BOOTSTRAP_TIMEOUT", "bootstrap_timeout_s", SettingKind::kFloat, &Config::bootstrap_timeout_s,
       std::string() + "Seconds bootstrap waits for every rank to publish its addresses and for rails to come "
       "up."},
      {"R2CCL_HEARTBEAT_MS", "heartbeat_ms", SettingKind::kInt, &Config::heartbeat_ms,
       std::string() + "Heartbeat period on idle rails."},
      {"R2CCL_HEARTBEAT_MISSES", "heartbeat_misses", SettingKind::kInt, &Config::heartbeat_misses,
       std::string() + "Heartbeat periods of silence after which a rail is declared failed."},
      {"R2CCL_REST_HEARTBEAT_MS", "rest_heartbeat_ms", SettingKind::kInt, &Config::rest_heartbeat_ms,
       std::string() + "Heartbeat period of a connection at rest: one with nothing posted or in flight for this "
       "long beats this slowly (after telling its peer, which then waits R2CCL_HEARTBEAT_MISSES of these "
       "periods before failing the rail), and at R2CCL_HEARTBEAT_MS again once anything is posted. "
       "An NCCL job holds hundreds of mostly idle connections. 0: never rest."},
      {"R2CCL_STALL_MS", "stall_ms", SettingKind::kInt, &Config::stall_ms,
       std::string() + "A rail with unacknowledged chunks and no ack for this long plus the time its own "
       "measured bandwidth needs to drain them, while a sibling rail is alive, is declared "
       "failed (black-hole detection)."},
      {"R2CCL_REPROBE_MS", "reprobe_ms", SettingKind::kInt, &Config::reprobe_ms,
       std::string() + "Period of reconnect attempts on a failed rail (failback)."},
      {"R2CCL_CONNECT_TIMEOUT_MS", "connect_timeout_ms", SettingKind::kInt, &Config::connect_timeout_ms,
       std::string() + "Deadline of one connect plus handshake."},
      {"R2CCL_TCP_USER_TIMEOUT_MS", "tcp_user_timeout_ms", SettingKind::kInt, &Config::tcp_user_timeout_ms,
       std::string() + "TCP_USER_TIMEOUT on every connection: the kernel's bound on unacknowledged data."},
      {"R2CCL_SOCKET_BUFFER_BYTES", "socket_buffer_bytes", SettingKind::kInt, &Config::socket_buffer_bytes,
       std::string() + "SO_SNDBUF and SO_RCVBUF of every connection (0: kernel default)."},
      {"R2CCL_CRC", "crc", SettingKind::kBool, &Config::crc,
       std::string() + "CRC32C over every chunk's payload, checked by the receiver."},
      {"R2CCL_BIND_DEVICE", "bind_device", SettingKind::kBool, &Config::bind_device,
       std::string() + "Also bind sockets to their NIC's device (SO_BINDTODEVICE) where permitted."},
      {"R2CCL_PORT", "port", SettingKind::kInt, &Config::port,
       std::string() + "First listen port (NIC i listens on PORT+i); 0 picks free ports."},
      {"R2CCL_MAX_MESSAGE_BYTES", "max_message_bytes", SettingKind::kInt, &Config::max_message_bytes,
       std::string() + "Largest message a receiver accepts from the network."},
      {"R2CCL_MONITOR_MS", "monitor_ms", SettingKind::kInt, &Config::monitor_ms,
       std::string() + "Sampling period of the health monitor (rail bandwidth, weights, events); 0 turns the "
       "monitor off (link events are then seen only through rail timers)."},
      {"R2CCL_ADAPTIVE_WEIGHTS", "adaptive_weights", SettingKind::kBool, &Config::adaptive_weights,
       std::string() + "Rail weights follow each rail's measured delivered bandwidth (with hysteresis), so a "
       "degraded NIC carries only what it can finish in time. Off: every rail weighs 1."},
      {"R2CCL_LINK_HOLDDOWN_MS", "link_holddown_ms", SettingKind::kInt, &Config::link_holddown_ms,
       std::string() + "A NIC whose link comes back up is re-admitted after this long, doubled for every further"
       " link failure in the last 10 s (up to 16x): a flapping link stays out."},
      {"R2CCL_PLAN", "plan", SettingKind::kString, &Config::plan,
       std::string() + "All-reduce plan for large messages: which share each process owns (reduces and sends "
       "back). balance: equal; r2cc: R2CCL's R2CC-AllReduce; weighted: by capacity; optimal: "
       "min-max of the cost model; auto: the model's fastest. Capacities come from the health "
       "monitor and travel with each call, so every process runs the same plan. Results are "
       "bit-identical under every plan. Must be equal on every process."},
      {"R2CCL_ALGO", "algo", SettingKind::kString, &Config::algo,
       std::string() + "Collective algorithm. direct: every process exchanges with every other (the least data: "
       "the all-reduce moves 2(P-1)/P of the vector per process; P-1 peers). ring: each process "
       "exchanges with its two ring neighbours only (the all-reduce moves about twice the vector"
       " per process, in pieces, so the canonical summation order holds); all-to-all is always "
       "direct. doubling: small all-reduces in log2(P) rounds with 2 log2(P) peers (other kinds "
       "then run the ring). two_level: all-reduces in equal groups of at most R2CCL_MAX_PEERS "
       "processes, the owner exchange and its plans inside each, the running fold from group to "
       "group (group - 1 + 2 peers; other kinds run the ring). auto: direct up to "
       "R2CCL_MAX_PEERS peers; beyond, doubling for all-reduces of at most 64 KiB (while P x size "
       "<= 16 MiB), two_level for the larger ones where P splits into groups of 2 or more, and "
       "the ring for the rest. "
       "Results are bit-identical under every algorithm. Must be equal on every process (checked"
       " with each call)."},
      {"R2CCL_MAX_PEERS", "max_peers", SettingKind::kInt, &Config::max_peers,
       std::string() + "Under R2CCL_ALGO=auto: the most processes one process exchanges data with directly in a "
       "collective; a larger group runs two_level in groups of at most this many (the largest "
       "divisor of the process count within it), or the ring. Must be equal on every process."},
      {"R2CCL_STAGING_BYTES", "staging_bytes", SettingKind::kInt, &Config::staging_bytes,
       std::string() + "GPU platform: bound on the pinned host staging of one GPU: a pool of slots of two steps "
       "each, reused across calls (a collective uses up to three at once). "
       "jax_r2ccl.initialize() allocates three; none is freed before the process ends."},
      {"R2CCL_STAGING_CHUNK_BYTES", "staging_chunk_bytes", SettingKind::kInt, &Config::staging_chunk_bytes,
       std::string() + "GPU platform: bytes of one step of the device -> host -> network -> host -> device "
       "pipeline (copies, network and reduction of different steps overlap). Must be equal on "
       "every process."},
      {"R2CCL_EAGER_BYTES", "eager_bytes", SettingKind::kInt, &Config::eager_bytes,
       std::string() + "Sends up to this size complete as soon as they are copied (at most " + size_text(kEagerBytesMax) +
       "): the transport"
       " keeps the copy until the peer acknowledges it and re-sends it over another rail if one "
       "fails, and the receiver acknowledges such sends lazily (batched), so neither side waits "
       "for an ack. If every rail to the peer then stays down past R2CCL_TIMEOUT, the next "
       "operation with that peer fails and names the undelivered send (the receive fails too). "
       "While " + size_text(kEagerHeldBytes) + " of copies to one peer await acks, further sends complete when "
       "acknowledged. "
       "0: every send completes when acknowledged."},
      {"R2CCL_ADVERT_WAIT_MS", "advert_wait_ms", SettingKind::kInt, &Config::advert_wait_ms,
       std::string() + "RDMA rails, registered memory (the NCCL plugin's buffers, the GPU staging pool, "
       "Endpoint.register_memory): a send waits this long after it was posted for the peer to advertise its "
       "receive, then writes straight into it (no copies); a receive posted later than that gets the send in "
       "frames, copied once on each side. Longer waits trade a straggling peer's copies for a sender held "
       "back that long (never past the receive's arrival). 0: only receives already advertised are written."},
      {"R2CCL_POLL_US", "poll_us", SettingKind::kInt, &Config::poll_us,
       std::string() + "Small sends and receives (<= " + size_text(kCallerPathMaxBytes) + ") take the caller's path: a send leaves "
       "from the "
       "caller's thread when the progress thread is idle, and a thread waiting for one reads and"
       " writes the sockets itself for up to this many microseconds before it sleeps (latency: "
       "no hand-over between threads; costs that much CPU per wait at most). 0: every request "
       "goes through the progress thread."},
      {"R2CCL_SYNC_WAIT_US", "sync_wait_us", SettingKind::kInt, &Config::sync_wait_us,
       std::string() + "Microseconds XLA's thread waits inside the custom call for a small collective (<= " +
       size_text(kSmallCollectiveBytes) + ") that is the process's only one in flight, so the program continues on that thread "
       "without a hand-over (latency); after that the call completes asynchronously. 0: never "
       "wait."},
      {"R2CCL_SECRET", "secret", SettingKind::kString, &Config::secret,
       std::string() + "The job secret (hex). Empty: rank 0 makes a random one and shares it at bootstrap."},
      {"R2CCL_DEBUG", "debug", SettingKind::kLevel, &Config::debug_level,
       std::string() + "Log level of the one logger: " + one_of(kLogLevelNames) + "."},
  };
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\n\r"), b = s.find_last_not_of(" \t\n\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = build_table();
  return table;
}

const Setting* find_setting(const std::string& env) {
  for (const Setting& s : settings())
    if (env == s.env) return &s;
  return nullptr;
}

std::string set_setting(Config& cfg, const Setting& s, const std::string& text) {
  const std::string t = trim(text);
  auto invalid = [&](const char* kind, const std::string& extra = "") {
    return std::string(s.env) + "='" + text + "' is not a valid " + kind + extra;
  };
  switch (s.kind) {
    case SettingKind::kBool: {
      bool v;
      if (!strcasecmp(t.c_str(), "1") || !strcasecmp(t.c_str(), "true") || !strcasecmp(t.c_str(), "yes") ||
          !strcasecmp(t.c_str(), "on"))
        v = true;
      else if (t.empty() || !strcasecmp(t.c_str(), "0") || !strcasecmp(t.c_str(), "false") ||
               !strcasecmp(t.c_str(), "no") || !strcasecmp(t.c_str(), "off"))
        v = false;
      else
        return invalid("bool", " (1, true, yes, on; 0, false, no, off)");
      cfg.*std::get<bool Config::*>(s.member) = v;
      return {};
    }
    case SettingKind::kInt: {
      if (t.empty()) return invalid("int");
      errno = 0;
      char* end = nullptr;
      if (auto* m = std::get_if<uint64_t Config::*>(&s.member)) {
        if (t[0] == '-') return invalid("int", " (must be >= 0)");
        unsigned long long v = std::strtoull(t.c_str(), &end, 0);
        if (errno || *end) return invalid("int");
        cfg.**m = v;
      } else {
        long long v = std::strtoll(t.c_str(), &end, 0);
        if (errno || *end || v < INT32_MIN || v > INT32_MAX) return invalid("int");
        cfg.*std::get<int Config::*>(s.member) = static_cast<int>(v);
      }
      return {};
    }
    case SettingKind::kFloat: {
      errno = 0;
      char* end = nullptr;
      double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
      if (t.empty() || errno || *end || std::isnan(v)) return invalid("float");
      cfg.*std::get<double Config::*>(s.member) = v;
      return {};
    }
    case SettingKind::kString:
      cfg.*std::get<std::string Config::*>(s.member) = text;
      return {};
    case SettingKind::kLevel:
      for (size_t i = 0; i < std::size(kLogLevelNames); ++i) {
        if (!strcasecmp(t.c_str(), kLogLevelNames[i]) || (i == 1 && !strcasecmp(t.c_str(), "WARNING"))) {
          cfg.*std::get<int Config::*>(s.member) = static_cast<int>(i);
          return {};
        }
      }
      return std::string(s.env) + "='" + text + "': use " + one_of(kLogLevelNames);
  }
  return invalid("value");
}

std::string setting_text(const Config& cfg, const Setting& s) {
  switch (s.kind) {
    case SettingKind::kBool: return cfg.*std::get<bool Config::*>(s.member) ? "1" : "0";
    case SettingKind::kInt:
      if (auto* m = std::get_if<uint64_t Config::*>(&s.member)) return std::to_string(cfg.**m);
      return std::to_string(cfg.*std::get<int Config::*>(s.member));
    case SettingKind::kFloat: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", cfg.*std::get<double Config::*>(s.member));
      return buf;
    }
    case SettingKind::kString: return cfg.*std::get<std::string Config::*>(s.member);
    case SettingKind::kLevel: {
      int level = cfg.*std::get<int Config::*>(s.member);
      return level >= 0 && level < static_cast<int>(std::size(kLogLevelNames)) ? kLogLevelNames[level]
                                                                               : std::to_string(level);
    }
  }
  return {};
}

std::string read_settings(Config& cfg, const EnvLookup& lookup, std::vector<std::string>* found) {
  for (const Setting& s : settings()) {
    const char* v = lookup ? lookup(s.env) : std::getenv(s.env);
    if (!v) continue;
    std::string bad = set_setting(cfg, s, v);
    if (!bad.empty()) return bad;
    if (found) found->push_back(s.env);
  }
  return {};
}

Config config_from_environment() {
  Config cfg;
  std::string bad = read_settings(cfg);
  if (bad.empty()) bad = cfg.validate();
  if (!bad.empty()) throw Error(Cause::kInvalidArgument, -1, bad);
  return cfg;
}

}  // namespace r2ccl
