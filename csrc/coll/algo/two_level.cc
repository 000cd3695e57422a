// The two-level all-reduce (AlgoKind::kTwoLevel; auto's choice for a large all-reduce past
// R2CCL_MAX_PEERS). The P processes form g groups of m contiguous ones (plan.h:
// two_level_group): group k is processes k*m .. k*m+m-1 of the canonical order, and process
// k*m + j is column j of group k. Inside each group the vector is split among its members by
// the group's own plan (its members' capacities, which travel with the signatures, through
// choose_plan with the group's two_level_load), so a host short of NICs owns less, and so
// carries less of the exchange across groups too. For every element, in canonical order:
//   - each member of group k sends its local sum to the element's owner in group k;
//   - the owner in group 0 folds its group's contributions, S_0 (op) S_1 ... S_{m-1}, and
//     sends that running fold to the element's owner in group 1, who folds its own group's
//     contributions onto it one by one (fold (op) S_m (op) S_{m+1} ...), and so on: each
//     element meets the canonical order exactly, whatever the groups and plans;
//   - the owner in group g-1 has the result, which goes on around the groups (g-1 -> 0 ->
//     1 -> ... -> g-2), each owner sending it to its group's members.
// Peers: the group (m - 1) and the element's owners in the neighbouring groups (the same
// column when the groups' plans are equal). Messages are cut where the owners change and at
// multiples of the pipelining unit (absolute offsets, so both ends of a message cut it the
// same way) and tagged by their first element. With planned groups, each member sends its
// group's shares to its column's neighbours in the next and previous groups, which need
// them to know whom a range comes from and goes to; nothing is posted before they are here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "coll/op.h"

namespace r2ccl::coll {

namespace {

struct Range {
  uint64_t off = 0, n = 0;
  uint64_t end() const { return off + n; }
};

// [a ∩ b] cut at multiples of `grid` (absolute element offsets) and, so that a pipeline
// through ranges that start and end anywhere fills and drains in small steps, at grid/8,
// grid/4 and grid/2 (plan.h: kTwoLevelTaper) past the start and before the end of a and of b;
// in order. Symmetric in a and b, so both ends of a message cut it alike, and a range's cuts
// are among those of every message into it (a fold never spans two cells of a contribution).
template <class F>
void cells(Range a, Range b, uint64_t grid, F&& f) {
  uint64_t lo = std::max(a.off, b.off);
  const uint64_t hi = std::min(a.end(), b.end());
  if (lo >= hi) return;
  uint64_t taper[4 * kTwoLevelTaper];
  size_t nt = 0;
  for (const Range& r : {a, b})
    for (unsigned shift = kTwoLevelTaper; shift > 0; shift--) {
      const uint64_t d = grid >> shift;
      if (d == 0) continue;
      taper[nt++] = r.off + d;
      taper[nt++] = r.end() > d ? r.end() - d : 0;
    }
  while (lo < hi) {
    uint64_t next = std::min(hi, (lo / grid + 1) * grid);
    for (size_t i = 0; i < nt; i++)
      if (taper[i] > lo && taper[i] < next) next = taper[i];
    f(Range{lo, next - lo});
    lo = next;
  }
}

bool overlap(Range a, Range b) { return a.off < b.end() && b.off < a.end(); }

constexpr uint64_t kPlanMagic = 0x314e414c50325232ull;   // "2R2PLAN1"

class TwoLevelAllReduce final : public Algorithm {
 public:
  void start(Op& op) override {
    const int P = op.process_count();
    m_ = op.group_size();
    g_ = P / m_;
    k_ = op.my_index() / m_;
    j_ = op.my_index() % m_;
    kp_ = (k_ + g_ - 1) % g_;
    kn_ = (k_ + 1) % g_;
    N_ = op.call().count;
    planned_ = m_ > 1 && op.plan_kind() != PlanKind::kBalance;
    if (planned_) op.read_capacity();
    op.exchange_signatures(planned_);
    op.listen();
    S_ = op.all_reduce_input();
    shares_.assign(static_cast<size_t>(g_), {});
    op.copy_out_to_other_locals(N_);
    if (!planned_) {
      for (auto& s : shares_) s.assign(static_cast<size_t>(m_), 1.0 / m_);
      op.record_plan(PlanKind::kBalance, shares_[static_cast<size_t>(k_)], {}, group_processes(op));
      post(op);
      return;
    }
    if (g_ > 1)   // the neighbouring groups' shares
      for (int kk : column_neighbours()) {
        uint8_t* b = op.temp(plan_bytes());
        plan_in_.push_back({op.recv(member(op, kk, j_), op.tag(Phase::kTwoPlan), b, plan_bytes()), kk, b});
      }
  }

