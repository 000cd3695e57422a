// The chunk pipeline (see pipeline.h).
#include "stage/pipeline.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace r2ccl::stage {

namespace {

struct Geometry {
  uint64_t seg = 0;   // elements of the per-rank segment that is cut into chunks
  size_t in_rows = 1, out_rows = 1;
};

Geometry geometry(coll::Kind kind, uint64_t count, int n) {
  const auto un = static_cast<uint64_t>(n);
  switch (kind) {
    case coll::Kind::kAllGather: return {count, 1, static_cast<size_t>(n)};
    case coll::Kind::kReduceScatter: return {count / un, static_cast<size_t>(n), 1};
    case coll::Kind::kAllToAll: return {count / un, static_cast<size_t>(n), static_cast<size_t>(n)};
    default: return {count, 1, 1};
  }
}

// Chunk c's collective (of N, U elements each): the same kind over the chunk's elements,
// under its own op id; its buffers are the staging at `stage` (in) and `stage + out_at` (out).
coll::DeviceCall chunk_call(const coll::DeviceCall& call, const Geometry& g, uint64_t U, uint64_t c, uint8_t* stage,
                            size_t out_at) {
  coll::DeviceCall sub = call;
  sub.done = nullptr;
  sub.op_id = call.op_id ^ ((c + 1) << 40);
  const uint64_t len = std::min(U, g.seg - std::min(g.seg, c * U));
  sub.in = stage;
  sub.out = stage ? stage + out_at : nullptr;
  sub.count = len * g.in_rows;
  sub.out_count = len * g.out_rows;
  return sub;
}

enum class St { kIdle, kToHost, kStaged, kReducing, kReduced, kToDevice, kDone };

// What the callbacks (copy engine, executor) and the driving thread share. Held by
// shared_ptr: a callback may still hold it for an instant after run_staged returned.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<St> st;
  std::deque<int> free_slots;
  std::vector<int> slot_of;
  std::optional<Error> err;
  uint64_t done = 0;
  uint64_t events = 0;   // bumped on every callback: progress for the stall bound
};

// The local ranks of one execution of an all-reduce that fold on the devices: the lowest one
// (the leader) folds every member's chunk into its staging through its engine, reading the
// members' device inputs, so the members must stay (their inputs alive) until it is done.
struct LocalGroup {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<const void*> in;         // per local index: the member's device input
  std::vector<CopyEngine*> engines;    // per local index (begin() called)
  size_t joined = 0;
  bool leader_joined = false;
  bool leader_done = false;   // the leader reads no member's input any more
  bool member_left = false;   // a member returned before the leader joined: the leader must not read
};

class Groups {
 public:
  // Joins (and makes, for the first local rank) the group of this execution of `call`.
  std::shared_ptr<LocalGroup> join(const coll::DeviceCall& call, size_t index, size_t n_local, CopyEngine* engine) {
    std::lock_guard<std::mutex> g(mu_);
    if (!counts_.count(call.run_id)) {
      order_.push_back(call.run_id);
      if (order_.size() > 256) {
        counts_.erase(order_.front());
        order_.erase(order_.begin());
      }
    }
    const uint64_t k = counts_[call.run_id][{call.comm_id, call.group, call.rank, call.op_id}]++;
    const Key key{call.comm_id, call.group, call.run_id, call.op_id, k};
    auto& slot = groups_[key];
    if (!slot) {
      slot = std::make_shared<LocalGroup>();
      slot->in.assign(n_local, nullptr);
      slot->engines.assign(n_local, nullptr);
    }
    std::shared_ptr<LocalGroup> grp = slot;
    {
      std::lock_guard<std::mutex> gl(grp->mu);
      grp->in[index] = call.in;
      grp->engines[index] = engine;
      grp->joined++;
      if (index == 0) grp->leader_joined = true;
    }
    grp->cv.notify_all();
    if (grp->joined == n_local) groups_.erase(key);   // everyone holds it now
    return grp;
  }

 private:
  using Key = std::tuple<uint64_t, int64_t, uint64_t, uint64_t, uint64_t>;
  std::mutex mu_;
  std::map<Key, std::shared_ptr<LocalGroup>> groups_;
  std::map<uint64_t, std::map<std::tuple<uint64_t, int64_t, int64_t, uint64_t>, uint64_t>> counts_;
  std::vector<uint64_t> order_;
};

