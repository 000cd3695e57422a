// The chain (AlgoKind::kRing, R2CCL_ALGO=ring; the default past R2CCL_MAX_PEERS for all but
// small all-reduces): messages only to the next process in canonical order (wrapping) and
// from the previous one, in pieces of the pipelining unit, so a long chain is a pipeline.
// Tags: (phase, segment, piece); every hop of a segment's piece uses the same tag (a tag is
// matched per peer, and each hop has its own pair of processes). A failure reaches the other
// processes through the op's abort notices (Op::listen).
#include <algorithm>

#include "coll/op.h"

namespace r2ccl::coll {

namespace {

// Elements [off, off+n) of every process's S folded along the ring in canonical order:
// process 0 sends its S on; process i receives the partial fold of 0..i-1, folds its own S
// into it (partial (op) S_i: the canonical order) and sends it on; the last process's fold
// is the result, copied to `last_dest` when given and sent to the next process (process 0)
// under `last` when given.
void chain_reduce(Op& op, uint64_t seg, const uint8_t* S, uint64_t off, uint64_t n, uint8_t* last_dest,
                  std::optional<Phase> last) {
  const int P = op.process_count(), mi = op.my_index();
  const uint64_t piece = op.piece_elems();
  for (uint64_t po = 0, k = 0; po < n; po += piece, k++) {
    const uint64_t pn = std::min(piece, n - po), bytes = pn * op.esize();
    const uint64_t tag = op.tag(Phase::kChainReduce, seg, 0, k);
    if (mi == 0) {
      op.send(op.ring_next(), tag, op.at(S, off + po), bytes);
      continue;
    }
    uint8_t* partial = op.temp(bytes);
    Op::Piece pc;
    pc.elems = pn;
    pc.src = {partial, op.at(S, off + po)};
    pc.msg = {op.recv(op.ring_prev(), tag, partial, bytes), -1};
    pc.acc = partial;
    pc.dest = partial;
    if (mi + 1 < P) {
      pc.then_send.push_back({op.ring_next(), tag});
    } else {
      if (last_dest) pc.dest = last_dest + po * op.esize();
      if (last) pc.then_send.push_back({op.ring_next(), op.tag(*last, seg, 0, k)});
    }
    op.add_piece(std::move(pc));
  }
}

// A message of n elements from the previous process, piece by piece, into dest (a buffer of
// its own when null); each piece is passed on to the next process when `forward`.
void chain_relay(Op& op, Phase phase, uint64_t seg, uint8_t* dest, uint64_t n, bool forward) {
  const uint64_t piece = op.piece_elems();
  for (uint64_t po = 0, k = 0; po < n; po += piece, k++) {
    const uint64_t pn = std::min(piece, n - po), bytes = pn * op.esize();
    const uint64_t tag = op.tag(phase, seg, 0, k);
    uint8_t* d = dest ? dest + po * op.esize() : op.temp(bytes);
    if (!forward) {
      op.recv(op.ring_prev(), tag, d, bytes);
      continue;
    }
    Op::Piece pc;
    pc.elems = pn;
    pc.src = {d};
    pc.msg = {op.recv(op.ring_prev(), tag, d, bytes)};
    pc.acc = d;
    pc.dest = d;
    pc.then_send.push_back({op.ring_next(), tag});
    op.add_piece(std::move(pc));
  }
}

// n elements from src to the next process, piece by piece (what chain_relay receives).
void chain_send(Op& op, Phase phase, uint64_t seg, const uint8_t* src, uint64_t n) {
  const uint64_t piece = op.piece_elems();
  for (uint64_t po = 0, k = 0; po < n; po += piece, k++)
    op.send(op.ring_next(), op.tag(phase, seg, 0, k), op.at(src, po), std::min(piece, n - po) * op.esize());
}

class Chain : public Algorithm {
 public:
  // The ring's neighbours, each once (two processes: one).
  std::vector<int> neighbours(const Op& op) const override {
    std::vector<int> out{op.ring_prev()};
    if (op.ring_next() != op.ring_prev()) out.push_back(op.ring_next());
    return out;
  }

