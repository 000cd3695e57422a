// Logger and clocks. Lines are written with one write() so concurrent ranks do not interleave.
#include "base/log.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace r2ccl {

static std::atomic<int> g_level{1};
static std::atomic<int> g_rank{-1};
static std::atomic<bool> g_claimed{false};
static std::atomic<LogSink> g_sink{nullptr};
// A thread that works for one endpoint (its engine, executor or monitor) logs at that
// endpoint's level and with its rank, whatever other endpoints in the process chose.
static thread_local int t_level = -1;
static thread_local int t_rank = -1;

void log_set_level(int level) { g_level.store(level); }
void log_set_rank(int rank) { g_rank.store(rank); }
void log_set_process_default(int level, int rank) {
  if (g_claimed.exchange(true)) return;
  g_level.store(level);
  g_rank.store(rank);
}
void log_set_sink(LogSink sink) { g_sink.store(sink); }
void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

void log_bind_thread(int level, int rank) {
  t_level = level;
  t_rank = rank;
}
bool log_enabled(LogLevel level) {
  const int lim = t_level >= 0 ? t_level : g_level.load(std::memory_order_relaxed);
  return static_cast<int>(level) <= lim;
}

void log_write(LogLevel level, const char* fmt, ...) {
  char buf[1024];
  if (LogSink sink = g_sink.load()) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sink(level, buf);
    return;
  }
  int n = std::snprintf(buf, sizeof buf, "[r2ccl %d %.3f %s] ", t_level >= 0 ? t_rank : g_rank.load(), unix_time_s(),
                        kLogLevelNames[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : std::min<size_t>(m, sizeof buf - n - 2));
  buf[len++] = '\n';
  ssize_t w = ::write(2, buf, len);
  (void)w;
}

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double unix_time_s() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace r2ccl