Groups& groups() {
  static auto* g = new Groups();   // lives for the process
  return *g;
}

}  // namespace

size_t slot_bytes(uint64_t chunk_bytes) {
  // Every kind's step: in and out each at most chunk_bytes, out at the next 256 bytes after in.
  return static_cast<size_t>((chunk_bytes + 255) / 256 * 256 + chunk_bytes);
}

size_t small_bytes(uint64_t chunk_bytes) {
  return static_cast<size_t>(std::min<uint64_t>(coll::kSmallCollectiveBytes, chunk_bytes));
}

uint64_t chunk_elements(coll::Kind kind, int n_ranks, size_t esize, uint64_t chunk_bytes) {
  Geometry g = geometry(kind, 0, n_ranks);
  const uint64_t widest = static_cast<uint64_t>(std::max(g.in_rows, g.out_rows)) * esize;
  return std::max<uint64_t>(1, chunk_bytes / widest);
}

void abandon_staged(coll::Runtime& rt, const coll::DeviceCall& call, const PipelineOptions& opt, const Error& why) {
  int n = 0;
  if (!rt.check(call, &n).empty()) return;   // no chunk of it could ever be made
  const Geometry g = geometry(call.kind, call.count, n);
  const uint64_t U = chunk_elements(call.kind, n, coll::dtype_size(call.dtype), opt.chunk_bytes);
  const uint64_t N = g.seg == 0 ? 1 : (g.seg + U - 1) / U;
  for (uint64_t c = 0; c < N; c++) {
    coll::DeviceCall sub = chunk_call(call, g, U, c, nullptr, 0);
    rt.abandon(sub, why);
  }
}

namespace {

// How a call is cut: its group's size, element size, geometry, chunk elements and chunks.
struct Cut {
  int n = 0;
  size_t es = 0;
  Geometry g;
  uint64_t U = 0, N = 0;
};

// Throws Error (invalid_argument) when the runtime refuses the call.
Cut cut_of(coll::Runtime& rt, const coll::DeviceCall& call, const PipelineOptions& opt) {
  Cut c;
  std::string bad = rt.check(call, &c.n);
  if (!bad.empty()) throw Error(Cause::kInvalidArgument, -1, bad);
  c.es = coll::dtype_size(call.dtype);
  c.g = geometry(call.kind, call.count, c.n);
  c.U = chunk_elements(call.kind, c.n, c.es, opt.chunk_bytes);
  c.N = c.g.seg == 0 ? 1 : (c.g.seg + c.U - 1) / c.U;
  return c;
}

}  // namespace

void register_pool(coll::Runtime& rt, StagingPool& pool, const PipelineOptions& opt) {
  if (!opt.register_staging || pool.registered_with(rt.serial())) return;
  pool.register_with(rt.serial(), [w = rt.weak_from_this()](const void* p, size_t n) {
    std::shared_ptr<coll::Runtime> r = w.lock();
    return r && r->register_memory(p, n);
  });
}

