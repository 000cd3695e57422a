// Range checks for Config; the defaults and docs live beside the fields.
#include "base/config.h"

namespace r2ccl {

std::string Config::validate() const {
  auto bad = [](const char* name, const std::string& why) {
    return std::string(name) + " " + why;
  };
  if (chunk_bytes < kChunkBytesMin || chunk_bytes > kChunkBytesMax)
    return bad("R2CCL_CHUNK_BYTES",
               "must be between " + std::to_string(kChunkBytesMin) + " and " + std::to_string(kChunkBytesMax));
  if (rail_window_bytes < chunk_bytes)
    return bad("R2CCL_RAIL_WINDOW_BYTES", "must be at least R2CCL_CHUNK_BYTES");
  if (rail_queue_ms < 1 || rail_queue_ms > 10000) return bad("R2CCL_RAIL_QUEUE_MS", "must be 1..10000");
  if (conns_per_nic < 1 || conns_per_nic > 16) return bad("R2CCL_CONNS_PER_NIC", "must be 1..16");
  bool known = false;
  for (const char* t : kTransportNames) known = known || transport == t;
  if (!known) return bad("R2CCL_TRANSPORT", "must be socket, ibverbs or auto (got '" + transport + "')");
  known = false;
  for (const char* a : kNicAffinityNames) known = known || nic_affinity == a;
  if (!known) return "R2CCL_NIC_AFFINITY='" + nic_affinity + "': use auto or off";
  known = false;
  for (const char* d : kNcclDevicesNames) known = known || nccl_devices == d;
  if (!known) return bad("R2CCL_NCCL_DEVICES", "must be auto, fused or nic (got '" + nccl_devices + "')");
  if (ib_timeout < 1 || ib_timeout > 31) return bad("R2CCL_IB_TIMEOUT", "must be 1..31");
  if (ib_retry_count < 0 || ib_retry_count > 7) return bad("R2CCL_IB_RETRY_COUNT", "must be 0..7");
  if (ib_gid_index < -1 || ib_gid_index > 255) return bad("R2CCL_IB_GID_INDEX", "must be -1 (auto) or 0..255");
  if (io_threads < -1 || io_threads > kIoThreadsMax)
    return bad("R2CCL_IO_THREADS", "must be -1 (auto), 0 or 1.." + std::to_string(kIoThreadsMax));
  if (!(timeout_s > 0)) return bad("R2CCL_TIMEOUT", "must be > 0 seconds");
  if (!(bootstrap_timeout_s > 0)) return bad("R2CCL_BOOTSTRAP_TIMEOUT", "must be > 0 seconds");
  if (heartbeat_ms < 1) return bad("R2CCL_HEARTBEAT_MS", "must be >= 1");
  if (heartbeat_misses < 1) return bad("R2CCL_HEARTBEAT_MISSES", "must be >= 1");
  if (rest_heartbeat_ms < 0) return bad("R2CCL_REST_HEARTBEAT_MS", "must be >= 0 (0: connections never rest)");
  if (stall_ms < 1) return bad("R2CCL_STALL_MS", "must be >= 1");
  if (mismatch_ms < 1 || mismatch_ms > 3600000) return bad("R2CCL_MISMATCH_MS", "must be 1..3600000");
  if (reprobe_ms < 1) return bad("R2CCL_REPROBE_MS", "must be >= 1");
  if (connect_timeout_ms < 1) return bad("R2CCL_CONNECT_TIMEOUT_MS", "must be >= 1");
  if (tcp_user_timeout_ms < 0) return bad("R2CCL_TCP_USER_TIMEOUT_MS", "must be >= 0");
  if (socket_buffer_bytes < 0) return bad("R2CCL_SOCKET_BUFFER_BYTES", "must be >= 0");
  if (port < 0 || port > 65535) return bad("R2CCL_PORT", "must be 0..65535");
  if (max_message_bytes < 1) return bad("R2CCL_MAX_MESSAGE_BYTES", "must be >= 1");
  if (monitor_ms < 0 || monitor_ms > 60000) return bad("R2CCL_MONITOR_MS", "must be 0..60000");
  if (link_holddown_ms < 0 || link_holddown_ms > 600000) return bad("R2CCL_LINK_HOLDDOWN_MS", "must be 0..600000");
  if (max_peers < 1 || max_peers > 1000000) return bad("R2CCL_MAX_PEERS", "must be 1..1000000");
  if (poll_us < 0 || poll_us > 1000000) return bad("R2CCL_POLL_US", "must be 0..1000000");
  if (eager_bytes > kEagerBytesMax)
    return bad("R2CCL_EAGER_BYTES", "must be 0.." + std::to_string(kEagerBytesMax));
  if (sync_wait_us < 0 || sync_wait_us > 1000000) return bad("R2CCL_SYNC_WAIT_US", "must be 0..1000000");
  if (advert_wait_ms < 0 || advert_wait_ms > 60000) return bad("R2CCL_ADVERT_WAIT_MS", "must be 0..60000");
  if (staging_chunk_bytes < kStagingChunkMin || staging_chunk_bytes > kStagingChunkMax)
    return bad("R2CCL_STAGING_CHUNK_BYTES",
               "must be between " + std::to_string(kStagingChunkMin) + " and " + std::to_string(kStagingChunkMax));
  if (staging_bytes < 2 * staging_chunk_bytes + 8192)
    return bad("R2CCL_STAGING_BYTES", "must hold one staging step: at least 2 x R2CCL_STAGING_CHUNK_BYTES + 8 KiB");
  if (!secret.empty()) {
    if (secret.size() % 2 || secret.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      return bad("R2CCL_SECRET", "must be hex");
    if (secret.size() < 32) return bad("R2CCL_SECRET", "must hold at least 16 bytes (32 hex digits)");
  }
  if (debug_level < 0 || debug_level > 3) return bad("R2CCL_DEBUG", "must be 0..3");
  return {};
}

}  // namespace r2ccl
