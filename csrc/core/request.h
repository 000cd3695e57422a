// A posted send or receive: the caller's buffer, and a completion that any thread may wait
// on. The engine thread owns every field below "engine-only". Knows nothing of sockets.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"

namespace r2ccl {

class Registration;   // core/registration.h

// Where a thread running the engine's work on the caller's path puts the on_finish callbacks
// of the requests it finishes (null on every other thread: callbacks run at once).
// (__thread, not thread_local: a pointer needs no dynamic initialisation, so no TLS wrapper
// symbol is referenced, which the NCCL plugin would otherwise import from whoever defines one.)
extern __thread std::vector<std::function<void()>>* t_deferred_callbacks;

struct Request {
  enum Kind { kSend, kRecv };
  Request(Kind k, int p, uint64_t t, uint8_t* b, uint64_t n) : kind(k), peer(p), tag(t), buf(b), len(n) {}

  const Kind kind;
  const int peer;
  const uint64_t tag;
  uint8_t* const buf;
  const uint64_t len;

  // Completion: set once by the engine; waited on by the caller.
  void finish_ok();
  void finish_error(Cause cause, const std::string& message);
  // Waits until finished or the deadline (monotonic ns); returns false on deadline.
  bool wait_until(int64_t deadline_ns);
  bool finished();
  // Valid after finished(): throws the stored error, if any.
  void rethrow();
  // Valid after finished(): whether it failed, and why.
  bool failed();
  std::string error_message();
  Cause error_cause();
  // Called once, on the engine thread, right after the request finishes (set before posting).
  // A request finished on a caller's thread (the caller's path, engine.h) hands its
  // on_finish to that thread's deferral list, which the engine thread then runs.
  std::function<void()> on_finish;

  // Set before posting: no other message to (from) this peer uses this tag, so it matches as
  // (tag, 0) and the channel keeps no per-tag count for it. The collectives' tags are unique
  // per message; counting them grew two maps by an entry per message for the life of the
  // job (tests/test_load.py: 16 MiB over 10^5 collectives).
  bool tag_once = false;
  // Set before posting a receive: a shorter message matches it too (an NCCL net plugin's
  // receive names its buffer's size, not the message's). Any other receive takes exactly
  // `len` bytes, and a message of another size fails it as a mismatch.
  bool up_to_len = false;
  bool takes(uint64_t msg_len) const { return msg_len == len || (up_to_len && msg_len < len); }
  // After it finished without error: the bytes the message held (a receive), `len` (a send).
  uint64_t received = 0;
  // engine-only
  uint64_t msg_id = 0;
  uint32_t tag_seq = 0;
  uint64_t next_offset = 0;     // send: bytes cut into chunks so far
  bool fully_cut = false;       // send: every chunk has a sequence number
  uint64_t chunks_cut = 0;
  uint64_t chunks_acked = 0;
  int64_t posted_ns = 0;
  bool cancelled = false;
  bool advertised = false;      // receive: its memory was offered to the peer's one-sided writes (kAdvert)
  // Registered memory holding the whole buffer (Endpoint::register_memory), found when posted:
  // kept registered while this request lives. Null: its chunks travel in frames.
  std::shared_ptr<Registration> reg;
  bool registered = false;      // `reg` is set: a send may wait briefly for its receiver's advert
  // send, eager (R2CCL_EAGER_BYTES): finished when copied; its chunks are read from `copy`,
  // which lives until every chunk is acknowledged. `undeliverable`: every rail stayed down
  // past R2CCL_TIMEOUT, so the message is abandoned (its chunks go as abort marks).
  bool eager = false;
  bool undeliverable = false;
  std::vector<uint8_t> copy;
  const uint8_t* payload() const { return eager ? copy.data() : buf; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool failed_ = false;
  Cause cause_ = Cause::kSystem;
  std::string error_;
};

}  // namespace r2ccl