PipelineResult run_staged(coll::Runtime& rt, const coll::DeviceCall& call, CopyEngine& engine, StagingPool& pool,
                          const PipelineOptions& opt) {
  register_pool(rt, pool, opt);
  const Cut cut = cut_of(rt, call, opt);
  const int n = cut.n;
  const size_t es = cut.es;
  const Geometry g = cut.g;
  const uint64_t U = cut.U, N = cut.N;
  const uint64_t step = std::min(U, std::max<uint64_t>(g.seg, 1));   // a call of one short chunk stages only that
  const size_t in_bytes = step * g.in_rows * es, out_bytes = step * g.out_rows * es;
  const size_t out_at = (in_bytes + 255) / 256 * 256;

  // Staging: up to `depth` steps, at least one (else the bound is too small for one step).
  std::vector<StagingPool::Lease> slots;
  const int want = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(std::max(1, opt.depth)), N));
  for (int s = 0; s < want; s++) {
    StagingPool::Lease l = pool.try_acquire(out_at + out_bytes);
    if (!l) break;
    slots.push_back(std::move(l));
  }
  if (slots.empty()) {
    Error e(Cause::kInvalidArgument, -1,
                "R2CCL_STAGING_BYTES (" + std::to_string(pool.capacity()) + ") cannot hold one staging step of " +
                    std::to_string(out_at + out_bytes) + " bytes in slots of " + std::to_string(pool.slot_bytes()) +
                    " (R2CCL_STAGING_CHUNK_BYTES " +
                    std::to_string(opt.chunk_bytes) + ", " + coll::kind_name(call.kind) + " over " +
                    std::to_string(n) + " ranks): raise it or lower the chunk size");
    abandon_staged(rt, call, opt, e);
    throw e;
  }
  auto make_sub = [&](uint64_t c, uint8_t* stage) { return chunk_call(call, g, U, c, stage, out_at); };
  // Chunks this rank will not make (after an error): the process's other local ranks must
  // not wait for them.
  auto abandon_from = [&](uint64_t first, const Error& e) {
    for (uint64_t c = first; c < N; c++) rt.abandon(make_sub(c, nullptr), e);
  };
  // Device-side fold (all_reduce with several local ranks): the leader folds every local
  // rank's chunk into its staging on its device; the members copy nothing in.
  const std::vector<int> locals = rt.local_ranks(call);
  const bool fold = opt.device_fold && locals.size() > 1 &&
                    (call.kind == coll::Kind::kAllReduce || call.kind == coll::Kind::kReduceScatter);
  const size_t my_index =
      static_cast<size_t>(std::find(locals.begin(), locals.end(), static_cast<int>(call.rank)) - locals.begin());
  const bool leader = fold && my_index == 0;
  PipelineResult res;
  res.chunks = N;
  res.device_fold = fold;
  res.depth = static_cast<int>(slots.size());
  for (auto& l : slots) res.staged_bytes += l.size();

  auto sh = std::make_shared<Shared>();
  sh->st.assign(N, St::kIdle);
  sh->slot_of.assign(N, -1);
  for (int s = 0; s < static_cast<int>(slots.size()); s++) sh->free_slots.push_back(s);

  auto len_of = [&](uint64_t c) { return std::min(U, g.seg - std::min(g.seg, c * U)); };
  auto dev_in = static_cast<const uint8_t*>(call.in);
  auto dev_out = static_cast<uint8_t*>(call.out);
  const size_t seg_bytes = g.seg * es;
  // Chunk c's copies: `rows` runs of len*es bytes, one per rank block, packed in staging.
  auto copies_in = [&](uint64_t c, uint8_t* stage) {
    const size_t w = len_of(c) * es;
    return std::vector<Copy>{{stage, dev_in + c * U * es, w, g.in_rows, w, seg_bytes}};
  };
  auto copies_out = [&](uint64_t c, uint8_t* stage) {
    const size_t w = len_of(c) * es;
    return std::vector<Copy>{{dev_out + c * U * es, stage, w, g.out_rows, seg_bytes, w}};
  };

  engine.begin();
  std::shared_ptr<LocalGroup> grp;
  if (fold) {
    grp = groups().join(call, my_index, locals.size(), &engine);
    if (leader) {
      // Every member's input must be known (and ordered after its own stream's work) first.
      std::unique_lock<std::mutex> gl(grp->mu);
      const bool all = grp->cv.wait_for(gl, std::chrono::duration<double>(opt.timeout_s),
                                        [&] { return grp->joined == locals.size() || grp->member_left; });
      if (!all || grp->member_left) {
        Error e(Cause::kTimeout, -1, std::string("the device fold of ") + coll::kind_name(call.kind) +
                                         ": a local rank of this process did not join within R2CCL_TIMEOUT");
        grp->leader_done = true;
        gl.unlock();
        grp->cv.notify_all();
        abandon_staged(rt, call, opt, e);
        throw e;
      }
    }
  }
  // On every way out: a member leaves only when the leader reads none of its input any more;
  // the leader says so once its engine has nothing in flight.
  struct Leave {
    std::shared_ptr<LocalGroup> grp;
    bool leader;
    CopyEngine& engine;
    ~Leave() {
      if (!grp) return;
      std::unique_lock<std::mutex> gl(grp->mu);
      if (leader) {
        gl.unlock();
        try {
          engine.sync();   // normally done already; after an unexpected exception it is not
        } catch (...) {
        }
        gl.lock();
        grp->leader_done = true;
        gl.unlock();
        grp->cv.notify_all();
      } else if (!grp->leader_joined) {
        grp->member_left = true;
        gl.unlock();
        grp->cv.notify_all();
      } else {
        grp->cv.wait(gl, [&] { return grp->leader_done; });   // bounded: the leader's waits are
      }
    }
  } leave{grp, leader, engine};
  uint64_t next_in = 0, next_sub = 0;
  bool any_out = false;
  const auto stall = std::chrono::duration<double>(opt.timeout_s);
  auto last_progress = std::chrono::steady_clock::now();
  uint64_t seen_events = 0;
  std::unique_lock<std::mutex> lk(sh->mu);
  auto outstanding = [&] {
    for (uint64_t c = 0; c < next_in; c++)
      if (sh->st[c] == St::kToHost || sh->st[c] == St::kReducing || sh->st[c] == St::kToDevice) return true;
    return false;
  };
  for (;;) {
    bool acted = false;
    // 1. copy in, while a step's staging is free
    while (!sh->err && next_in < N && !sh->free_slots.empty()) {
      const uint64_t c = next_in++;
      const int s = sh->free_slots.front();
      sh->free_slots.pop_front();
      sh->slot_of[c] = s;
      sh->st[c] = St::kToHost;
      if (fold && !leader) {   // nothing to copy in: the leader's staging holds the fold
        sh->st[c] = St::kStaged;
        acted = true;
        continue;
      }
      lk.unlock();
      try {
        auto staged = [sh, c] {
          std::lock_guard<std::mutex> gl(sh->mu);
          sh->st[c] = St::kStaged;
          sh->events++;
          sh->cv.notify_all();
        };
        uint8_t* stage = slots[static_cast<size_t>(s)].data();
        if (leader) {
          std::vector<const void*> srcs;
          for (const void* p : grp->in) srcs.push_back(static_cast<const uint8_t*>(p) + c * U * es);
          const FoldShape shape{len_of(c), g.in_rows, g.seg};
          if (!engine.fold_to_host(stage, srcs, grp->engines, call.dtype, call.op, shape, staged))
            throw Error(Cause::kInternal, -1, "this copy engine cannot fold on the device");
        } else {
          engine.to_host(copies_in(c, stage), staged);
        }
        lk.lock();
      } catch (const Error& e) {
        lk.lock();
        sh->st[c] = St::kDone;
        if (!sh->err) sh->err = e;
      }
      acted = true;
    }
    // 2. hand staged chunks to the runtime, in order
    while (!sh->err && next_sub < next_in && sh->st[next_sub] == St::kStaged) {
      const uint64_t c = next_sub++;
      sh->st[c] = St::kReducing;
      uint8_t* stage = slots[static_cast<size_t>(sh->slot_of[c])].data();
      coll::DeviceCall sub = make_sub(c, stage);
      sub.prefolded = fold;
      sub.done = [sh, c](const Error* e) {
        std::lock_guard<std::mutex> gl(sh->mu);
        if (e) {
          if (!sh->err) sh->err = *e;
          sh->st[c] = St::kDone;
          sh->free_slots.push_back(sh->slot_of[c]);
          sh->done++;
        } else {
          sh->st[c] = St::kReduced;
        }
        sh->events++;
        sh->cv.notify_all();
      };
      lk.unlock();
      rt.device_call(std::move(sub));   // may complete (or fail) at once
      lk.lock();
      acted = true;
    }
    // 3. copy out whatever the runtime finished (any order: the chunks are disjoint)
    for (uint64_t c = 0; c < next_sub; c++) {
      if (sh->st[c] != St::kReduced) continue;
      sh->st[c] = St::kToDevice;
      uint8_t* stage = slots[static_cast<size_t>(sh->slot_of[c])].data() + out_at;
      lk.unlock();
      try {
        engine.to_device(copies_out(c, stage), [sh, c] {
          std::lock_guard<std::mutex> gl(sh->mu);
          sh->st[c] = St::kDone;
          sh->free_slots.push_back(sh->slot_of[c]);
          sh->done++;
          sh->events++;
          sh->cv.notify_all();
        });
        lk.lock();
        any_out = true;
      } catch (const Error& e) {
        lk.lock();
        sh->st[c] = St::kDone;
        if (!sh->err) sh->err = e;
      }
      acted = true;
    }
    if (sh->done == N) break;
    if (sh->err && !outstanding()) break;
    if (acted) continue;
    sh->cv.wait_for(lk, std::chrono::milliseconds(10));
    if (sh->events != seen_events) {
      seen_events = sh->events;
      last_progress = std::chrono::steady_clock::now();
      continue;
    }
    lk.unlock();
    std::string why = engine.failure();
    lk.lock();
    // A copy that failed never signals: stop waiting for it. A chunk's collective always
    // ends (its own timeouts bound it), so only copies can stall this loop.
    if (!why.empty() || std::chrono::steady_clock::now() - last_progress > stall) {
      if (!sh->err)
        sh->err = Error(why.empty() ? Cause::kTimeout : Cause::kDevice, -1,
                        why.empty() ? "staging copies made no progress for R2CCL_TIMEOUT" : why);
      bool reducing = false;
      for (uint64_t c = 0; c < next_in; c++) reducing |= sh->st[c] == St::kReducing;
      if (!reducing) break;   // only copies are left: sync() below waits for them or reports them
    }
  }
  if (sh->err) {
    Error e = *sh->err;
    lk.unlock();
    abandon_from(next_sub, e);
  } else {
    lk.unlock();
  }
  try {
    if (!sh->err && any_out) engine.finish();
    engine.sync();   // throws when a copy failed; returns with nothing of ours in flight
  } catch (const Error& e) {
    std::lock_guard<std::mutex> gl(sh->mu);
    if (!sh->err) sh->err = e;   // chunks were all made: nothing left to abandon
  }
  if (sh->err) throw *sh->err;
  return res;
}