  bool advance(Op& op) override {
    if (!posted_) {
      if (!my_plan_) {
        if (!op.signatures_here()) return false;
        const std::vector<double> caps = op.capacities();
        const std::vector<double> mine(caps.begin() + k_ * m_, caps.begin() + (k_ + 1) * m_);
        PlanChoice pc = choose_plan(op.plan_kind(), mine, static_cast<double>(N_ * op.esize()), 1.0, 0.0,
                                    two_level_load(m_, g_, k_),
                                    std::ldexp(static_cast<double>(op.piece_elems() * op.esize()),
                                               -static_cast<int>(kTwoLevelTaper)),
                                    m_ - 1);
        shares_[static_cast<size_t>(k_)] = pc.shares;
        op.record_plan(pc.kind, pc.shares, mine, group_processes(op));
        my_plan_ = true;
        if (g_ > 1) {
          uint8_t* b = op.temp(plan_bytes());
          std::memcpy(b, &kPlanMagic, 8);
          std::memcpy(b + 8, pc.shares.data(), pc.shares.size() * sizeof(double));
          for (int kk : column_neighbours()) op.send(member(op, kk, j_), op.tag(Phase::kTwoPlan), b, plan_bytes());
        }
      }
      for (const PlanIn& pi : plan_in_)
        if (!op.arrived(pi.msg)) return false;
      for (const PlanIn& pi : plan_in_) {
        std::string why;
        if (!decode_shares(pi.where, &shares_[static_cast<size_t>(pi.group)], &why))
          return op.fail(Cause::kProtocol, member(op, pi.group, j_),
                         "group " + std::to_string(pi.group) + "'s shares from process " +
                             std::to_string(member(op, pi.group, j_)) + " are malformed: " + why);
      }
      post(op);
    }
    send_ready(op);
    return false;
  }

  bool pending() const override { return !posted_ || unsent_ > 0; }

