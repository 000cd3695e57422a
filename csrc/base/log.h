// The one logger (R2CCL_DEBUG = ERROR|WARN|INFO|TRACE): one line per event on stderr,
// prefixed with the rank. Knows nothing above base/.
#pragma once
#include <cstdint>
#include <iterator>
#include <string>

namespace r2ccl {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kTrace = 3 };
// The level names R2CCL_DEBUG accepts, in enum order (Config::debug_level is the index);
// exported by _core.names() for jax_r2ccl/config.py.
inline constexpr const char* kLogLevelNames[] = {"ERROR", "WARN", "INFO", "TRACE"};
static_assert(std::size(kLogLevelNames) == static_cast<size_t>(LogLevel::kTrace) + 1, "a LogLevel without a name");

// The process-wide level and rank, for threads that belong to no endpoint.
void log_set_level(int level);
void log_set_rank(int rank);
// Sets them from the first endpoint opened in the process only; later endpoints leave them.
void log_set_process_default(int level, int rank);
// The calling thread logs at `level` with `rank` from now on (an endpoint's own threads).
void log_bind_thread(int level, int rank);
// Names the calling thread (at most 15 characters; "r2ccl-engine", "r2ccl-io3"), as top -H,
// perf and `bench p2p`'s CPU-by-thread line show it.
void name_this_thread(const char* name);
// Where lines go instead of stderr, for a host program with a logger of its own (the NCCL
// plugin hands them to NCCL's): called with the line's level and text (no prefix, no newline),
// on the logging thread. Null: stderr again.
using LogSink = void (*)(LogLevel level, const char* line);
void log_set_sink(LogSink sink);
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Monotonic clock in nanoseconds, and Unix time in seconds (for reports).
int64_t now_ns();
double unix_time_s();

}  // namespace r2ccl

#define R2_LOG(level, ...)                                         \
  do {                                                             \
    if (::r2ccl::log_enabled(level)) ::r2ccl::log_write(level, __VA_ARGS__); \
  } while (0)
#define R2_WARN(...) R2_LOG(::r2ccl::LogLevel::kWarn, __VA_ARGS__)
#define R2_INFO(...) R2_LOG(::r2ccl::LogLevel::kInfo, __VA_ARGS__)
#define R2_TRACE(...) R2_LOG(::r2ccl::LogLevel::kTrace, __VA_ARGS__)
#define R2_ERROR(...) R2_LOG(::r2ccl::LogLevel::kError, __VA_ARGS__)
