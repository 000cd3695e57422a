// Collective algorithms (see collectives.h for the canonical order). Each call becomes an
// Op: the messages it posts, the reductions it folds as contributions arrive, in canonical
// order, and the sends that follow a reduction. The executor thread steps every Op whenever
// a message finishes. Knows nothing of sockets, rails or JAX.
#include "coll/collectives.h"
#include "coll/signature.h"
#include "base/enum_names.h"

#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "base/log.h"

namespace r2ccl::coll {

const char* kind_name(Kind k) { return enum_name(kKindNames, k, "?"); }

bool parse_kind(const std::string& name, Kind* out) { return parse_enum(kKindNames, name, out); }

uint64_t output_count(Kind k, uint64_t count, int n) {
  switch (k) {
    case Kind::kReduceScatter: return count / static_cast<uint64_t>(n);
    case Kind::kAllGather: return count * static_cast<uint64_t>(n);
    default: return count;
  }
}

std::string validate(const ProcessCall& c, int my_process) {
  const int n = static_cast<int>(c.process_of_rank.size());
  if (n == 0) return "the group has no ranks";
  if (c.my_ranks.empty()) return "this process holds no rank of the group";
  if (c.in.size() != c.my_ranks.size() || c.out.size() != c.my_ranks.size())
    return "one input and one output buffer are needed per local rank";
  for (size_t i = 0; i < c.my_ranks.size(); i++) {
    int r = c.my_ranks[i];
    if (r < 0 || r >= n) return "local rank " + std::to_string(r) + " is outside the group of " + std::to_string(n);
    if (c.process_of_rank[r] != my_process)
      return "rank " + std::to_string(r) + " belongs to process " + std::to_string(c.process_of_rank[r]) +
             ", not to this process " + std::to_string(my_process);
    if (i > 0 && c.my_ranks[i - 1] >= r) return "local ranks must be given in increasing order";
  }
  if (c.kind == Kind::kReduceScatter && c.count % static_cast<uint64_t>(n) != 0)
    return "reduce_scatter needs an input size divisible by the group size (" + std::to_string(c.count) +
           " elements over " + std::to_string(n) + " ranks)";
  if (c.kind == Kind::kAllToAll && c.count % static_cast<uint64_t>(n) != 0)
    return "all_to_all needs an input size divisible by the group size (" + std::to_string(c.count) +
           " elements over " + std::to_string(n) + " ranks)";
  if (c.kind == Kind::kPermute) {
    if (c.perm.size() != static_cast<size_t>(n))
      return "permute needs one destination per rank (" + std::to_string(c.perm.size()) + " for a group of " +
             std::to_string(n) + ")";
    std::vector<bool> taken(static_cast<size_t>(n), false);
    for (int d : c.perm) {
      if (d < -1 || d >= n) return "permute destination " + std::to_string(d) + " is outside the group of " + std::to_string(n);
      if (d >= 0 && taken[static_cast<size_t>(d)]) return "permute sends to rank " + std::to_string(d) + " twice";
      if (d >= 0) taken[static_cast<size_t>(d)] = true;
    }
  } else if (!c.perm.empty()) {
    return std::string(kind_name(c.kind)) + " takes no permutation";
  }
  if (c.kind == Kind::kRaggedAllToAll) {
    // Shapes only (equal on every process); the slices' values are checked inside the call.
    if (c.row_elems == 0 || c.count % c.row_elems != 0 || c.out_count % c.row_elems != 0)
      return "ragged_all_to_all needs whole rows: " + std::to_string(c.count) + " input and " +
             std::to_string(c.out_count) + " output elements in rows of " + std::to_string(c.row_elems);
    if (c.ragged.size() != c.my_ranks.size()) return "ragged_all_to_all needs one set of slices per local rank";
    const size_t K = c.ragged.front().send.size();
    for (const RaggedSlices& r : c.ragged)
      if (r.in_off.size() != K || r.send.size() != K || r.out_off.size() != K || r.recv.size() != K)
        return "ragged_all_to_all needs input_offsets, send_sizes, output_offsets and recv_sizes of one length";
    if (K == 0 || K % static_cast<size_t>(n) != 0)
      return "ragged_all_to_all needs a number of slices divisible by the group size (" + std::to_string(K) +
             " slices over " + std::to_string(n) + " ranks)";
  } else if (!c.ragged.empty()) {
    return std::string(kind_name(c.kind)) + " takes no ragged slices";
  }
  if (c.kind == Kind::kBroadcast && (c.root < 0 || c.root >= n))
    return "broadcast root " + std::to_string(c.root) + " is outside the group of " + std::to_string(n);
  PlanKind pk;
  if (!c.plan.empty() && !parse_plan(c.plan, &pk))
    return "unknown all-reduce plan '" + c.plan + "' (use auto, balance, r2cc, weighted or optimal)";
  AlgoKind ak;
  if (!c.algo.empty() && !parse_algo(c.algo, &ak)) return "unknown algorithm '" + c.algo + "' (use auto, direct or ring)";
  if (c.dtype == DType::kBool && (c.op == ReduceOp::kSum || c.op == ReduceOp::kProd) &&
      (c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter))
    return std::string("a ") + reduce_op_name(c.op) + " over bool is not defined (use max or min)";
  return {};
}

namespace {

constexpr int64_t kNs = 1000000000;
// From this long into a collective, its executor looks (every 100 ms) for a peer's
// announcement of the same collective that says it is another call (Op::diverged).
constexpr int64_t kSameCallProbeNs = 100 * 1000000;

// The ring's abort notice (Op::ring_listen): cause, origin process, then a sentence.
constexpr uint64_t kAbortBytes = 512;
constexpr uint64_t kAbortPhase = 20;

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A tag for one message of one collective: the call's tag mixed with the message's role.
uint64_t mix_tag(uint64_t base, uint64_t phase, uint64_t a, uint64_t b, uint64_t piece) {
  uint64_t h = base ^ 0x9E3779B97F4A7C15ull;
  for (uint64_t v : {phase, a, b, piece}) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

std::string hex_id(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ragged_all_to_all's metadata words, little-endian on the wire.
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
constexpr uint64_t kRaggedMagic = 0x3144474152524332ull;   // "2CRRAGD1"
constexpr uint64_t kRaggedWhyBytes = 160;                  // a rank's account of its bad slices

bool overlaps(const void* a, uint64_t an, const void* b, uint64_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

}  // namespace

class Executor::Op {
 public:
  Op(Executor* ex, Endpoint& ep, ProcessCall c, int my_process, const CollectiveOptions& opt)
      : ex_(ex), ep_(ep), c_(std::move(c)), me_(my_process), opt_(opt), esize_(dtype_size(c_.dtype)) {
    plan_kind_ = opt_.plan;
    if (!c_.plan.empty()) parse_plan(c_.plan, &plan_kind_);   // validated by validate()
    AlgoKind want = opt_.algo;
    if (!c_.algo.empty()) parse_algo(c_.algo, &want);
    started_ns_ = mono_ns();
    deadline_ns_ = started_ns_ + static_cast<int64_t>(c_.timeout_s * kNs);
    for (int p : c_.process_of_rank)
      if (std::find(procs_.begin(), procs_.end(), p) == procs_.end()) procs_.push_back(p);
    mi_ = static_cast<int>(std::find(procs_.begin(), procs_.end(), me_) - procs_.begin());
    // All-to-all and permute move fixed blocks between fixed pairs: always direct.
    algo_ = c_.kind == Kind::kAllToAll || c_.kind == Kind::kPermute || c_.kind == Kind::kRaggedAllToAll
                ? AlgoKind::kDirect
                                       : choose_algo(want, static_cast<int>(procs_.size()), opt_.max_peers,
                                                     c_.kind == Kind::kAllReduce, static_cast<double>(c_.count * esize_));
    ring_ = algo_ == AlgoKind::kRing && procs_.size() > 1;
    doubling_ = algo_ == AlgoKind::kDoubling && procs_.size() > 1;
  }

  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }

  // Posts what can be posted; returns true when the op already finished.
  bool start() {
    std::lock_guard<std::mutex> g(step_mu_);
    try {
      plan();
    } catch (const Error& e) {
      return finish(&e);
    }
    return step();
  }

  // The executor's step: also looks for a peer that is evidently in another collective.
  bool step_locked() {
    std::lock_guard<std::mutex> g(step_mu_);
    if (!finished_ && diverged()) return true;
    return step();
  }

  // Called on the engine thread when one of this op's messages finished. A small all-reduce
  // whose messages all arrived intact completes right here (a small fold, then handing the
  // result over): one thread hop less on the latency path. Everything else, failures
  // included (they cancel requests, which must not happen on the engine thread), goes to
  // the executor. Returns false when the executor must take it.
  bool try_complete_inline() {
    if (!inline_ok_) return false;
    wants_executor_.store(true);   // cleared below when it completes here
    std::unique_lock<std::mutex> lk(step_mu_, std::try_to_lock);
    if (!lk.owns_lock() || finished_) return false;
    for (auto& m : msgs_)
      if (!m.req->finished() || m.req->failed()) return false;
    if (!step()) return false;
    wants_executor_.store(false);
    return true;
  }

  // A small all-reduce normally completes on the engine thread; the executor holds it only
  // for its deadline, and is woken for it only when the engine thread handed it over.
  bool completes_inline() const { return inline_ok_; }
  bool wants_executor() const { return wants_executor_.load(); }

  // A message that failed fails the op (true: finished). Looked at before anything is folded
  // and again before the op may finish: a receive the engine thread fails in between (a peer
  // closing) is never folded (fold() and the slots wait only for messages that arrived) and
  // never taken for done. CI's TSan run found a 2-process all-reduce finishing as a success
  // with a wrong result while the peer closed: its failed receive had been folded.
  bool failed_message() {
    for (auto& m : msgs_)
      if (m.req && m.req->finished() && m.req->failed()) {
        // A peer that found the two of us in different collectives (or in this one, called
        // differently) may fail and leave before this process looked: its announcement, still
        // here, is the better account.
        Sig other;
        const Cause c = m.req->error_cause();
        if ((c == Cause::kPeerGone || c == Cause::kClosed || c == Cause::kTimeout) && awaits_signature(m.peer_process)) {
          if (same_instance_disagrees(m.peer_process, &other)) {
            Error e = disagreement(m.peer_process, other);
            return finish(&e);
          }
          if (foreign_announcement(m.peer_process, &other)) {
            Error e = divergence(m.peer_process, other, mono_ns());
            return finish(&e);
          }
        }
        Error e(c, m.peer_process, describe() + ": " + m.req->error_message());
        return finish(&e);
      }
    return false;
  }

  static bool arrived(const std::shared_ptr<Request>& r) { return r->finished() && !r->failed(); }

  // Folds what arrived, posts follow-ups; returns true when finished (done has run).
  bool step() {
    if (finished_) return true;
    if (!signatures_agree()) return true;   // the clearest account of a disagreement comes first
    if (notice_arrived()) return true;
    if (failed_message()) return true;
    if (plan_pending_) post_planned();
    if (ragged_pending_ && post_ragged()) return true;
    if (doubling_) post_doubling_sends();
    bool progress = true;
    while (progress) {
      progress = false;
      for (auto& pc : pieces_) progress |= fold(pc);
    }
    // Once more after the folds: a slot may have arrived (on the engine thread) since the
    // sends were looked at above, and its round must go out before this op may finish (the
    // fold can be complete while a later round's send still waits: found under ASan, where a
    // process finished without sending its last round and its partner waited out its timeout).
    if (doubling_) post_doubling_sends();
    if (failed_message()) return true;
    bool all_done = !plan_pending_ && !ragged_pending_ &&
                    std::all_of(pieces_.begin(), pieces_.end(), [](const Piece& p) { return p.done; }) &&
                    std::all_of(rounds_.begin(), rounds_.end(), [](const Round& r) { return r.sent; }) &&
                    std::all_of(msgs_.begin(), msgs_.end(), [](const Msg& m) { return m.req && arrived(m.req); });
    if (all_done) {
      // Once more: a message that arrived (on the engine thread) after the check above was
      // folded without its signature compared. Found by the TSan run, whose timing made a
      // dtype/op disagreement finish as a success on one process.
      if (!signatures_agree()) return true;
      for (auto& cp : final_copies_)
        if (cp.src)
          std::memmove(cp.dst, cp.src, cp.bytes);
        else if (cp.bytes)
          std::memset(cp.dst, 0, cp.bytes);   // permute: a rank no one sends to
      return finish(nullptr);
    }
    if (mono_ns() > deadline_ns_) {
      std::set<int> waiting;
      std::map<int, std::pair<int, int>> what;   // peer -> (receives, sends) not finished
      for (auto& m : msgs_)
        if (m.req && !m.req->finished()) {
          waiting.insert(m.peer_process);
          (m.req->kind == Request::kSend ? what[m.peer_process].second : what[m.peer_process].first)++;
        }
      std::string who;
      for (int p : waiting)
        who += (who.empty() ? "" : ", ") + std::to_string(p) + " (" + std::to_string(what[p].first) + " receive(s), " +
               std::to_string(what[p].second) + " send(s))";
      Error e(Cause::kTimeout, waiting.size() == 1 ? *waiting.begin() : -1,
              describe() + " did not complete within " + std::to_string(c_.timeout_s) +
                  " s; still waiting on process(es) " + who +
                  " (did every process run the same collectives with the same shapes?)");
      return finish(&e);
    }
    return false;
  }

  int64_t deadline_ns() const { return deadline_ns_; }
  // Any thread; serialised with the engine thread's inline completion, so an op finishes once.
  void abort(const Error& e) {
    std::lock_guard<std::mutex> g(step_mu_);
    finish(&e);
  }
  // The executor closed with this op unfinished: it fails with kClosed, naming itself.
  void abort_closed() {
    abort(Error(Cause::kClosed, -1,
                describe() + " was still in flight when jax_r2ccl closed (shutdown() waits up to R2CCL_TIMEOUT "
                             "for the collectives in flight, then fails the rest)"));
  }

 private:
  struct Msg {
    std::shared_ptr<Request> req;
    int peer_process;
  };
  struct Copy {
    void* dst;
    const void* src;
    uint64_t bytes;
  };
  // One reduction unit: contributions in canonical order (local pointer, or a receive).
  struct Piece {
    uint64_t elems = 0;
    std::vector<const void*> src;
    std::vector<int> msg;          // message index per contribution, -1 when local
    uint8_t* acc = nullptr;        // accumulator (may be dest when dest aliases no source)
    void* dest = nullptr;
    size_t next = 0;
    bool done = false;
    std::vector<std::pair<int, uint64_t>> then_send;   // (peer process, tag) of dest when done
  };

  std::string describe() const {
    return std::string(kind_name(c_.kind)) + (c_.what.empty() ? "" : " (" + c_.what + ")") + " of " +
           std::to_string(c_.count) + " " + dtype_name(c_.dtype) + " on process " + std::to_string(me_);
  }

  bool finish(const Error* e) {
    if (finished_) return true;
    finished_ = true;
    stop_listening(e);
    if (e)
      for (size_t i = 0; i < msgs_.size(); i++) {
        auto& m = msgs_[i];
        // Our signature still goes out after a mismatch: the peers need it to name the
        // disagreement themselves rather than see an abandoned message.
        if (e->cause() == Cause::kMismatch && sig_sends_.count(static_cast<int>(i))) continue;
        // A mismatch travels with the abandoned messages (kFlagAbortMismatch): a process that
        // only waited on this one names the mismatch too, not a timeout.
        if (m.req && !m.req->finished())
          ep_.cancel(m.req, e->cause() == Cause::kMismatch ? Cause::kMismatch : Cause::kTimeout,
                     "collective abandoned: " + std::string(e->what()));
      }
    if (c_.done) c_.done(e);
    ex_->op_finished();
    return true;
  }

  int send(int peer, uint64_t tag, const void* p, uint64_t bytes) {
    // Every tag of a collective is unique per message (mix_tag of its instance's tag, the
    // phase and the piece): matched once, nothing kept per tag.
    msgs_.push_back({ep_.post_send(peer, tag, p, bytes, wake_, true), peer});
    return static_cast<int>(msgs_.size()) - 1;
  }
  int recv(int peer, uint64_t tag, void* p, uint64_t bytes) {
    msgs_.push_back({ep_.post_recv(peer, tag, p, bytes, wake_, true), peer});
    return static_cast<int>(msgs_.size()) - 1;
  }
  uint8_t* temp(uint64_t bytes) {
    temps_.push_back(ex_->scratch().take(bytes));
    return temps_.back().data();
  }
  uint8_t* at(const void* base, uint64_t elems) const {
    return static_cast<uint8_t*>(const_cast<void*>(base)) + elems * esize_;
  }
  int local_index(int rank) const {
    return static_cast<int>(std::find(c_.my_ranks.begin(), c_.my_ranks.end(), rank) - c_.my_ranks.begin());
  }

  bool fold(Piece& p) {
    if (p.done) return false;
    bool moved = false;
    const uint64_t bytes = p.elems * esize_;
    while (p.next < p.src.size()) {
      int mi = p.msg[p.next];
      if (mi >= 0 && !arrived(msgs_[mi].req)) break;
      if (p.next == 0) {
        // (An empty collective's buffers may be null; a ring piece folds in its receive buffer.)
        if (bytes && p.acc != p.src[0]) std::memcpy(p.acc, p.src[0], bytes);
      } else
        reduce_into(c_.dtype, c_.op, p.acc, p.src[p.next], p.elems);
      p.next++;
      moved = true;
    }
    if (p.next < p.src.size()) return moved;
    if (p.acc != p.dest && bytes) std::memcpy(p.dest, p.acc, bytes);
    p.done = true;
    for (auto& [peer, tag] : p.then_send) send(peer, tag, p.dest, bytes);
    return true;
  }

  // The local pre-reduction S = x_l0 (op) x_l1 ... over this process's ranks, in rank order.
  const uint8_t* local_sum(uint64_t elems, bool must_copy) {
    // (Pre-folded on the devices: in[0] already is S, in the same order.)
    const bool one = c_.my_ranks.size() == 1 || c_.prefolded;
    if (one && !must_copy) return static_cast<const uint8_t*>(c_.in[0]);
    uint8_t* s = temp(elems * esize_);
    if (elems == 0) return s;   // nothing to fold (and no memcpy on a null buffer)
    std::memcpy(s, c_.in[0], elems * esize_);
    for (size_t i = 1; i < c_.in.size() && !one; i++) reduce_into(c_.dtype, c_.op, s, c_.in[i], elems);
    return s;
  }

  // Adds pieces that reduce segment [off, off+n) of every process's S at `owner`, into dest;
  // after each piece, `after(piece_offset, piece_elems)` may name follow-up sends.
  void reduce_segment(uint64_t phase, uint64_t seg_id, int owner_idx, const uint8_t* S, uint64_t off, uint64_t n,
                      void* dest, bool gather_after) {
    const int P = static_cast<int>(procs_.size());
    const uint64_t piece = std::max<uint64_t>(1, opt_.piece_bytes / esize_);
    const int owner = procs_[owner_idx];
    for (uint64_t po = 0, k = 0; po < n; po += piece, k++) {
      uint64_t pn = std::min(piece, n - po);
      uint64_t tag = mix_tag(c_.tag, phase, seg_id, 0, k);
      if (owner != me_) {
        send(owner, tag, at(S, off + po), pn * esize_);
        if (gather_after) recv(owner, mix_tag(c_.tag, phase + 1, seg_id, 0, k), at(dest, po), pn * esize_);
        continue;
      }
      Piece pc;
      pc.elems = pn;
      pc.dest = at(dest, po);
      uint8_t* rbuf = P > 1 ? temp(static_cast<uint64_t>(P - 1) * pn * esize_) : nullptr;
      int slot = 0;
      for (int qi = 0; qi < P; qi++) {
        if (procs_[qi] == me_) {
          pc.src.push_back(at(S, off + po));
          pc.msg.push_back(-1);
        } else {
          uint8_t* b = rbuf + static_cast<uint64_t>(slot++) * pn * esize_;
          pc.msg.push_back(recv(procs_[qi], tag, b, pn * esize_));
          pc.src.push_back(b);
        }
      }
      bool dest_is_source = overlaps(pc.dest, pn * esize_, at(S, off + po), pn * esize_);
      pc.acc = dest_is_source ? temp(pn * esize_) : static_cast<uint8_t*>(pc.dest);
      if (gather_after)
        for (int q : procs_)
          if (q != me_) pc.then_send.push_back({q, mix_tag(c_.tag, phase + 1, seg_id, 0, k)});
      pieces_.push_back(std::move(pc));
    }
  }

  void copy_out_to_other_locals(uint64_t out_elems) {
    for (size_t i = 1; i < c_.out.size(); i++) final_copies_.push_back({c_.out[i], c_.out[0], out_elems * esize_});
  }

  // What this process believes the collective is (coll/signature.h); every peer in the
  // group sends its own and a difference (dtype, op, size, root, group) fails the call on
  // every process with both versions named. Equal-sized mismatches (float32 vs int32) would
  // otherwise go unseen.
  Sig signature() const {
    if (c_.kind == Kind::kRaggedAllToAll)   // (its output size, rows and slices per peer, in the group hash)
      return make_signature(c_.kind, c_.dtype, c_.op, plan_kind_, algo_, c_.count, c_.root, c_.process_of_rank, c_.tag,
                            {}, {c_.out_count, c_.row_elems, c_.ragged.front().send.size()});
    return make_signature(c_.kind, c_.dtype, c_.op, plan_kind_, algo_, c_.count, c_.root, c_.process_of_rank, c_.tag,
                          c_.perm);
  }

  // Separate signature messages (large collectives; small all-reduces carry theirs in front
  // of their data, see reduce_segment_all).
  // Every signature message carries a capacity (a double) after the signature, used by a
  // planned all-reduce: one length for all, so processes that disagree about the call get
  // the signature comparison's account of it, not a message-size error.
  void exchange_signatures(bool with_capacity = false) {
    if (procs_.size() < 2) return;
    uint64_t tag = mix_tag(c_.tag, 0, 0, 0, 0);
    const uint64_t len = kSigMessageBytes;
    uint8_t* mine = temp(len);
    encode_signature(my_sig_, mine);
    const double cap = with_capacity ? my_capacity_ : 0.0;
    std::memcpy(mine + kSigBytes, &cap, sizeof(double));
    for (int q : neighbours()) {
      if (q == me_) continue;
      sig_sends_.insert(send(q, tag, mine, len));
      uint8_t* b = temp(len);
      sig_msgs_.push_back({recv(q, tag, b, len), q, b});
    }
  }

  // Once every capacity is here: the plan, the same on every process (a pure function of
  // the capacities in canonical order), then the owners' segments are posted.
  void post_planned() {
    for (const SigMsg& sm : sig_msgs_)
      if (!msgs_[sm.msg].req->finished() || msgs_[sm.msg].req->failed()) return;
    const int P = static_cast<int>(procs_.size());
    std::vector<double> caps(static_cast<size_t>(P), 0.0);
    for (int qi = 0; qi < P; qi++) {
      if (procs_[qi] == me_) {
        caps[static_cast<size_t>(qi)] = my_capacity_;
        continue;
      }
      for (const SigMsg& sm : sig_msgs_)
        if (sm.peer_process == procs_[qi]) caps[static_cast<size_t>(qi)] = decode_capacity(sm.where + kSigBytes);
    }
    const uint64_t N = c_.count;
    PlanChoice pc = choose_plan(plan_kind_, caps, static_cast<double>(N * esize_), 1.0, 0.0);
    std::vector<uint64_t> b = share_boundaries(pc.shares, N);
    for (int qi = 0; qi < P; qi++)
      reduce_segment(1, static_cast<uint64_t>(qi), qi, S_, b[static_cast<size_t>(qi)],
                     b[static_cast<size_t>(qi) + 1] - b[static_cast<size_t>(qi)], at(c_.out[0], b[static_cast<size_t>(qi)]),
                     true);
    plan_pending_ = false;
    record_plan(pc.kind, pc.shares, caps);
  }

  // Processes that run different programs (or the same collectives in another order) never
  // meet: each waits for the other's announcement of this collective while the other's
  // announcement of a different one sits in its staging. After R2CCL_MISMATCH_MS without the
  // peer's signature, this looks at what the peer sent that no receive has claimed; an
  // announcement of a collective this executor has not run, still there a quarter of that
  // later, fails the call with both named (each process sees the same, so both fail).
  // Processes in this very collective (same id) that disagree about what it is may not meet
  // either (a small all-reduce's message and another kind's announcement travel under
  // different tags): such an announcement is proof at once, looked for from kSameCallProbeNs.
  // Executor thread only (it calls into the engine).
  bool diverged() {
    const int64_t grace = static_cast<int64_t>(ep_.config().mismatch_ms) * 1000000;
    const int64_t now = mono_ns();
    if (sig_msgs_.empty() || now < started_ns_ + std::min(grace, kSameCallProbeNs) || now < next_probe_ns_)
      return false;
    next_probe_ns_ = now + std::max<int64_t>(std::min(grace, kSameCallProbeNs * 4) / 4, 1000000);
    bool suspect = false;
    for (const SigMsg& sm : sig_msgs_) {
      if (msgs_[sm.msg].req->finished()) continue;   // that peer answered: not this
      Sig other;
      if (same_instance_disagrees(sm.peer_process, &other)) {
        Error e = disagreement(sm.peer_process, other);
        finish(&e);
        return true;
      }
      if (now < started_ns_ + grace || !foreign_announcement(sm.peer_process, &other)) continue;
      if (!suspect_) {   // once more, a quarter of the grace later, before anyone is blamed
        suspect = true;
        continue;
      }
      Error e = divergence(sm.peer_process, other, now);
      finish(&e);
      return true;
    }
    if (suspect) next_probe_ns_ = now + std::max<int64_t>(grace / 4, 1000000);
    suspect_ = suspect;
    return false;
  }

  // This op has not had `peer`'s signature (its receive is pending or failed).
  bool awaits_signature(int peer) const {
    for (const SigMsg& sm : sig_msgs_)
      if (sm.peer_process == peer && (!msgs_[sm.msg].req->finished() || msgs_[sm.msg].req->failed())) return true;
    return false;
  }

  // An announcement from `peer` of a collective this executor never ran, waiting unclaimed.
  bool foreign_announcement(int peer, Sig* out) {
    for (auto& [tag, head] : ep_.staged_heads(peer, kSigBytes)) {
      (void)tag;
      *out = decode_signature(head.data());
      if (is_announcement(*out) && (*out)[5] != c_.tag && !ex_->ran((*out)[5])) return true;
    }
    return false;
  }

  // `peer`'s announcement of this collective (this id), waiting unclaimed, that says it is
  // another call: the peer's receive for it never matches ours.
  bool same_instance_disagrees(int peer, Sig* out) {
    for (auto& [tag, head] : ep_.staged_heads(peer, kSigBytes)) {
      (void)tag;
      *out = decode_signature(head.data());
      if (is_announcement(*out) && (*out)[5] == c_.tag && !same_call(*out, my_sig_)) return true;
    }
    return false;
  }

  Error disagreement(int peer, const Sig& other) const {
    return Error(Cause::kMismatch, peer,
                 "process " + std::to_string(peer) + " called " + describe_signature(other) + " but process " +
                     std::to_string(me_) + " called " + describe_signature(my_sig_) +
                     (other[3] != my_sig_[3]
                          ? (c_.kind == Kind::kPermute           ? " over a different group or permutation"
                             : c_.kind == Kind::kRaggedAllToAll ? " over a different group, output size or number of slices"
                                                                : " over a different group")
                          : "") +
                     (c_.what.empty() ? "" : " [" + c_.what + "]"));
  }

  Error divergence(int peer, const Sig& other, int64_t now) const {
    return Error(Cause::kMismatch, peer,
                 "process " + std::to_string(peer) + " is in another collective, " + describe_signature(other) +
                     " (id " + hex_id(other[5]) + "), while process " + std::to_string(me_) + " waits in " +
                     describe_signature(my_sig_) + " (id " + hex_id(c_.tag) + ")" +
                     (c_.what.empty() ? "" : " [" + c_.what + "]") + " for it (" +
                     std::to_string((now - started_ns_) / 1000000) +
                     " ms): the processes run different programs, or the same collectives in a different order");
  }

  // ---------------------------------------------------------------- ragged_all_to_all
  // Each local rank's slices go out at once; where they land is the receiver's business, and
  // it learns that from one metadata message per (sender rank, receiver rank): the sender's
  // output offsets, send sizes and receive sizes for that pair, and whether its own slices
  // were valid (with why not). Once every metadata message and signature is here, each
  // process checks the pairs both ways (what a sends b equals what b expects from a), the
  // placements and that no two slices overlap in an output, then posts each slice's receive
  // straight into the output at its offset. A bad slice anywhere fails every process.

  uint64_t ragged_meta_bytes() const { return 8 * (4 + 3 * spr_) + kRaggedWhyBytes; }

  std::string ragged_problem(size_t i) const {
    const RaggedSlices& r = c_.ragged[i];
    const auto in_rows = static_cast<int64_t>(c_.count / c_.row_elems);
    const auto out_rows = static_cast<int64_t>(c_.out_count / c_.row_elems);
    for (size_t k = 0; k < r.send.size(); k++) {
      const std::string sl = "slice " + std::to_string(k) + " ";
      if (r.send[k] < 0 || r.recv[k] < 0 || r.in_off[k] < 0 || r.out_off[k] < 0)
        return sl + "has a negative offset or size (input offset " + std::to_string(r.in_off[k]) + ", send size " +
               std::to_string(r.send[k]) + ", output offset " + std::to_string(r.out_off[k]) + ", receive size " +
               std::to_string(r.recv[k]) + ")";
      if (r.in_off[k] > in_rows - r.send[k])
        return sl + "sends rows " + std::to_string(r.in_off[k]) + " to " + std::to_string(r.in_off[k] + r.send[k]) +
               " of an input of " + std::to_string(in_rows) + " rows";
      if (r.out_off[k] > out_rows - r.send[k])
        return sl + "is written at rows " + std::to_string(r.out_off[k]) + " to " +
               std::to_string(r.out_off[k] + r.send[k]) + " of its receiver's output of " + std::to_string(out_rows) +
               " rows";
      if (r.recv[k] > out_rows)
        return sl + "receives " + std::to_string(r.recv[k]) + " rows into an output of " + std::to_string(out_rows);
    }
    return {};
  }

  void plan_ragged() {
    const int n = static_cast<int>(c_.process_of_rank.size());
    spr_ = c_.ragged.front().send.size() / static_cast<size_t>(n);
    const uint64_t row = c_.row_elems * esize_, mlen = ragged_meta_bytes();
    for (size_t i = 0; i < c_.in.size(); i++)
      for (size_t j = 0; j < c_.out.size(); j++)
        if (overlaps(c_.in[i], c_.count * esize_, c_.out[j], c_.out_count * esize_))
          throw Error(Cause::kInvalidArgument, -1, describe() + ": an input shares memory with an output");
    for (size_t i = 0; i < c_.my_ranks.size(); i++) {
      const int r = c_.my_ranks[i];
      const RaggedSlices& sl = c_.ragged[i];
      ragged_why_.push_back(ragged_problem(i));
      const std::string& why = ragged_why_.back();
      for (int d = 0; d < n; d++) {
        const int q = c_.process_of_rank[static_cast<size_t>(d)];
        if (q == me_) continue;
        uint8_t* m = temp(mlen);
        std::memset(m, 0, mlen);
        put64(m, kRaggedMagic);
        put64(m + 8, why.empty() ? 0 : 1);
        put64(m + 16, c_.out_count);
        put64(m + 24, c_.row_elems);
        for (size_t t = 0; t < spr_; t++) {
          const size_t k = static_cast<size_t>(d) * spr_ + t;
          put64(m + 32 + 24 * t, static_cast<uint64_t>(sl.out_off[k]));
          put64(m + 40 + 24 * t, static_cast<uint64_t>(sl.send[k]));
          put64(m + 48 + 24 * t, static_cast<uint64_t>(sl.recv[k]));
        }
        std::memcpy(m + mlen - kRaggedWhyBytes, why.data(), std::min<size_t>(why.size(), kRaggedWhyBytes - 1));
        send(q, mix_tag(c_.tag, 9, static_cast<uint64_t>(r), static_cast<uint64_t>(d), 0), m, mlen);
        uint8_t* got = temp(mlen);
        ragged_meta_.push_back(
            {recv(q, mix_tag(c_.tag, 9, static_cast<uint64_t>(d), static_cast<uint64_t>(r), 0), got, mlen), d, i, got});
        if (!why.empty()) continue;   // nothing of a bad rank's moves
        for (size_t t = 0; t < spr_; t++) {
          const size_t k = static_cast<size_t>(d) * spr_ + t;
          if (sl.send[k] > 0)
            send(q, mix_tag(c_.tag, 10, static_cast<uint64_t>(r), static_cast<uint64_t>(d), t),
                 at(c_.in[i], static_cast<uint64_t>(sl.in_off[k]) * c_.row_elems), static_cast<uint64_t>(sl.send[k]) * row);
        }
      }
    }
    ragged_pending_ = true;
  }

  // Returns true when the op finished (with an error); false while metadata is on its way or
  // once the slices' receives are posted.
  bool post_ragged() {
    for (const SigMsg& sm : sig_msgs_)
      if (!msgs_[sm.msg].req->finished() || msgs_[sm.msg].req->failed()) return false;
    for (const RaggedMeta& rm : ragged_meta_)
      if (!msgs_[rm.msg].req->finished() || msgs_[rm.msg].req->failed()) return false;
    ragged_pending_ = false;
    const int n = static_cast<int>(c_.process_of_rank.size());
    const auto out_rows = static_cast<int64_t>(c_.out_count / c_.row_elems);
    const uint64_t row = c_.row_elems * esize_, mlen = ragged_meta_bytes();
    auto fail = [&](Cause cause, int peer_rank, const std::string& why) {
      Error e(cause, peer_rank < 0 ? -1 : c_.process_of_rank[static_cast<size_t>(peer_rank)], describe() + ": " + why);
      return finish(&e);
    };
    // A rank whose own slices are wrong: every process names it and its reason.
    for (size_t i = 0; i < ragged_why_.size(); i++)
      if (!ragged_why_[i].empty())
        return fail(Cause::kInvalidArgument, -1, "rank " + std::to_string(c_.my_ranks[i]) + ": " + ragged_why_[i]);
    for (const RaggedMeta& rm : ragged_meta_) {
      const uint8_t* m = rm.where;
      if (get64(m) != kRaggedMagic || get64(m + 16) != c_.out_count || get64(m + 24) != c_.row_elems)
        return fail(Cause::kProtocol, rm.from, "rank " + std::to_string(rm.from) + "'s ragged metadata is malformed");
      if (get64(m + 8) != 0) {
        std::string why;
        for (uint64_t b = mlen - kRaggedWhyBytes; b < mlen && m[b]; b++)
          why += m[b] >= 0x20 && m[b] < 0x7f ? static_cast<char>(m[b]) : '?';
        return fail(Cause::kInvalidArgument, rm.from, "rank " + std::to_string(rm.from) + ": " + why);
      }
    }
    // Every pair, both ways; placements; overlaps. (a sends b, b is local; slice t of spr_.)
    struct Land {
      int64_t off, rows;
      int from;
      size_t t;
      const void* src;   // a local sender's rows, else null (a receive)
    };
    std::map<std::pair<int, size_t>, const RaggedMeta*> meta_of;   // (sender rank, local receiver)
    for (const RaggedMeta& x : ragged_meta_) meta_of[{x.from, x.local}] = &x;
    for (size_t bi = 0; bi < c_.my_ranks.size(); bi++) {
      const int b = c_.my_ranks[bi];
      const RaggedSlices& mine = c_.ragged[bi];
      std::vector<Land> lands;
      for (int a = 0; a < n; a++) {
        const bool local = c_.process_of_rank[static_cast<size_t>(a)] == me_;
        const RaggedMeta* rm = local ? nullptr : meta_of.at({a, bi});
        const size_t ai = local ? static_cast<size_t>(local_index(a)) : 0;
        for (size_t t = 0; t < spr_; t++) {
          const size_t k = static_cast<size_t>(b) * spr_ + t, j = static_cast<size_t>(a) * spr_ + t;
          int64_t off, rows;
          if (local) {
            off = c_.ragged[ai].out_off[k];
            rows = c_.ragged[ai].send[k];
          } else {
            off = static_cast<int64_t>(get64(rm->where + 32 + 24 * t));
            rows = static_cast<int64_t>(get64(rm->where + 40 + 24 * t));
            const auto expects = static_cast<int64_t>(get64(rm->where + 48 + 24 * t));
            if (expects != mine.send[j])
              return fail(Cause::kMismatch, a,
                          "rank " + std::to_string(b) + " sends " + std::to_string(mine.send[j]) + " rows to rank " +
                              std::to_string(a) + " in slice " + std::to_string(t) + " of its " + std::to_string(spr_) +
                              ", which expects " + std::to_string(expects));
          }
          if (rows != mine.recv[j])
            return fail(Cause::kMismatch, local ? -1 : a,
                        "rank " + std::to_string(a) + " sends " + std::to_string(rows) + " rows to rank " +
                            std::to_string(b) + " in slice " + std::to_string(t) + " of its " + std::to_string(spr_) +
                            ", which expects " + std::to_string(mine.recv[j]));
          if (off < 0 || rows < 0 || off > out_rows - rows)   // (the sender checked; this came from the network)
            return fail(Cause::kProtocol, local ? -1 : a,
                        "rank " + std::to_string(a) + " places " + std::to_string(rows) + " rows at row " +
                            std::to_string(off) + " of an output of " + std::to_string(out_rows));
          if (rows > 0)
            lands.push_back({off, rows, a, t,
                             local ? at(c_.in[ai], static_cast<uint64_t>(c_.ragged[ai].in_off[k]) * c_.row_elems)
                                   : nullptr});
        }
      }
      std::sort(lands.begin(), lands.end(), [](const Land& x, const Land& y) {
        return std::tie(x.off, x.from, x.t) < std::tie(y.off, y.from, y.t);
      });
      for (size_t i = 1; i < lands.size(); i++)
        if (lands[i].off < lands[i - 1].off + lands[i - 1].rows)
          return fail(Cause::kInvalidArgument, -1,
                      "rows " + std::to_string(lands[i].off) + " to " +
                          std::to_string(std::min(lands[i].off + lands[i].rows, lands[i - 1].off + lands[i - 1].rows)) +
                          " of rank " + std::to_string(b) + "'s output are written by rank " +
                          std::to_string(lands[i - 1].from) + " (slice " + std::to_string(lands[i - 1].t) +
                          ") and by rank " + std::to_string(lands[i].from) + " (slice " + std::to_string(lands[i].t) +
                          ")");
      for (const Land& l : lands) {
        uint8_t* dst = at(c_.out[bi], static_cast<uint64_t>(l.off) * c_.row_elems);
        const uint64_t bytes = static_cast<uint64_t>(l.rows) * row;
        if (l.src)
          final_copies_.push_back({dst, l.src, bytes});
        else
          recv(c_.process_of_rank[static_cast<size_t>(l.from)],
               mix_tag(c_.tag, 10, static_cast<uint64_t>(l.from), static_cast<uint64_t>(b), l.t), dst, bytes);
      }
    }
    return false;
  }

  void record_plan(PlanKind kind, std::vector<double> shares, std::vector<double> caps) {
    std::lock_guard<std::mutex> g(ex_->plan_mu_);
    PlanRecord& r = ex_->last_plan_;
    r.kind = kind;
    r.algo = algo_;
    r.shares = std::move(shares);
    r.capacities = std::move(caps);   // empty: not exchanged (two processes: nothing to plan)
    r.processes = procs_;
    r.bytes = c_.count * esize_;
    r.serial++;
  }

  // Returns false (after failing the call) when a peer's signature differs. Note: the fold of
  // a small all-reduce may already have run; finish() reports the error instead of a result.
  bool signatures_agree() {
    for (const SigMsg& sm : sig_msgs_) {
      if (!msgs_[sm.msg].req->finished() || msgs_[sm.msg].req->failed()) continue;
      const Sig peer = decode_signature(sm.where);
      if (!same_call(peer, my_sig_)) {
        Error e = disagreement(sm.peer_process, peer);
        finish(&e);
        return false;
      }
    }
    return true;
  }

  void plan() {
    my_sig_ = signature();
    const int n = static_cast<int>(c_.process_of_rank.size());
    const int P = static_cast<int>(procs_.size());
    const uint64_t N = c_.count;
    // (The ring has no one-step exchange: that would be a direct peer for every process.)
    const bool small_all_reduce =
        c_.kind == Kind::kAllReduce && N * esize_ <= opt_.small_bytes && !ring_ && !doubling_;
    inline_ok_ = small_all_reduce && P > 1;
    // With two processes each moves the whole vector whatever it owns: no plan to wait for.
    // The ring has no owners to plan.
    const bool planned = c_.kind == Kind::kAllReduce && !small_all_reduce && P > 2 && !ring_ && !doubling_;
    if (planned) {
      std::function<double()> source;
      {
        std::lock_guard<std::mutex> g(ex_->plan_mu_);
        source = ex_->capacity_;
      }
      my_capacity_ = source ? source() : 1.0;
      if (!std::isfinite(my_capacity_) || my_capacity_ < 0) my_capacity_ = 0;
    }
    if (!small_all_reduce) exchange_signatures(planned);
    if (ring_ || doubling_) listen();
    switch (c_.kind) {
      case Kind::kAllReduce: {
        // Inputs that alias outputs must be copied: other shards' results land in out[0].
        bool alias = false;
        for (size_t i = 0; i < (c_.prefolded ? 1 : c_.in.size()); i++)
          for (size_t j = 0; j < c_.out.size(); j++) alias |= overlaps(c_.in[i], N * esize_, c_.out[j], N * esize_);
        const uint8_t* S = local_sum(N, alias && P > 1);
        if (ring_ || doubling_) {
          if (ring_)
            ring_all_reduce(S, N);
          else
            doubling_all_reduce(S, N);
          record_plan(PlanKind::kBalance, {}, {});
        } else if (P == 1 || small_all_reduce) {
          // One step: every process gets every S_p and folds them in canonical order.
          reduce_segment_all(S, N);
        } else if (!planned) {
          for (int qi = 0; qi < P; qi++) {
            uint64_t a = N * static_cast<uint64_t>(qi) / P, b = N * static_cast<uint64_t>(qi + 1) / P;
            reduce_segment(1, static_cast<uint64_t>(qi), qi, S, a, b - a, at(c_.out[0], a), true);
          }
          record_plan(PlanKind::kBalance, std::vector<double>(static_cast<size_t>(P), 1.0 / P), {});
        } else {
          // Owners and their shares wait for every process's capacity, which travels with
          // the signatures (post_planned): the same plan on every process, per call.
          S_ = S;
          plan_pending_ = true;
        }
        copy_out_to_other_locals(N);
        break;
      }
      case Kind::kReduceScatter: {
        const uint64_t shard = N / static_cast<uint64_t>(n);
        const uint8_t* S = local_sum(N, false);
        if (ring_) {
          ring_reduce_scatter(S, shard, n);
          break;
        }
        for (int r = 0; r < n; r++) {
          int owner = c_.process_of_rank[r];
          int oi = static_cast<int>(std::find(procs_.begin(), procs_.end(), owner) - procs_.begin());
          void* dest = owner == me_ ? c_.out[local_index(r)] : nullptr;
          reduce_segment(3, static_cast<uint64_t>(r), oi, S, shard * static_cast<uint64_t>(r), shard, dest, false);
        }
        break;
      }
      case Kind::kAllGather: {
        const uint64_t bytes = N * esize_;
        for (size_t i = 0; i < c_.my_ranks.size(); i++) {
          int r = c_.my_ranks[i];
          final_copies_.push_back({at(c_.out[0], N * static_cast<uint64_t>(r)), c_.in[i], bytes});
          if (ring_) {
            ring_send(14, static_cast<uint64_t>(r), static_cast<const uint8_t*>(c_.in[i]), N);
            continue;
          }
          for (int q : procs_)
            if (q != me_) send(q, mix_tag(c_.tag, 5, static_cast<uint64_t>(r), 0, 0), c_.in[i], bytes);
        }
        for (int r = 0; r < n; r++)
          if (ring_ && c_.process_of_rank[r] != me_)
            // Each block goes around the ring from its process, and stops before it again.
            ring_relay(14, static_cast<uint64_t>(r), at(c_.out[0], N * static_cast<uint64_t>(r)), N,
                       ring_next() != c_.process_of_rank[r]);
          else if (c_.process_of_rank[r] != me_)
            recv(c_.process_of_rank[r], mix_tag(c_.tag, 5, static_cast<uint64_t>(r), 0, 0),
                 at(c_.out[0], N * static_cast<uint64_t>(r)), bytes);
        // out[0] is complete only after the local copies: order them before the fan-out.
        for (size_t i = 1; i < c_.out.size(); i++) final_copies_.push_back({c_.out[i], c_.out[0], N * n * esize_});
        break;
      }
      case Kind::kAllToAll: {
        const uint64_t chunk = N / static_cast<uint64_t>(n);
        const uint64_t bytes = chunk * esize_;
        for (size_t i = 0; i < c_.my_ranks.size(); i++) {
          int r = c_.my_ranks[i];
          for (int j = 0; j < n; j++) {
            const uint8_t* src = at(c_.in[i], chunk * static_cast<uint64_t>(j));
            if (c_.process_of_rank[j] == me_)
              final_copies_.push_back({at(c_.out[local_index(j)], chunk * static_cast<uint64_t>(r)), src, bytes});
            else
              send(c_.process_of_rank[j], mix_tag(c_.tag, 6, static_cast<uint64_t>(r), static_cast<uint64_t>(j), 0), src,
                   bytes);
          }
        }
        for (int r = 0; r < n; r++) {
          if (c_.process_of_rank[r] == me_) continue;
          for (size_t i = 0; i < c_.my_ranks.size(); i++) {
            int j = c_.my_ranks[i];
            recv(c_.process_of_rank[r], mix_tag(c_.tag, 6, static_cast<uint64_t>(r), static_cast<uint64_t>(j), 0),
                 at(c_.out[i], chunk * static_cast<uint64_t>(r)), bytes);
          }
        }
        break;
      }
      case Kind::kPermute: {
        // Rank r's input goes to rank perm[r]: a copy when that rank is ours, else one message.
        const uint64_t bytes = N * esize_;
        std::vector<int> source(static_cast<size_t>(n), -1);
        for (int r = 0; r < n; r++)
          if (c_.perm[static_cast<size_t>(r)] >= 0) source[static_cast<size_t>(c_.perm[static_cast<size_t>(r)])] = r;
        for (size_t i = 0; i < c_.my_ranks.size(); i++) {
          const int r = c_.my_ranks[i], d = c_.perm[static_cast<size_t>(r)];
          if (d < 0) continue;
          if (c_.process_of_rank[d] == me_)
            final_copies_.push_back({c_.out[local_index(d)], c_.in[i], bytes});
          else
            send(c_.process_of_rank[d], mix_tag(c_.tag, 8, static_cast<uint64_t>(r), static_cast<uint64_t>(d), 0),
                 c_.in[i], bytes);
        }
        for (size_t i = 0; i < c_.my_ranks.size(); i++) {
          const int r = c_.my_ranks[i], s = source[static_cast<size_t>(r)];
          if (s < 0)
            final_copies_.push_back({c_.out[i], nullptr, bytes});
          else if (c_.process_of_rank[s] != me_)
            recv(c_.process_of_rank[s], mix_tag(c_.tag, 8, static_cast<uint64_t>(s), static_cast<uint64_t>(r), 0),
                 c_.out[i], bytes);
        }
        break;
      }
      case Kind::kRaggedAllToAll:
        plan_ragged();
        break;
      case Kind::kBroadcast: {
        const uint64_t bytes = N * esize_;
        int root_proc = c_.process_of_rank[c_.root];
        uint64_t tag = mix_tag(c_.tag, 7, 0, 0, 0);
        if (root_proc == me_) {
          const void* src = c_.in[local_index(c_.root)];
          if (ring_)
            ring_send(15, 0, static_cast<const uint8_t*>(src), N);
          else
            for (int q : procs_)
              if (q != me_) send(q, tag, src, bytes);
          for (size_t i = 0; i < c_.out.size(); i++)
            if (c_.out[i] != src) final_copies_.push_back({c_.out[i], src, bytes});
        } else if (ring_) {
          // Along the ring from the root; the process before the root is the last.
          ring_relay(15, 0, static_cast<uint8_t*>(c_.out[0]), N, ring_next() != root_proc);
          copy_out_to_other_locals(N);
        } else {
          recv(root_proc, tag, c_.out[0], bytes);
          copy_out_to_other_locals(N);
        }
        break;
      }
    }
  }

  // --- The ring (AlgoKind::kRing): messages only to the next process in canonical order
  // (wrapping) and from the previous one, in pieces of opt_.piece_bytes, so a long ring is a
  // pipeline. Tags: (phase, segment, piece); every hop of a segment's piece uses the same tag
  // (a tag is matched per peer, and each hop has its own pair of processes).

  // The ring's neighbours, each once (two processes: one).
  std::vector<int> ring_neighbours() const {
    std::vector<int> out{ring_prev()};
    if (ring_next() != ring_prev()) out.push_back(ring_next());
    return out;
  }

  // The processes this op exchanges with (its signatures go to them): every other process
  // of the group (direct), the ring's two neighbours, or the doubling partners.
  std::vector<int> neighbours() const {
    if (ring_) return ring_neighbours();
    if (doubling_) {
      std::vector<int> out;
      for (int qi : doubling_partners(mi_, static_cast<int>(procs_.size()))) out.push_back(procs_[static_cast<size_t>(qi)]);
      return out;
    }
    return procs_;
  }

  // Under the ring (or doubling) a process has only its neighbours' signatures, and a failure
  // (a mismatch, a peer gone) is seen first by the failed process's neighbours: each such op
  // listens for an abort notice from every neighbour, and an op that fails sends its error to
  // them (a neighbour passes it on to its others), so every process fails with the first
  // cause within P/2 hops (log2 P for doubling) instead of waiting out its timeout. Listening
  // receives are not the op's messages: they are cancelled when it finishes, and a notice
  // arriving later stays unclaimed in staging.
  void listen() {
    const uint64_t tag = mix_tag(c_.tag, kAbortPhase, 0, 0, 0);
    for (int q : neighbours()) {
      uint8_t* b = temp(kAbortBytes);
      notices_.push_back({ep_.post_recv(q, tag, b, kAbortBytes, wake_, true), q, b});
    }
  }

  bool notice_arrived() {
    for (const Notice& n : notices_) {
      const auto& req = n.msg_req;
      if (!req->finished() || req->failed()) continue;
      // From the network: every field is checked before it is believed.
      uint64_t cause = 0, origin = 0;
      std::memcpy(&cause, n.where, 8);
      std::memcpy(&origin, n.where + 8, 8);
      std::string text;
      for (uint64_t i = 16; i < kAbortBytes && n.where[i]; i++)
        text += (n.where[i] >= 0x20 && n.where[i] < 0x7f) ? static_cast<char>(n.where[i]) : '?';
      const Cause c = cause < std::size(kCauseNames) ? static_cast<Cause>(cause) : Cause::kProtocol;
      const int from = origin < static_cast<uint64_t>(std::numeric_limits<int>::max()) ? static_cast<int>(origin) : -1;
      notice_from_ = n.peer_process;
      notice_text_ = text;
      Error e(c, from, describe() + " failed on process " + std::to_string(from) + " of its ring (told by process " +
                           std::to_string(n.peer_process) + "): " + text);
      finish(&e);
      return true;
    }
    return false;
  }

  // On finishing: stop listening; after a failure, tell the neighbours (but the one that told us).
  void stop_listening(const Error* e) {
    for (const Notice& n : notices_)
      if (!n.msg_req->finished()) ep_.cancel(n.msg_req, Cause::kClosed, "collective finished");
    if (!e || notices_.empty()) return;
    auto note = std::make_shared<std::vector<uint8_t>>(kAbortBytes, 0);
    const uint64_t cause = static_cast<uint64_t>(e->cause());
    const uint64_t origin = static_cast<uint64_t>(notice_from_ >= 0 && e->peer() >= 0 ? e->peer() : me_);
    std::memcpy(note->data(), &cause, 8);
    std::memcpy(note->data() + 8, &origin, 8);
    const std::string what = notice_from_ >= 0 ? notice_text_ : std::string(e->what());   // the first account
    std::memcpy(note->data() + 16, what.data(), std::min<size_t>(what.size(), kAbortBytes - 17));
    const uint64_t tag = mix_tag(c_.tag, kAbortPhase, 0, 0, 0);
    for (int q : neighbours())
      if (q != notice_from_) ep_.post_send(q, tag, note->data(), kAbortBytes, [note] {}, true);
  }

  // The process `d` places after this one on the ring, as an index into procs_.
  int ring_index(int d) const {
    const int P = static_cast<int>(procs_.size());
    return ((mi_ + d) % P + P) % P;
  }
  int ring_next() const { return procs_[static_cast<size_t>(ring_index(1))]; }
  int ring_prev() const { return procs_[static_cast<size_t>(ring_index(-1))]; }
  uint64_t piece_elems() const { return std::max<uint64_t>(1, opt_.piece_bytes / esize_); }

  // Elements [off, off+n) of every process's S folded along the ring in canonical order:
  // process 0 sends its S on; process i receives the partial fold of 0..i-1, folds its own S
  // into it (partial (op) S_i: the canonical order) and sends it on; the last process's fold
  // is the result, copied to `last_dest` when given and sent to the next process (process 0)
  // under `last_phase` when that is not 0.
  void ring_reduce(uint64_t seg, const uint8_t* S, uint64_t off, uint64_t n, uint8_t* last_dest, uint64_t last_phase) {
    const int P = static_cast<int>(procs_.size());
    const uint64_t piece = piece_elems();
    for (uint64_t po = 0, k = 0; po < n; po += piece, k++) {
      const uint64_t pn = std::min(piece, n - po), bytes = pn * esize_;
      const uint64_t tag = mix_tag(c_.tag, 11, seg, 0, k);
      if (mi_ == 0) {
        send(ring_next(), tag, at(S, off + po), bytes);
        continue;
      }
      uint8_t* partial = temp(bytes);
      Piece pc;
      pc.elems = pn;
      pc.src = {partial, at(S, off + po)};
      pc.msg = {recv(ring_prev(), tag, partial, bytes), -1};
      pc.acc = partial;
      pc.dest = partial;
      if (mi_ + 1 < P) {
        pc.then_send.push_back({ring_next(), tag});
      } else {
        if (last_dest) pc.dest = last_dest + po * esize_;
        if (last_phase) pc.then_send.push_back({ring_next(), mix_tag(c_.tag, last_phase, seg, 0, k)});
      }
      pieces_.push_back(std::move(pc));
    }
  }

  // A message of n elements from the previous process, piece by piece, into dest (a buffer of
  // its own when null); each piece is passed on to the next process when `forward`.
  void ring_relay(uint64_t phase, uint64_t seg, uint8_t* dest, uint64_t n, bool forward) {
    const uint64_t piece = piece_elems();
    for (uint64_t po = 0, k = 0; po < n; po += piece, k++) {
      const uint64_t pn = std::min(piece, n - po), bytes = pn * esize_;
      const uint64_t tag = mix_tag(c_.tag, phase, seg, 0, k);
      uint8_t* d = dest ? dest + po * esize_ : temp(bytes);
      if (!forward) {
        recv(ring_prev(), tag, d, bytes);
        continue;
      }
      Piece pc;
      pc.elems = pn;
      pc.src = {d};
      pc.msg = {recv(ring_prev(), tag, d, bytes)};
      pc.acc = d;
      pc.dest = d;
      pc.then_send.push_back({ring_next(), tag});
      pieces_.push_back(std::move(pc));
    }
  }

  // n elements from src to the next process, piece by piece (what ring_relay receives).
  void ring_send(uint64_t phase, uint64_t seg, const uint8_t* src, uint64_t n) {
    const uint64_t piece = piece_elems();
    for (uint64_t po = 0, k = 0; po < n; po += piece, k++)
      send(ring_next(), mix_tag(c_.tag, phase, seg, 0, k), at(src, po), std::min(piece, n - po) * esize_);
  }

  // All-reduce: the fold along the ring ends at the last process with the result, which goes
  // on around the ring: P-1 -> 0 -> 1 -> ... -> P-2.
  void ring_all_reduce(const uint8_t* S, uint64_t N) {
    const int P = static_cast<int>(procs_.size());
    uint8_t* out = static_cast<uint8_t*>(c_.out[0]);
    ring_reduce(0, S, 0, N, out, 12);
    if (mi_ + 1 < P) ring_relay(12, 0, out, N, mi_ + 2 < P);
  }

  // Doubling all-reduce (recursive doubling after Bruck): slot j of a P-slot buffer holds the
  // local sum of the process j places after this one on the ring. In round r (d = 2^r) this
  // process sends slots [0, min(d, P-d)) to the process d before it, once they are here, and
  // receives as many into slots [d, ...) from the process d after it. Then every S_q is here,
  // folded in canonical order.
  void doubling_all_reduce(const uint8_t* S, uint64_t N) {
    const int P = static_cast<int>(procs_.size());
    const uint64_t bytes = N * esize_;
    slots_ = temp(static_cast<uint64_t>(P) * bytes);
    if (bytes) std::memcpy(slots_, S, bytes);
    slot_msg_.assign(static_cast<size_t>(P), -1);
    for (int d = 1, r = 0; d < P; d <<= 1, r++) {
      const int cnt = std::min(d, P - d);
      const int mi = recv(procs_[static_cast<size_t>(ring_index(d))], mix_tag(c_.tag, 16, static_cast<uint64_t>(r), 0, 0),
                          slots_ + static_cast<uint64_t>(d) * bytes, static_cast<uint64_t>(cnt) * bytes);
      for (int j = d; j < d + cnt; j++) slot_msg_[static_cast<size_t>(j)] = mi;
      rounds_.push_back({d, cnt, false});
    }
    Piece pc;
    pc.elems = N;
    pc.dest = c_.out[0];
    pc.acc = static_cast<uint8_t*>(c_.out[0]);   // never a source: the slots are this op's own
    for (int qi = 0; qi < P; qi++) {
      const int j = ((qi - mi_) % P + P) % P;
      pc.src.push_back(slots_ + static_cast<uint64_t>(j) * bytes);
      pc.msg.push_back(slot_msg_[static_cast<size_t>(j)]);
    }
    pieces_.push_back(std::move(pc));
  }

  void post_doubling_sends() {
    const uint64_t bytes = c_.count * esize_;
    for (size_t r = 0; r < rounds_.size(); r++) {
      Round& rd = rounds_[r];
      if (rd.sent) continue;
      bool ready = true;
      for (int j = 1; j < rd.cnt && ready; j++) {
        const int mi = slot_msg_[static_cast<size_t>(j)];
        ready = mi < 0 || arrived(msgs_[static_cast<size_t>(mi)].req);
      }
      if (!ready) continue;
      rd.sent = true;
      send(procs_[static_cast<size_t>(ring_index(-rd.d))], mix_tag(c_.tag, 16, r, 0, 0), slots_,
           static_cast<uint64_t>(rd.cnt) * bytes);
    }
  }

  // Reduce-scatter: each rank's shard is folded along the ring; the last process keeps the
  // shards it owns and sends the others on around the ring, each as far as its owner.
  void ring_reduce_scatter(const uint8_t* S, uint64_t shard, int n) {
    const int P = static_cast<int>(procs_.size());
    for (int r = 0; r < n; r++) {
      const int owner = c_.process_of_rank[r];
      const int oi = static_cast<int>(std::find(procs_.begin(), procs_.end(), owner) - procs_.begin());
      uint8_t* own = owner == me_ ? static_cast<uint8_t*>(c_.out[local_index(r)]) : nullptr;
      const uint64_t off = shard * static_cast<uint64_t>(r);
      if (oi == P - 1) {
        ring_reduce(static_cast<uint64_t>(r), S, off, shard, own, 0);
        continue;
      }
      ring_reduce(static_cast<uint64_t>(r), S, off, shard, nullptr, 13);
      if (mi_ <= oi) ring_relay(13, static_cast<uint64_t>(r), own, shard, mi_ < oi);
    }
  }

  // Small all-reduce: every process sends [signature | S_p] to every other in one message,
  // and all fold the same sequence (one message each way: the latency path).
  void reduce_segment_all(const uint8_t* S, uint64_t N) {
    const int P = static_cast<int>(procs_.size());
    const uint64_t bytes = N * esize_, framed = kSigBytes + bytes;
    Piece pc;
    pc.elems = N;
    pc.dest = c_.out[0];
    uint64_t tag = mix_tag(c_.tag, 9, 0, 0, 0);
    if (P > 1) {
      uint8_t* out = temp(framed);
      encode_signature(my_sig_, out);
      if (bytes) std::memcpy(out + kSigBytes, S, bytes);
      for (int q : procs_)
        if (q != me_) send(q, tag, out, framed);
    }
    for (int qi = 0; qi < P; qi++) {
      if (procs_[qi] == me_) {
        pc.src.push_back(S);
        pc.msg.push_back(-1);
      } else {
        uint8_t* b = temp(framed);
        int mi = recv(procs_[qi], tag, b, framed);
        sig_msgs_.push_back({mi, procs_[qi], b});
        pc.msg.push_back(mi);
        pc.src.push_back(b + kSigBytes);
      }
    }
    bool dest_is_source = overlaps(pc.dest, N * esize_, S, N * esize_);
    pc.acc = dest_is_source ? temp(N * esize_) : static_cast<uint8_t*>(pc.dest);
    pieces_.push_back(std::move(pc));
  }

  // An op is part of its executor: the executor owns it (incoming_ and its loop's list; a
  // request's callback reaches it only through a weak_ptr, under the Waker's lock that
  // close() takes), so these share the executor's lifetime, and the endpoint's.
  Executor* ex_;
  Endpoint& ep_;
  ProcessCall c_;
  int me_;
  CollectiveOptions opt_;
  PlanKind plan_kind_ = PlanKind::kAuto;
  AlgoKind algo_ = AlgoKind::kDirect;   // resolved (never kAuto); in the signature
  bool ring_ = false;                   // algo_ is the ring and there is more than one process
  bool doubling_ = false;               // algo_ is doubling (an all-reduce) over more than one process
  struct Round {
    int d, cnt;
    bool sent;
  };
  std::vector<Round> rounds_;           // doubling: its rounds
  uint8_t* slots_ = nullptr;            // doubling: every process's local sum, by ring distance
  std::vector<int> slot_msg_;           // doubling: the receive that fills each slot (-1: local)
  bool plan_pending_ = false;     // a large all-reduce waiting for every capacity
  // ragged_all_to_all: slices per peer, each local rank's account of its own bad slices (empty:
  // valid), the metadata messages from remote ranks, and whether the receives wait for them.
  size_t spr_ = 0;
  std::vector<std::string> ragged_why_;
  struct RaggedMeta {
    int msg;
    int from;                // the sending rank
    size_t local;            // index into my_ranks of the receiving rank
    const uint8_t* where;
  };
  std::vector<RaggedMeta> ragged_meta_;
  bool ragged_pending_ = false;
  double my_capacity_ = 1.0;
  const uint8_t* S_ = nullptr;    // this process's local sum, for the owners' segments
  std::function<void()> wake_;
  std::mutex step_mu_;       // step() runs on the executor, or inline on the engine thread
  bool inline_ok_ = false;
  std::atomic<bool> wants_executor_{false};
  size_t esize_;
  std::vector<int> procs_;   // processes of the group in canonical order
  int mi_ = 0;
  int64_t deadline_ns_ = 0;
  bool finished_ = false;
  std::vector<Msg> msgs_;
  std::vector<Piece> pieces_;
  std::vector<Copy> final_copies_;
  std::deque<ScratchCache::Block> temps_;   // registered with the endpoint from 64 KiB up
  Sig my_sig_{};
  struct SigMsg {
    int msg;                 // message index
    int peer_process;
    const uint8_t* where;    // the peer's signature once the message arrived
  };
  std::vector<SigMsg> sig_msgs_;
  struct Notice {
    std::shared_ptr<Request> msg_req;   // a listening receive (not in msgs_)
    int peer_process;
    const uint8_t* where;
  };
  std::vector<Notice> notices_;   // the ring's abort listeners (ring_listen)
  int notice_from_ = -1;          // the neighbour whose abort notice failed this op
  std::string notice_text_;       // and its account, passed on as it came
  std::set<int> sig_sends_;  // message indices of this process's signature sends
  int64_t started_ns_ = 0;       // diverged(): when this op started, and its last look at staging
  int64_t next_probe_ns_ = 0;
  bool suspect_ = false;
};

Executor::Executor(std::shared_ptr<Endpoint> ep, int my_process, CollectiveOptions opt)
    : ep_(std::move(ep)), my_process_(my_process), opt_(opt), waker_(std::make_shared<Waker>()) {
  if (!ep_) throw Error(Cause::kInvalidArgument, -1, "the collective executor needs an endpoint");
  scratch_ = std::make_shared<ScratchCache>(ep_);
  waker_->ex = this;
  if (!parse_plan(ep_->config().plan, &opt_.plan))
    throw Error(Cause::kInvalidArgument, -1, "R2CCL_PLAN=" + ep_->config().plan + " is not a plan");
  if (!parse_algo(ep_->config().algo, &opt_.algo))
    throw Error(Cause::kInvalidArgument, -1, algo_setting_error(ep_->config().algo));
  opt_.max_peers = ep_->config().max_peers;
  thread_ = std::thread([this] {
    name_this_thread("r2ccl-exec");
    log_bind_thread(ep_->config().debug_level, ep_->rank());
    loop();
  });
}

Executor::~Executor() { close(); }

void Executor::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> g(waker_->mu);   // waits for a callback in progress
  waker_->ex = nullptr;
}

void Executor::submit(ProcessCall call) {
  std::string bad = validate(call, my_process_);
  if (!bad.empty()) {
    Error e(Cause::kInvalidArgument, -1, std::string(kind_name(call.kind)) + ": " + bad);
    if (call.done) call.done(&e);
    return;
  }
  note_ran(call.tag);
  unfinished_.enter();   // until the op's finish(): every op created here finishes exactly once
  auto op = std::make_shared<Op>(this, *ep_, std::move(call), my_process_, opt_);
  std::weak_ptr<Op> weak = op;
  op->set_wake([waker = waker_, weak] {
    std::lock_guard<std::mutex> w(waker->mu);
    Executor* ex = waker->ex;
    if (!ex) return;   // closed: nothing waits for this completion any more
    if (auto o = weak.lock())
      if (o->try_complete_inline()) return;
    {
      std::lock_guard<std::mutex> g(ex->mu_);
      ex->wake_ = true;
    }
    ex->cv_.notify_one();
  });
  bool stopped;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped = stop_;
  }
  if (stopped) {   // closed: the call fails through its `done`, like any other failure
    op->abort_closed();
    return;
  }
  // Post the first messages from the caller's thread: one thread hop less on the latency
  // path of small collectives. The executor thread takes over from the next completion.
  if (op->start()) return;
  bool wake;
  {
    std::lock_guard<std::mutex> g(mu_);
    // Closed meanwhile: the loop has taken its last look at incoming_, so this op is ours
    // to fail (below, without mu_: finishing cancels requests, which waits for the engine).
    stopped = stop_;
    // A wake-up the engine thread sent before this push may already be consumed: ask the op.
    wake = !stopped && (!op->completes_inline() || op->wants_executor());
    if (!stopped) incoming_.push_back(op);
    wake_ = wake_ || wake;
  }
  if (stopped) {
    op->abort_closed();
    return;
  }
  if (wake) cv_.notify_one();
}

void Executor::op_finished() { unfinished_.leave(); }

size_t Executor::drain(double timeout_s) { return unfinished_.drain(timeout_s); }

void Executor::note_ran(uint64_t tag) {
  std::lock_guard<std::mutex> g(ran_mu_);
  if (!ran_set_.insert(tag).second) return;
  ran_order_.push_back(tag);
  if (ran_order_.size() > kRanKept) {
    ran_set_.erase(ran_order_.front());
    ran_order_.pop_front();
  }
}

bool Executor::ran(uint64_t tag) {
  std::lock_guard<std::mutex> g(ran_mu_);
  return ran_set_.count(tag) != 0;
}

void Executor::set_capacity_source(std::function<double()> fn) {
  std::lock_guard<std::mutex> g(plan_mu_);
  capacity_ = std::move(fn);
}

PlanRecord Executor::last_plan() {
  std::lock_guard<std::mutex> g(plan_mu_);
  return last_plan_;
}

void Executor::run(ProcessCall call) {
  // The answer by value (a copy of the error is thrown here: see Error's copy constructor).
  struct Result {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, failed = false;
    Error error{Cause::kInternal, -1, ""};
  };
  auto result = std::make_shared<Result>();
  double limit = call.timeout_s + 30;
  call.done = [result](const Error* e) {
    std::lock_guard<std::mutex> g(result->mu);
    if (e) result->error = *e;
    result->failed = e != nullptr;
    result->done = true;
    result->cv.notify_all();
  };
  submit(std::move(call));
  std::unique_lock<std::mutex> lk(result->mu);
  if (!result->cv.wait_for(lk, std::chrono::duration<double>(limit), [&] { return result->done; }))
    throw Error(Cause::kTimeout, -1, "collective executor did not answer");
  if (result->failed) throw Error(result->error);
}

void Executor::loop() {
  std::vector<std::shared_ptr<Op>> active, fresh;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      int64_t next = mono_ns() + 100 * 1000000LL;
      for (auto& op : active) next = std::min(next, op->deadline_ns());
      cv_.wait_for(lk, std::chrono::nanoseconds(std::max<int64_t>(0, next - mono_ns())),
                   [this] { return wake_ || stop_; });
      if (stop_) break;
      wake_ = false;
      while (!incoming_.empty()) {
        fresh.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    for (auto& op : fresh) active.push_back(std::move(op));
    fresh.clear();
    if (active.size() > peak_active_.load()) peak_active_.store(active.size());
    for (size_t i = 0; i < active.size();) {
      if (active[i]->step_locked()) {
        active.erase(active.begin() + static_cast<long>(i));
      } else {
        i++;
      }
    }
  }
  // Every op still here fails, with no executor lock held: an op's abort cancels its requests
  // (Engine::call waits for the engine thread) while the engine thread's completion callback
  // may wait for mu_ (the wake-up in submit()). Holding mu_ here deadlocked the two until the
  // engine call's 30 s deadline; the cancel then failed, and the engine wrote into buffers
  // freed with the op (the heap corruption at shutdown). submit() fails what arrives later.
  std::deque<std::shared_ptr<Op>> left;
  {
    std::lock_guard<std::mutex> g(mu_);
    left.swap(incoming_);
  }
  for (auto& op : active) op->abort_closed();
  for (auto& op : left) op->abort_closed();
}

}  // namespace r2ccl::coll