namespace {

// The small path (see pipeline.h): the input is already in `sa.in`.
PipelineResult run_small(coll::Runtime& rt, const coll::DeviceCall& call, CopyEngine& engine, const SmallArea& sa,
                         const PipelineOptions& opt) {
  const Cut cut = cut_of(rt, call, opt);
  coll::DeviceCall sub = chunk_call(call, cut.g, cut.U, 0, sa.in, static_cast<size_t>(sa.out - sa.in));
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<Error> err;
  };
  auto w = std::make_shared<Wait>();   // the callback may hold it for an instant after we return
  sub.done = [w](const Error* e) {
    std::lock_guard<std::mutex> gl(w->mu);
    if (e) w->err = *e;
    w->done = true;
    w->cv.notify_all();
  };
  rt.device_call(std::move(sub));   // may complete (or fail) at once
  {
    // Unbounded here: the chunk's collective ends by its own timeouts, like run_staged's.
    std::unique_lock<std::mutex> lk(w->mu);
    w->cv.wait(lk, [&] { return w->done; });
    if (w->err) throw *w->err;
  }
  const size_t out_bytes = call.out_count * cut.es;
  if (out_bytes > 0) engine.write_later({{call.out, sa.out, out_bytes, 1, out_bytes, out_bytes}});
  PipelineResult res;
  res.small = true;
  res.chunks = 1;
  return res;
}

}  // namespace