 protected:
  static void begin(Op& op) {
    op.exchange_signatures(false);
    op.listen();
  }
};

// All-reduce: the fold along the ring ends at the last process with the result, which goes
// on around the ring: P-1 -> 0 -> 1 -> ... -> P-2.
class ChainAllReduce final : public Chain {
 public:
  void start(Op& op) override {
    begin(op);
    const int P = op.process_count(), mi = op.my_index();
    const uint64_t N = op.call().count;
    const uint8_t* S = op.all_reduce_input();
    uint8_t* out = static_cast<uint8_t*>(op.call().out[0]);
    chain_reduce(op, 0, S, 0, N, out, Phase::kChainAllReduceResult);
    if (mi + 1 < P) chain_relay(op, Phase::kChainAllReduceResult, 0, out, N, mi + 2 < P);
    op.record_plan(PlanKind::kBalance, {}, {});
    op.copy_out_to_other_locals(N);
  }
};

// Reduce-scatter: each rank's shard is folded along the ring; the last process keeps the
// shards it owns and sends the others on around the ring, each as far as its owner.
class ChainReduceScatter final : public Chain {
 public:
  void start(Op& op) override {
    begin(op);
    const ProcessCall& c = op.call();
    const int P = op.process_count(), mi = op.my_index(), n = op.ranks();
    const uint64_t shard = c.count / static_cast<uint64_t>(n);
    const uint8_t* S = op.local_sum(c.count, false);
    for (int r = 0; r < n; r++) {
      const int owner = op.process_of(r);
      const int oi = op.index_of(owner);
      uint8_t* own = owner == op.me() ? static_cast<uint8_t*>(c.out[static_cast<size_t>(op.local_index(r))]) : nullptr;
      const uint64_t off = shard * static_cast<uint64_t>(r);
      if (oi == P - 1) {
        chain_reduce(op, static_cast<uint64_t>(r), S, off, shard, own, std::nullopt);
        continue;
      }
      chain_reduce(op, static_cast<uint64_t>(r), S, off, shard, nullptr, Phase::kChainShard);
      if (mi <= oi) chain_relay(op, Phase::kChainShard, static_cast<uint64_t>(r), own, shard, mi < oi);
    }
  }
};

// All-gather: each block goes around the ring from its process, and stops before it again.
class ChainAllGather final : public Chain {
 public:
  void start(Op& op) override {
    begin(op);
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    const uint64_t N = c.count, bytes = N * op.esize();
    for (size_t i = 0; i < c.my_ranks.size(); i++) {
      const int r = c.my_ranks[i];
      op.add_final_copy(op.at(c.out[0], N * static_cast<uint64_t>(r)), c.in[i], bytes);
      chain_send(op, Phase::kChainGather, static_cast<uint64_t>(r), static_cast<const uint8_t*>(c.in[i]), N);
    }
    for (int r = 0; r < n; r++)
      if (op.process_of(r) != op.me())
        chain_relay(op, Phase::kChainGather, static_cast<uint64_t>(r), op.at(c.out[0], N * static_cast<uint64_t>(r)), N,
                    op.ring_next() != op.process_of(r));
    // out[0] is complete only after the local copies: order them before the fan-out.
    op.copy_out_to_other_locals(N * static_cast<uint64_t>(n));
  }
};

// Broadcast: along the ring from the root; the process before the root is the last.
class ChainBroadcast final : public Chain {
 public:
  void start(Op& op) override {
    begin(op);
    const ProcessCall& c = op.call();
    const uint64_t N = c.count, bytes = N * op.esize();
    const int root_proc = op.process_of(c.root);
    if (root_proc == op.me()) {
      const void* src = c.in[static_cast<size_t>(op.local_index(c.root))];
      chain_send(op, Phase::kChainBroadcast, 0, static_cast<const uint8_t*>(src), N);
      for (size_t i = 0; i < c.out.size(); i++)
        if (c.out[i] != src) op.add_final_copy(c.out[i], src, bytes);
    } else {
      chain_relay(op, Phase::kChainBroadcast, 0, static_cast<uint8_t*>(c.out[0]), N, op.ring_next() != root_proc);
      op.copy_out_to_other_locals(N);
    }
  }
};

}  // namespace

std::unique_ptr<Algorithm> chain_algorithm(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return std::make_unique<ChainAllReduce>();
    case Kind::kReduceScatter: return std::make_unique<ChainReduceScatter>();
    case Kind::kAllGather: return std::make_unique<ChainAllGather>();
    case Kind::kBroadcast: return std::make_unique<ChainBroadcast>();
    default: runs_no("the chain", kind);
  }
}

}  // namespace r2ccl::coll
