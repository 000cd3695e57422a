// One collective's state machine (op.h). Its algorithm (coll/algo/) posts the messages; this
// folds what arrived in canonical order, compares signatures, probes for peers in another
// program, passes failures on, and finishes the call exactly once.
#include "coll/op.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "base/enum_names.h"

namespace r2ccl::coll {

namespace {

constexpr int64_t kNs = 1000000000;
// From this long into a collective, its executor looks (every 100 ms) for a peer's
// announcement of the same collective that says it is another call (Op::diverged).
constexpr int64_t kSameCallProbeNs = 100 * 1000000;

// The abort notice (Op::listen): cause, origin process, then a sentence.
constexpr uint64_t kAbortBytes = 512;

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string hex_id(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool overlaps(const void* a, uint64_t an, const void* b, uint64_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
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

}  // namespace

bool buffers_overlap(const void* a, uint64_t an, const void* b, uint64_t bn) { return overlaps(a, an, b, bn); }

Op::Op(Executor* ex, Endpoint& ep, ProcessCall c, int my_process, const CollectiveOptions& opt)
    : ex_(ex), ep_(ep), c_(std::move(c)), me_(my_process), opt_(opt), esize_(dtype_size(c_.dtype)) {
  plan_kind_ = opt_.plan;
  if (!c_.plan.empty()) parse_plan(c_.plan, &plan_kind_);   // validated by validate()
  AlgoKind want = opt_.algo;
  if (!c_.algo.empty()) parse_algo(c_.algo, &want);
  started_ns_ = mono_ns();
  deadline_ns_ = started_ns_ + static_cast<int64_t>(c_.timeout_s * kNs);
  for (int p : c_.process_of_rank)
    if (std::find(procs_.begin(), procs_.end(), p) == procs_.end()) procs_.push_back(p);
  mi_ = index_of(me_);
  // All-to-all and permute move fixed blocks between fixed pairs: always direct.
  algo_ = c_.kind == Kind::kAllToAll || c_.kind == Kind::kPermute || c_.kind == Kind::kRaggedAllToAll
              ? AlgoKind::kDirect
              : choose_algo(want, static_cast<int>(procs_.size()), opt_.max_peers, c_.kind == Kind::kAllReduce,
                            static_cast<double>(c_.count * esize_));
  if (algo_ == AlgoKind::kTwoLevel) group_ = two_level_group(static_cast<int>(procs_.size()), opt_.max_peers);
}

bool Op::start() {
  std::lock_guard<std::mutex> g(step_mu_);
  try {
    algorithm_ = make_algorithm(c_.kind, algo_, static_cast<int>(procs_.size()));
    my_sig_ = signature();
    algorithm_->start(*this);
  } catch (const Error& e) {
    return finish(&e);
  }
  return step();
}

bool Op::step_locked() {
  std::lock_guard<std::mutex> g(step_mu_);
  if (!finished_ && diverged()) return true;
  return step();
}

bool Op::try_complete_inline() {
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

void Op::abort(const Error& e) {
  std::lock_guard<std::mutex> g(step_mu_);
  finish(&e);
}

void Op::abort_closed() {
  abort(Error(Cause::kClosed, -1,
              describe() + " was still in flight when jax_r2ccl closed (shutdown() waits up to R2CCL_TIMEOUT "
                           "for the collectives in flight, then fails the rest)"));
}

// A message that failed fails the op (true: finished). Looked at before anything is folded
// and again before the op may finish: a receive the engine thread fails in between (a peer
// closing) is never folded (fold() and the slots wait only for messages that arrived) and
// never taken for done. CI's TSan run found a 2-process all-reduce finishing as a success
// with a wrong result while the peer closed: its failed receive had been folded.
bool Op::failed_message() {
  for (auto& m : msgs_)
    if (m.req && m.req->finished() && m.req->failed()) {
      const Cause c = m.req->error_cause();
      if ((c == Cause::kPeerGone || c == Cause::kClosed || c == Cause::kTimeout || c == Cause::kMismatch) &&
          better_account(m.peer_process))
        return true;
      if (c == Cause::kMismatch && awaiting_account()) return false;
      Error e(c, m.peer_process, describe() + ": " + m.req->error_message());
      return finish(&e);
    }
  return false;
}

// A peer that found the processes in different collectives (or in this one, called
// differently) may fail and leave before this process looked, and a message to or from it,
// or from a third process that gave up on the disagreement, fails with the peer gone or
// abandoned: what the peers said about the call is the better account. Finishes the op with
// it and returns true if there is one.
bool Op::better_account(int failed_peer) {
  Sig other;
  for (const SigMsg& sm : sig_msgs_)   // an announcement of this call, called differently
    if (!arrived(sm.msg) && same_instance_disagrees(sm.peer_process, &other)) {
      Error e = disagreement(sm.peer_process, other);
      return finish(&e);
    }
  // A process that found the mismatch itself tells every process of the call before it
  // leaves (stop_listening); its notice waits here, unclaimed, under this call's abort tag.
  // CI's quick tier: a process that entered a few ms after the others had found the
  // mismatch saw one of them gone ('the peer closed its end') while the other kind's
  // signature was still on its way.
  const uint64_t abort_tag = tag(Phase::kAbort);
  for (int q : procs_) {
    if (q == me_) continue;
    for (auto& [t, head] : ep_.staged_heads(q, kAbortBytes))
      if (t == abort_tag && head.size() == kAbortBytes) {
        Error e = notice_error(q, head.data());
        if (e.cause() != Cause::kMismatch) continue;
        notice_from_ = q;
        notice_text_ = notice_text(head.data());
        return finish(&e);
      }
  }
  // An announcement of a call this process has not run is no proof while this process has
  // other calls in flight, or had one fail for another cause lately (peer gone, rails down,
  // timeout; in the last minute, or twice the timeout and R2CCL_MISMATCH_MS if longer): the
  // peer may be ahead in a sequence this process runs on another thread, or stopped running
  // when its call failed; and the peer may have left for a fault of its own. CI's fault
  // matrix: four calls in flight on each process, one host cut off; a survivor left 1.9 s
  // into this op, its announcement of a call this process's other thread had not reached
  // still here, and the cut-off host's failure was reported as a mismatch. Having waited
  // R2CCL_MISMATCH_MS, as diverged() does, the announcement counts again.
  if (awaits_signature(failed_peer)) {
    const int64_t now = mono_ns();
    const int64_t grace = mismatch_grace_ns();
    const int64_t lately = std::max<int64_t>(60 * kNs, 2 * (grace + static_cast<int64_t>(c_.timeout_s * kNs)));
    const bool alone = ex_->in_flight() <= 1 && !ex_->failed_since(now - lately);
    if ((alone || now >= started_ns_ + grace) && foreign_announcement(failed_peer, &other)) {
      Error e = divergence(failed_peer, other, now);
      return finish(&e);
    }
  }
  // A signature that arrived while this looked: staged_heads() runs on the engine thread
  // after every request posted before it, so a receive for the peer's signature posted
  // just before may have taken the announcement out of staging meanwhile. CI's quick tier:
  // a process that entered a few ms after the others had found the mismatch and left saw
  // its send to the gone peer fail, its signature receive match only during the look, and
  // reported 'the peer closed its end'.
  return !signatures_agree();
}

// Told only that the call mismatched (a peer abandoned its messages: the cause travels, not
// the account): the signatures still on their way name the disagreement, so wait for them,
// up to R2CCL_MISMATCH_MS and the deadline (the executor steps every op at least every
// 100 ms). CI's quick tier: a process that entered a few ms after the others, told by its
// own kind's peer that it gave up, reported "abandoned this message" while the other kind's
// signature was still on its way.
bool Op::awaiting_account() {
  const int64_t now = mono_ns();
  if (told_mismatch_ns_ == 0) told_mismatch_ns_ = now;
  const int64_t grace = mismatch_grace_ns();
  if (now >= std::min(told_mismatch_ns_ + grace, deadline_ns_)) return false;
  for (const SigMsg& sm : sig_msgs_)
    if (!msgs_[static_cast<size_t>(sm.msg)].req->finished()) return true;
  return false;
}

// R2CCL_MISMATCH_MS: how long an op waits before it takes a peer's announcement of another
// call for proof that the two run different programs.
int64_t Op::mismatch_grace_ns() const { return static_cast<int64_t>(ep_.config().mismatch_ms) * 1000000; }

bool Op::arrived(int i) const {
  const auto& r = msgs_[static_cast<size_t>(i)].req;
  return r->finished() && !r->failed();
}

// Folds what arrived, posts follow-ups; returns true when finished (done has run).
bool Op::step() {
  if (finished_) return true;
  if (!signatures_agree()) return true;   // the clearest account of a disagreement comes first
  if (notice_arrived()) return true;
  if (failed_message()) return true;
  if (algorithm_->advance(*this)) return true;
  bool progress = true;
  while (progress) {
    progress = false;
    for (auto& pc : pieces_) progress |= fold(pc);
  }
  // Once more after the folds: a message may have arrived (on the engine thread) since the
  // algorithm looked above, and what it lets go out must go before this op may finish (a
  // doubling fold can be complete while a later round's send still waits: found under ASan,
  // where a process finished without sending its last round and its partner waited out its
  // timeout).
  if (algorithm_->advance(*this)) return true;
  if (failed_message()) return true;
  bool all_done = !algorithm_->pending() &&
                  std::all_of(pieces_.begin(), pieces_.end(), [](const Piece& p) { return p.done; }) &&
                  std::all_of(msgs_.begin(), msgs_.end(),
                              [](const Msg& m) { return m.req && m.req->finished() && !m.req->failed(); });
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
    Error e = timed_out();
    return finish(&e);
  }
  return false;
}

Error Op::timed_out() const {
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
  return Error(Cause::kTimeout, waiting.size() == 1 ? *waiting.begin() : -1,
               describe() + " did not complete within " + std::to_string(c_.timeout_s) +
                   " s; still waiting on process(es) " + who +
                   " (did every process run the same collectives with the same shapes?)");
}

std::string Op::describe() const {
  return std::string(kind_name(c_.kind)) + (c_.what.empty() ? "" : " (" + c_.what + ")") + " of " +
         std::to_string(c_.count) + " " + dtype_name(c_.dtype) + " on process " + std::to_string(me_);
}

bool Op::finish(const Error* e) {
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
  if (e && e->cause() != Cause::kMismatch && e->cause() != Cause::kInvalidArgument) ex_->note_failure(mono_ns());
  if (c_.done) c_.done(e);
  ex_->op_finished();
  return true;
}

bool Op::fail(Cause cause, int peer_process, const std::string& why) {
  Error e(cause, peer_process, describe() + ": " + why);
  return finish(&e);
}

uint64_t Op::tag(Phase phase, uint64_t a, uint64_t b, uint64_t piece) const {
  return mix_tag(c_.tag, static_cast<uint64_t>(phase), a, b, piece);
}

int Op::send(int peer, uint64_t tag, const void* p, uint64_t bytes) {
  // Every tag of a collective is unique per message (mix_tag of its instance's tag, the
  // phase and the piece): matched once, nothing kept per tag.
  msgs_.push_back({ep_.post_send(peer, tag, p, bytes, wake_, true), peer});
  return static_cast<int>(msgs_.size()) - 1;
}

int Op::recv(int peer, uint64_t tag, void* p, uint64_t bytes) {
  msgs_.push_back({ep_.post_recv(peer, tag, p, bytes, wake_, true), peer});
  return static_cast<int>(msgs_.size()) - 1;
}

uint8_t* Op::temp(uint64_t bytes) {
  temps_.push_back(ex_->scratch().take(bytes));
  return temps_.back().data();
}

int Op::index_of(int process) const {
  return static_cast<int>(std::find(procs_.begin(), procs_.end(), process) - procs_.begin());
}

int Op::local_index(int rank) const {
  return static_cast<int>(std::find(c_.my_ranks.begin(), c_.my_ranks.end(), rank) - c_.my_ranks.begin());
}

int Op::ring_index(int d) const {
  const int P = static_cast<int>(procs_.size());
  return ((mi_ + d) % P + P) % P;
}

uint64_t Op::piece_elems() const { return std::max<uint64_t>(1, opt_.piece_bytes / esize_); }

bool Op::fold(Piece& p) {
  if (p.done) return false;
  bool moved = false;
  const uint64_t bytes = p.elems * esize_;
  while (p.next < p.src.size()) {
    int mi = p.msg[p.next];
    if (mi >= 0 && !arrived(mi)) break;
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

const uint8_t* Op::local_sum(uint64_t elems, bool must_copy) {
  // (Pre-folded on the devices: in[0] already is S, in the same order.)
  const bool one = c_.my_ranks.size() == 1 || c_.prefolded;
  if (one && !must_copy) return static_cast<const uint8_t*>(c_.in[0]);
  uint8_t* s = temp(elems * esize_);
  if (elems == 0) return s;   // nothing to fold (and no memcpy on a null buffer)
  std::memcpy(s, c_.in[0], elems * esize_);
  for (size_t i = 1; i < c_.in.size() && !one; i++) reduce_into(c_.dtype, c_.op, s, c_.in[i], elems);
  return s;
}

const uint8_t* Op::all_reduce_input() {
  const uint64_t bytes = c_.count * esize_;
  bool alias = false;
  for (size_t i = 0; i < (c_.prefolded ? 1 : c_.in.size()); i++)
    for (size_t j = 0; j < c_.out.size(); j++) alias |= overlaps(c_.in[i], bytes, c_.out[j], bytes);
  return local_sum(c_.count, alias && procs_.size() > 1);
}

void Op::reduce_segment(Phase reduce, std::optional<Phase> result, uint64_t seg_id, int owner_idx, const uint8_t* S,
                        uint64_t off, uint64_t n, void* dest) {
  const int P = static_cast<int>(procs_.size());
  const uint64_t piece = piece_elems();
  const int owner = procs_[static_cast<size_t>(owner_idx)];
  for (uint64_t po = 0, k = 0; po < n; po += piece, k++) {
    uint64_t pn = std::min(piece, n - po);
    uint64_t t = tag(reduce, seg_id, 0, k);
    if (owner != me_) {
      send(owner, t, at(S, off + po), pn * esize_);
      if (result) recv(owner, tag(*result, seg_id, 0, k), at(dest, po), pn * esize_);
      continue;
    }
    Piece pc;
    pc.elems = pn;
    pc.dest = at(dest, po);
    uint8_t* rbuf = P > 1 ? temp(static_cast<uint64_t>(P - 1) * pn * esize_) : nullptr;
    int slot = 0;
    for (int qi = 0; qi < P; qi++) {
      if (procs_[static_cast<size_t>(qi)] == me_) {
        pc.src.push_back(at(S, off + po));
        pc.msg.push_back(-1);
      } else {
        uint8_t* b = rbuf + static_cast<uint64_t>(slot++) * pn * esize_;
        pc.msg.push_back(recv(procs_[static_cast<size_t>(qi)], t, b, pn * esize_));
        pc.src.push_back(b);
      }
    }
    bool dest_is_source = overlaps(pc.dest, pn * esize_, at(S, off + po), pn * esize_);
    pc.acc = dest_is_source ? temp(pn * esize_) : static_cast<uint8_t*>(pc.dest);
    if (result)
      for (int q : procs_)
        if (q != me_) pc.then_send.push_back({q, tag(*result, seg_id, 0, k)});
    pieces_.push_back(std::move(pc));
  }
}

void Op::copy_out_to_other_locals(uint64_t out_elems) {
  for (size_t i = 1; i < c_.out.size(); i++) final_copies_.push_back({c_.out[i], c_.out[0], out_elems * esize_});
}

// What this process believes the collective is (coll/signature.h); every peer in the
// group sends its own and a difference (dtype, op, size, root, group) fails the call on
// every process with both versions named. Equal-sized mismatches (float32 vs int32) would
// otherwise go unseen.
Sig Op::signature() const {
  if (c_.kind == Kind::kRaggedAllToAll)   // (its output size, rows and slices per peer, in the group hash)
    return make_signature(c_.kind, c_.dtype, c_.op, plan_kind_, algo_, c_.count, c_.root, c_.process_of_rank, c_.tag,
                          {}, {c_.out_count, c_.row_elems, c_.ragged.front().send.size()});
  if (algo_ == AlgoKind::kTwoLevel)   // (its groups' size, R2CCL_MAX_PEERS's doing: in the group hash)
    return make_signature(c_.kind, c_.dtype, c_.op, plan_kind_, algo_, c_.count, c_.root, c_.process_of_rank, c_.tag,
                          {}, {static_cast<uint64_t>(group_)});
  return make_signature(c_.kind, c_.dtype, c_.op, plan_kind_, algo_, c_.count, c_.root, c_.process_of_rank, c_.tag,
                        c_.perm);
}

// Separate signature messages (the one-step all-reduce carries its own in front of its data:
// expect_signature). Every signature message carries a capacity (a double) after the
// signature, used by a planned all-reduce: one length for all, so processes that disagree
// about the call get the signature comparison's account of it, not a message-size error.
void Op::exchange_signatures(bool with_capacity) {
  if (procs_.size() < 2) return;
  const uint64_t t = tag(Phase::kSignature);
  const uint64_t len = kSigMessageBytes;
  uint8_t* mine = temp(len);
  encode_signature(my_sig_, mine);
  const double cap = with_capacity ? my_capacity_ : 0.0;
  std::memcpy(mine + kSigBytes, &cap, sizeof(double));
  for (int q : neighbours()) {
    if (q == me_) continue;
    sig_sends_.insert(send(q, t, mine, len));
    uint8_t* b = temp(len);
    sig_msgs_.push_back({recv(q, t, b, len), q, b});
  }
}

void Op::expect_signature(int msg, int peer_process, const uint8_t* where) {
  sig_msgs_.push_back({msg, peer_process, where});
}

bool Op::signatures_here() const {
  for (const SigMsg& sm : sig_msgs_)
    if (!arrived(sm.msg)) return false;
  return true;
}

std::vector<double> Op::capacities() const {
  std::vector<double> caps(procs_.size(), 0.0);
  for (size_t qi = 0; qi < procs_.size(); qi++) {
    if (procs_[qi] == me_) {
      caps[qi] = my_capacity_;
      continue;
    }
    for (const SigMsg& sm : sig_msgs_)
      if (sm.peer_process == procs_[qi]) caps[qi] = decode_capacity(sm.where + kSigBytes);
  }
  return caps;
}

void Op::read_capacity() {
  std::function<double()> source;
  {
    std::lock_guard<std::mutex> g(ex_->plan_mu_);
    source = ex_->capacity_;
  }
  my_capacity_ = source ? source() : 1.0;
  if (!std::isfinite(my_capacity_) || my_capacity_ < 0) my_capacity_ = 0;
}

void Op::record_plan(PlanKind kind, std::vector<double> shares, std::vector<double> caps, std::vector<int> processes) {
  std::lock_guard<std::mutex> g(ex_->plan_mu_);
  PlanRecord& r = ex_->last_plan_;
  r.kind = kind;
  r.algo = algo_;
  r.shares = std::move(shares);
  r.capacities = std::move(caps);   // empty: not exchanged (two processes: nothing to plan)
  r.processes = processes.empty() ? procs_ : std::move(processes);
  r.bytes = c_.count * esize_;
  r.serial++;
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
bool Op::diverged() {
  const int64_t grace = mismatch_grace_ns();
  const int64_t now = mono_ns();
  if (sig_msgs_.empty() || now < started_ns_ + std::min(grace, kSameCallProbeNs) || now < next_probe_ns_) return false;
  next_probe_ns_ = now + std::max<int64_t>(std::min(grace, kSameCallProbeNs * 4) / 4, 1000000);
  bool suspect = false;
  for (const SigMsg& sm : sig_msgs_) {
    if (msgs_[static_cast<size_t>(sm.msg)].req->finished()) continue;   // that peer answered: not this
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
bool Op::awaits_signature(int peer) const {
  for (const SigMsg& sm : sig_msgs_)
    if (sm.peer_process == peer && !arrived(sm.msg)) return true;
  return false;
}

// An announcement from `peer` of a collective this executor never ran, waiting unclaimed.
bool Op::foreign_announcement(int peer, Sig* out) {
  for (auto& [tag, head] : ep_.staged_heads(peer, kSigBytes)) {
    (void)tag;
    *out = decode_signature(head.data());
    if (is_announcement(*out) && (*out)[5] != c_.tag && !ex_->ran((*out)[5])) return true;
  }
  return false;
}

// `peer`'s announcement of this collective (this id), waiting unclaimed, that says it is
// another call: the peer's receive for it never matches ours.
bool Op::same_instance_disagrees(int peer, Sig* out) {
  for (auto& [tag, head] : ep_.staged_heads(peer, kSigBytes)) {
    (void)tag;
    *out = decode_signature(head.data());
    if (is_announcement(*out) && (*out)[5] == c_.tag && !same_call(*out, my_sig_)) return true;
  }
  return false;
}

Error Op::disagreement(int peer, const Sig& other) const {
  return Error(Cause::kMismatch, peer,
               "process " + std::to_string(peer) + " called " + describe_signature(other) + " but process " +
                   std::to_string(me_) + " called " + describe_signature(my_sig_) +
                   (other[3] != my_sig_[3]
                        ? (c_.kind == Kind::kPermute           ? " over a different group or permutation"
                           : c_.kind == Kind::kRaggedAllToAll ? " over a different group, output size or number of slices"
                           : algo_ == AlgoKind::kTwoLevel
                               ? " over a different group, or in two_level groups of another size (R2CCL_MAX_PEERS: "
                                 "this process's groups are of " + std::to_string(group_) + ")"
                               : " over a different group")
                        : "") +
                   (c_.what.empty() ? "" : " [" + c_.what + "]"));
}

Error Op::divergence(int peer, const Sig& other, int64_t now) const {
  return Error(Cause::kMismatch, peer,
               "process " + std::to_string(peer) + " is in another collective, " + describe_signature(other) + " (id " +
                   hex_id(other[5]) + "), while process " + std::to_string(me_) + " waits in " +
                   describe_signature(my_sig_) + " (id " + hex_id(c_.tag) + ")" +
                   (c_.what.empty() ? "" : " [" + c_.what + "]") + " for it (" +
                   std::to_string((now - started_ns_) / 1000000) +
                   " ms): the processes run different programs, or the same collectives in a different order");
}

// Returns false (after failing the call) when a peer's signature differs. Note: the fold of
// a small all-reduce may already have run; finish() reports the error instead of a result.
bool Op::signatures_agree() {
  for (const SigMsg& sm : sig_msgs_) {
    if (!arrived(sm.msg)) continue;
    const Sig peer = decode_signature(sm.where);
    if (!same_call(peer, my_sig_)) {
      Error e = disagreement(sm.peer_process, peer);
      finish(&e);
      return false;
    }
  }
  return true;
}

// Under the chain (or doubling) a process has only its neighbours' signatures, and a failure
// (a mismatch, a peer gone) is seen first by the failed process's neighbours: each such op
// listens for an abort notice from every neighbour, and an op that fails sends its error to
// them (a neighbour passes it on to its others), so every process fails with the first
// cause within P/2 hops (log2 P for doubling) instead of waiting out its timeout. Listening
// receives are not the op's messages: they are cancelled when it finishes, and a notice
// arriving later stays unclaimed in staging.
void Op::listen() {
  const uint64_t t = tag(Phase::kAbort);
  for (int q : neighbours()) {
    uint8_t* b = temp(kAbortBytes);
    notices_.push_back({ep_.post_recv(q, t, b, kAbortBytes, wake_, true), q, b});
  }
}

// An abort notice (cause, origin process, a sentence), from the network: every field is
// checked before it is believed.
std::string Op::notice_text(const uint8_t* where) {
  std::string text;
  for (uint64_t i = 16; i < kAbortBytes && where[i]; i++)
    text += (where[i] >= 0x20 && where[i] < 0x7f) ? static_cast<char>(where[i]) : '?';
  return text;
}

Error Op::notice_error(int told_by, const uint8_t* where) const {
  uint64_t cause = 0, origin = 0;
  std::memcpy(&cause, where, 8);
  std::memcpy(&origin, where + 8, 8);
  const Cause c = cause < std::size(kCauseNames) ? static_cast<Cause>(cause) : Cause::kProtocol;
  const int from = origin < static_cast<uint64_t>(std::numeric_limits<int>::max()) ? static_cast<int>(origin) : -1;
  return Error(c, from, describe() + " failed on process " + std::to_string(from) + " (told by process " +
                            std::to_string(told_by) + "): " + notice_text(where));
}

bool Op::notice_arrived() {
  for (const Notice& n : notices_) {
    const auto& req = n.msg_req;
    if (!req->finished() || req->failed()) continue;
    notice_from_ = n.peer_process;
    notice_text_ = notice_text(n.where);
    Error e = notice_error(n.peer_process, n.where);
    finish(&e);
    return true;
  }
  return false;
}

// On finishing: stop listening; after a failure, tell the neighbours (but the one that told us).
void Op::stop_listening(const Error* e) {
  for (const Notice& n : notices_)
    if (!n.msg_req->finished()) ep_.cancel(n.msg_req, Cause::kClosed, "collective finished");
  // A mismatch this process found itself goes to every process of the call, listening or
  // not: a process that enters late, or is told only that a peer gave up or left, finds it
  // in staging (better_account). Other failures go to the listening neighbours only.
  const bool tell_all = e && e->cause() == Cause::kMismatch && notice_from_ < 0;
  if (!e || (notices_.empty() && !tell_all)) return;
  auto note = std::make_shared<std::vector<uint8_t>>(kAbortBytes, 0);
  const uint64_t cause = static_cast<uint64_t>(e->cause());
  const uint64_t origin = static_cast<uint64_t>(notice_from_ >= 0 && e->peer() >= 0 ? e->peer() : me_);
  std::memcpy(note->data(), &cause, 8);
  std::memcpy(note->data() + 8, &origin, 8);
  const std::string what = notice_from_ >= 0 ? notice_text_ : std::string(e->what());   // the first account
  std::memcpy(note->data() + 16, what.data(), std::min<size_t>(what.size(), kAbortBytes - 17));
  const uint64_t t = tag(Phase::kAbort);
  for (int q : tell_all ? procs_ : neighbours())
    if (q != me_ && q != notice_from_) ep_.post_send(q, t, note->data(), kAbortBytes, [note] {}, true);
}

}  // namespace r2ccl::coll