  // Its group, and its column's members in the neighbouring groups (their abort notices and
  // signatures; the planned groups' owners of its ranges there, when they differ, are
  // reached by the data alone).
  std::vector<int> neighbours(const Op& op) const override {
    const int P = op.process_count(), m = op.group_size(), me = op.my_index(), k = me / m;
    std::vector<int> out;
    for (int i = k * m; i < k * m + m; i++) out.push_back(op.procs()[static_cast<size_t>(i)]);
    if (P / m > 1)
      for (int i : {(me + m) % P, (me - m + P) % P}) {
        const int q = op.procs()[static_cast<size_t>(i)];
        if (std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
      }
    return out;
  }

 private:
  struct PlanIn {
    int msg, group;
    const uint8_t* where;
  };
  struct Held {   // a range this process holds once a message arrived or a piece folded
    Range r;
    int id;         // message index (msgs) or piece index (pieces)
  };
  struct Out {
    int peer;
    uint64_t tag;
    const uint8_t* p;
    uint64_t bytes;
    std::vector<int> pieces, msgs;   // what must be done / here first
    bool sent = false;
  };

  int member(const Op& op, int group, int column) const {
    return op.procs()[static_cast<size_t>(group * m_ + column)];
  }
  std::vector<int> group_processes(const Op& op) const {
    return std::vector<int>(op.procs().begin() + k_ * m_, op.procs().begin() + (k_ + 1) * m_);
  }
  std::vector<int> column_neighbours() const {
    std::vector<int> out{kp_};
    if (kn_ != kp_) out.push_back(kn_);
    return out;
  }
  uint64_t plan_bytes() const { return 8 + 8 * static_cast<uint64_t>(m_); }

  // From the network: believed only when it is m finite shares >= 0 that sum to 1.
  bool decode_shares(const uint8_t* b, std::vector<double>* out, std::string* why) const {
    uint64_t magic;
    std::memcpy(&magic, b, 8);
    if (magic != kPlanMagic) return *why = "no plan message", false;
    std::vector<double> s(static_cast<size_t>(m_));
    std::memcpy(s.data(), b + 8, s.size() * sizeof(double));
    double sum = 0;
    for (double x : s) {
      if (!std::isfinite(x) || x < 0) return *why = "a share of " + std::to_string(x), false;
      sum += x;
    }
    if (std::fabs(sum - 1) > 1e-9) return *why = "shares summing to " + std::to_string(sum), false;
    *out = std::move(s);
    return true;
  }

  // The elements column j of group k owns (its group's shares, known; bounds_ from post()).
  Range owned(int k, int j) const {
    const std::vector<uint64_t>& b = bounds_[static_cast<size_t>(k)];
    return {b[static_cast<size_t>(j)], b[static_cast<size_t>(j) + 1] - b[static_cast<size_t>(j)]};
  }

  // The cells of the contributions to the range I of my group: a later group's are cut like
  // the running fold they meet (its messages from the group before), so each fold finds one
  // cell of every member's contribution; group 0's at the grid. Each with its turn: when the
  // owner will fold it. Group 0 folds as the contributions come: offset order. A later group
  // folds a cell when the running fold reaches it, and each owner in the group before
  // produces its range from the start, all at about the same pace (the same contributors
  // pace them): its distance from the start of that owner's range. With equal plans every
  // range lies in one range of the group before, and this is offset order; with unequal ones
  // (a host short of NICs owns less) offset order would hold back the cells the running fold
  // needs first behind ones it reaches last, and a slow host's results with them
  // (BENCHMARKS.md, issue 38).
  std::vector<std::pair<Range, uint64_t>> contribution_cells(Range I) const {
    std::vector<std::pair<Range, uint64_t>> out;
    if (k_ == 0)
      cells(I, Range{0, N_}, grid_, [&](Range r) { out.push_back({r, r.off}); });
    else
      against_group(I, kp_, [&](Range r, int x) { out.push_back({r, r.off - owned(kp_, x).off}); });
    return out;
  }

  // The column of group kk whose range holds element e (< N_).
  int column_at(int kk, uint64_t e) const {
    const std::vector<uint64_t>& b = bounds_[static_cast<size_t>(kk)];
    return static_cast<int>(std::upper_bound(b.begin() + 1, b.end(), e) - (b.begin() + 1));
  }

  // Every range r of `mine` held by group kk's owners: f(r, column).
  template <class F>
  void against_group(Range mine, int kk, F&& f) const {
    for (int x = 0; x < m_; x++) cells(mine, owned(kk, x), grid_, [&](Range r) { f(r, x); });
  }

  static std::vector<int> overlapping(const std::vector<Held>& held, Range r) {
    std::vector<int> out;
    for (const Held& h : held)
      if (overlap(h.r, r)) out.push_back(h.id);
    return out;
  }

  void post(Op& op) {
    posted_ = true;
    grid_ = op.piece_elems();
    bounds_.assign(shares_.size(), {});
    for (size_t kk = 0; kk < shares_.size(); kk++)
      if (!shares_[kk].empty()) bounds_[kk] = share_boundaries(shares_[kk], N_);
    const size_t es = op.esize();
    const Range all{0, N_};
    const Range I = owned(k_, j_);
    uint8_t* out0 = static_cast<uint8_t*>(op.call().out[0]);
    const bool last = k_ == g_ - 1;

    // My local sum's ranges to their owners in my group, in the order they fold them.
    for (int x = 0; x < m_; x++)
      if (x != j_)
      {
        std::vector<std::pair<Range, uint64_t>> cs = contribution_cells(owned(k_, x));
        std::stable_sort(cs.begin(), cs.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
        for (const auto& [r, turn] : cs)
          op.send(member(op, k_, x), op.tag(Phase::kTwoContrib, r.off), op.at(S_, r.off), r.n * es);
      }
    // My group's contributions to what I own, per member and cell (contribution_cells).
    const std::vector<std::pair<Range, uint64_t>> cc = I.n ? contribution_cells(I) : std::vector<std::pair<Range, uint64_t>>{};
    std::vector<std::vector<int>> contrib(static_cast<size_t>(m_));
    std::vector<uint8_t*> contrib_buf(static_cast<size_t>(m_), nullptr);
    for (int x = 0; x < m_; x++) {
      if (x == j_ || I.n == 0) continue;
      contrib_buf[static_cast<size_t>(x)] = op.temp(I.n * es);
      for (const auto& [r, turn] : cc)
        contrib[static_cast<size_t>(x)].push_back(op.recv(member(op, k_, x), op.tag(Phase::kTwoContrib, r.off),
                                                          contrib_buf[static_cast<size_t>(x)] + (r.off - I.off) * es,
                                                          r.n * es));
    }
    // The running fold of the groups before mine, from their owners (group 0 starts it), cut
    // like the contributions.
    uint8_t* in_buf = k_ > 0 && I.n ? op.temp(I.n * es) : nullptr;
    // The folds, one per cell: the running fold, then my group's local sums in canonical
    // order. The last group's land in the output; the others' go on to the next group.
    uint8_t* fold_buf = !last && I.n ? op.temp(I.n * es) : nullptr;
    std::vector<Held> folds;
    for (size_t i = 0; i < cc.size(); i++) {
      const Range f = cc[i].first;
      Op::Piece pc;
      pc.elems = f.n;
      if (k_ > 0) {
        const int x = column_at(kp_, f.off);
        pc.src.push_back(in_buf + (f.off - I.off) * es);
        pc.msg.push_back(op.recv(member(op, kp_, x), op.tag(Phase::kTwoFold, f.off), in_buf + (f.off - I.off) * es,
                                 f.n * es));
      }
      for (int x = 0; x < m_; x++) {
        pc.src.push_back(x == j_ ? op.at(S_, f.off) : contrib_buf[static_cast<size_t>(x)] + (f.off - I.off) * es);
        pc.msg.push_back(x == j_ ? -1 : contrib[static_cast<size_t>(x)][i]);
      }
      pc.dest = last ? out0 + f.off * es : fold_buf + (f.off - I.off) * es;
      pc.acc = static_cast<uint8_t*>(pc.dest);   // never a source: S is a copy where it aliases out
      folds.push_back({f, op.add_piece(std::move(pc))});
    }
    // The running fold on to the next group's owners.
    if (!last)
      against_group(I, kn_, [&](Range r, int x) {
        later(member(op, kn_, x), op.tag(Phase::kTwoFold, r.off), fold_buf + (r.off - I.off) * es, r.n * es,
              overlapping(folds, r), {});
      });
    // The result: folded here (the last group), or from the previous group's owners, then on
    // to the next group's (but from group g-2) and to my group's members.
    std::vector<Held> result_in;
    if (!last)
      against_group(I, kp_, [&](Range r, int x) {
        result_in.push_back({r, op.recv(member(op, kp_, x), op.tag(Phase::kTwoResult, r.off), out0 + r.off * es, r.n * es)});
      });
    auto result_ready = [&](Range r, std::vector<int>* pieces, std::vector<int>* msgs) {
      if (last)
        *pieces = overlapping(folds, r);
      else
        *msgs = overlapping(result_in, r);
    };
    if (g_ > 1 && k_ != g_ - 2)
      against_group(I, kn_, [&](Range r, int x) {
        std::vector<int> pieces, msgs;
        result_ready(r, &pieces, &msgs);
        later(member(op, kn_, x), op.tag(Phase::kTwoResult, r.off), out0 + r.off * es, r.n * es, pieces, msgs);
      });
    for (int x = 0; x < m_; x++)
      if (x != j_)
        cells(I, all, grid_, [&](Range r) {
          std::vector<int> pieces, msgs;
          result_ready(r, &pieces, &msgs);
          later(member(op, k_, x), op.tag(Phase::kTwoShare, r.off), out0 + r.off * es, r.n * es, pieces, msgs);
        });
    // What my group's other owners hold.
    for (int x = 0; x < m_; x++)
      if (x != j_)
        cells(all, owned(k_, x), grid_, [&](Range r) {
          op.recv(member(op, k_, x), op.tag(Phase::kTwoShare, r.off), out0 + r.off * es, r.n * es);
        });
  }

  void later(int peer, uint64_t tag, const uint8_t* p, uint64_t bytes, std::vector<int> pieces, std::vector<int> msgs) {
    outs_.push_back({peer, tag, p, bytes, std::move(pieces), std::move(msgs)});
    unsent_++;
  }

  // Sends what is ready: its pieces folded, its messages here (intact).
  void send_ready(Op& op) {
    while (first_unsent_ < outs_.size() && outs_[first_unsent_].sent) first_unsent_++;
    for (size_t i = first_unsent_; i < outs_.size(); i++) {
      Out& o = outs_[i];
      if (o.sent) continue;
      if (!std::all_of(o.pieces.begin(), o.pieces.end(), [&](int pc) { return op.piece_done(pc); }) ||
          !std::all_of(o.msgs.begin(), o.msgs.end(), [&](int mi) { return op.arrived(mi); }))
        continue;
      o.sent = true;
      unsent_--;
      op.send(o.peer, o.tag, o.p, o.bytes);
    }
  }

  int m_ = 1, g_ = 1, k_ = 0, j_ = 0, kp_ = 0, kn_ = 0;
  uint64_t N_ = 0, grid_ = 1;
  bool planned_ = false, my_plan_ = false, posted_ = false;
  const uint8_t* S_ = nullptr;
  std::vector<std::vector<double>> shares_;   // per group; the ones this process needs
  std::vector<std::vector<uint64_t>> bounds_;   // their share_boundaries, once posted
  std::vector<PlanIn> plan_in_;
  std::vector<Out> outs_;
  size_t first_unsent_ = 0, unsent_ = 0;
};

}  // namespace

std::unique_ptr<Algorithm> two_level_algorithm(Kind kind) {
  if (kind != Kind::kAllReduce)
    runs_no("two_level", kind);
  return std::make_unique<TwoLevelAllReduce>();
}

}  // namespace r2ccl::coll
