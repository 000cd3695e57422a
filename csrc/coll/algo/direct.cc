// The direct algorithms: every process exchanges with every other process of the group.
// All-reduce: a small one in one step (each process sends its local sum S_p to every other,
// all fold the same sequence); a large one by owners, each reducing its segment of the vector
// from every process's S and sending the result back, the segments split equally (two
// processes, or R2CCL_PLAN=balance) or by a plan over every process's capacity (coll/plan.h),
// which travels with the signatures so that every process computes the same one.
// Reduce-scatter: each rank's shard is reduced at its process. All-gather and broadcast: the
// blocks go straight to every process.
#include <algorithm>
#include <cstring>

#include "coll/op.h"

namespace r2ccl::coll {

namespace {

class DirectAllReduce final : public Algorithm {
 public:
  void start(Op& op) override {
    const ProcessCall& c = op.call();
    const int P = op.process_count();
    const uint64_t N = c.count;
    const bool small = N * op.esize() <= op.small_bytes();
    // With two processes each moves the whole vector whatever it owns: no plan to wait for.
    planned_ = !small && P > 2;
    if (small && P > 1) op.complete_inline();
    if (planned_) op.read_capacity();
    if (!small) op.exchange_signatures(planned_);
    const uint8_t* S = op.all_reduce_input();
    if (P == 1 || small) {
      one_step(op, S, N);
    } else if (!planned_) {
      for (int qi = 0; qi < P; qi++) {
        uint64_t a = N * static_cast<uint64_t>(qi) / P, b = N * static_cast<uint64_t>(qi + 1) / P;
        op.reduce_segment(Phase::kOwnerReduce, Phase::kOwnerResult, static_cast<uint64_t>(qi), qi, S, a, b - a,
                          op.at(c.out[0], a));
      }
      op.record_plan(PlanKind::kBalance, std::vector<double>(static_cast<size_t>(P), 1.0 / P), {});
    } else {
      // Owners and their shares wait for every process's capacity, which travels with the
      // signatures (advance): the same plan on every process, per call.
      S_ = S;
    }
    op.copy_out_to_other_locals(N);
  }

  // Once every capacity is here: the plan, the same on every process (a pure function of the
  // capacities in canonical order), then the owners' segments are posted.
  bool advance(Op& op) override {
    if (!planned_ || posted_ || !op.signatures_here()) return false;
    posted_ = true;
    const ProcessCall& c = op.call();
    const int P = op.process_count();
    const std::vector<double> caps = op.capacities();
    PlanChoice pc = choose_plan(op.plan_kind(), caps, static_cast<double>(c.count * op.esize()), 1.0, 0.0);
    std::vector<uint64_t> b = share_boundaries(pc.shares, c.count);
    for (int qi = 0; qi < P; qi++) {
      const size_t i = static_cast<size_t>(qi);
      op.reduce_segment(Phase::kOwnerReduce, Phase::kOwnerResult, i, qi, S_, b[i], b[i + 1] - b[i], op.at(c.out[0], b[i]));
    }
    op.record_plan(pc.kind, pc.shares, caps);
    return false;
  }

  bool pending() const override { return planned_ && !posted_; }

 private:
  // Every process sends [signature | S_p] to every other in one message, and all fold the
  // same sequence (one message each way: the latency path).
  static void one_step(Op& op, const uint8_t* S, uint64_t N) {
    const int P = op.process_count();
    const uint64_t bytes = N * op.esize(), framed = kSigBytes + bytes;
    Op::Piece pc;
    pc.elems = N;
    pc.dest = op.call().out[0];
    const uint64_t tag = op.tag(Phase::kOneStep);
    if (P > 1) {
      uint8_t* out = op.temp(framed);
      encode_signature(op.my_signature(), out);
      if (bytes) std::memcpy(out + kSigBytes, S, bytes);
      for (int q : op.procs())
        if (q != op.me()) op.send(q, tag, out, framed);
    }
    for (int q : op.procs()) {
      if (q == op.me()) {
        pc.src.push_back(S);
        pc.msg.push_back(-1);
      } else {
        uint8_t* b = op.temp(framed);
        int mi = op.recv(q, tag, b, framed);
        op.expect_signature(mi, q, b);
        pc.msg.push_back(mi);
        pc.src.push_back(b + kSigBytes);
      }
    }
    pc.acc = buffers_overlap(pc.dest, bytes, S, bytes) ? op.temp(bytes) : static_cast<uint8_t*>(pc.dest);
    op.add_piece(std::move(pc));
  }

  bool planned_ = false;
  bool posted_ = false;
  const uint8_t* S_ = nullptr;   // this process's local sum, for the owners' segments
};

class DirectReduceScatter final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    const uint64_t shard = c.count / static_cast<uint64_t>(n);
    const uint8_t* S = op.local_sum(c.count, false);
    for (int r = 0; r < n; r++) {
      const int owner = op.process_of(r);
      void* dest = owner == op.me() ? c.out[static_cast<size_t>(op.local_index(r))] : nullptr;
      op.reduce_segment(Phase::kScatterReduce, std::nullopt, static_cast<uint64_t>(r), op.index_of(owner), S,
                        shard * static_cast<uint64_t>(r), shard, dest);
    }
  }
};

class DirectAllGather final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    const uint64_t N = c.count, bytes = N * op.esize();
    for (size_t i = 0; i < c.my_ranks.size(); i++) {
      const int r = c.my_ranks[i];
      op.add_final_copy(op.at(c.out[0], N * static_cast<uint64_t>(r)), c.in[i], bytes);
      for (int q : op.procs())
        if (q != op.me()) op.send(q, op.tag(Phase::kGather, static_cast<uint64_t>(r)), c.in[i], bytes);
    }
    for (int r = 0; r < n; r++)
      if (op.process_of(r) != op.me())
        op.recv(op.process_of(r), op.tag(Phase::kGather, static_cast<uint64_t>(r)),
                op.at(c.out[0], N * static_cast<uint64_t>(r)), bytes);
    // out[0] is complete only after the local copies: order them before the fan-out.
    op.copy_out_to_other_locals(N * static_cast<uint64_t>(n));
  }
};

class DirectBroadcast final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    const ProcessCall& c = op.call();
    const uint64_t bytes = c.count * op.esize();
    const int root_proc = op.process_of(c.root);
    const uint64_t tag = op.tag(Phase::kBroadcast);
    if (root_proc == op.me()) {
      const void* src = c.in[static_cast<size_t>(op.local_index(c.root))];
      for (int q : op.procs())
        if (q != op.me()) op.send(q, tag, src, bytes);
      for (size_t i = 0; i < c.out.size(); i++)
        if (c.out[i] != src) op.add_final_copy(c.out[i], src, bytes);
    } else {
      op.recv(root_proc, tag, c.out[0], bytes);
      op.copy_out_to_other_locals(c.count);
    }
  }
};

}  // namespace

std::unique_ptr<Algorithm> direct_algorithm(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return std::make_unique<DirectAllReduce>();
    case Kind::kReduceScatter: return std::make_unique<DirectReduceScatter>();
    case Kind::kAllGather: return std::make_unique<DirectAllGather>();
    case Kind::kBroadcast: return std::make_unique<DirectBroadcast>();
    default: runs_no("the direct algorithm", kind);
  }
}

}  // namespace r2ccl::coll