PipelineResult run_device_call(coll::Runtime& rt, coll::DeviceCall call, CopyEngine& engine, StagingPool& pool,
                               const PipelineOptions& opt, const void* group_operand, const void* rank_operand,
                               const std::function<void(const coll::DeviceCall&)>& decoded, bool allow_small) {
  const size_t es = coll::dtype_size(call.dtype);
  const size_t in_bytes = call.count * es, out_bytes = call.out_count * es;
  register_pool(rt, pool, opt);
  const SmallArea sa = pool.small();
  // At most one chunk (so the wire sees chunk 0 of a one-chunk staged call) and within the area.
  const size_t limit = std::min<size_t>(sa.bytes, opt.chunk_bytes);
  const bool small = allow_small && in_bytes <= limit && out_bytes <= limit;
  auto* head = reinterpret_cast<int32_t*>(sa.head);
  std::vector<Copy> reads{{head, group_operand, sizeof(int32_t), 1, 0, 0}, {head + 1, rank_operand, sizeof(int32_t), 1, 0, 0}};
  if (small && in_bytes > 0) reads.push_back({sa.in, call.in, in_bytes, 1, in_bytes, in_bytes});
  engine.read_now(reads);
  call.group = head[0];
  call.rank = head[1];
  try {
    decoded(call);
  } catch (const Error& e) {
    abandon_staged(rt, call, opt, e);
    throw;
  } catch (const std::exception& e) {
    abandon_staged(rt, call, opt, Error(Cause::kInternal, -1, e.what()));
    throw;
  } catch (...) {
    abandon_staged(rt, call, opt, Error(Cause::kInternal, -1, "an exception of unknown type"));
    throw;
  }
  if (small) return run_small(rt, call, engine, sa, opt);
  return run_staged(rt, call, engine, pool, opt);
}

}  // namespace r2ccl::stage
