// Doubling all-reduce (recursive doubling after Bruck; AlgoKind::kDoubling, the small
// all-reduce past R2CCL_MAX_PEERS): slot j of a P-slot buffer holds the local sum of the
// process j places after this one on the ring. In round r (d = 2^r) this process sends slots
// [0, min(d, P-d)) to the process d before it, once they are here, and receives as many into
// slots [d, ...) from the process d after it. Then every S_q is here, folded in canonical
// order. ceil(log2 P) rounds and 2 ceil(log2 P) peers; every process holds every S_q, so it
// runs only while P x the vector is small (plan.h, kDoublingMaxBytes).
#include <algorithm>
#include <cstring>

#include "coll/op.h"

namespace r2ccl::coll {

namespace {

class DoublingAllReduce final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    op.listen();
    const int P = op.process_count(), mi = op.my_index();
    const uint64_t N = op.call().count, bytes = N * op.esize();
    const uint8_t* S = op.all_reduce_input();
    slots_ = op.temp(static_cast<uint64_t>(P) * bytes);
    if (bytes) std::memcpy(slots_, S, bytes);
    slot_msg_.assign(static_cast<size_t>(P), -1);
    for (int d = 1, r = 0; d < P; d <<= 1, r++) {
      const int cnt = std::min(d, P - d);
      const int m = op.recv(op.procs()[static_cast<size_t>(op.ring_index(d))], op.tag(Phase::kDoubling, static_cast<uint64_t>(r)),
                            slots_ + static_cast<uint64_t>(d) * bytes, static_cast<uint64_t>(cnt) * bytes);
      for (int j = d; j < d + cnt; j++) slot_msg_[static_cast<size_t>(j)] = m;
      rounds_.push_back({d, cnt, false});
    }
    Op::Piece pc;
    pc.elems = N;
    pc.dest = op.call().out[0];
    pc.acc = static_cast<uint8_t*>(op.call().out[0]);   // never a source: the slots are this op's own
    for (int qi = 0; qi < P; qi++) {
      const int j = ((qi - mi) % P + P) % P;
      pc.src.push_back(slots_ + static_cast<uint64_t>(j) * bytes);
      pc.msg.push_back(slot_msg_[static_cast<size_t>(j)]);
    }
    op.add_piece(std::move(pc));
    op.record_plan(PlanKind::kBalance, {}, {});
    op.copy_out_to_other_locals(N);
  }

  // A round goes out once the slots it sends are here (only those that arrived intact).
  bool advance(Op& op) override {
    const uint64_t bytes = op.call().count * op.esize();
    for (size_t r = 0; r < rounds_.size(); r++) {
      Round& rd = rounds_[r];
      if (rd.sent) continue;
      bool ready = true;
      for (int j = 1; j < rd.cnt && ready; j++) {
        const int m = slot_msg_[static_cast<size_t>(j)];
        ready = m < 0 || op.arrived(m);
      }
      if (!ready) continue;
      rd.sent = true;
      op.send(op.procs()[static_cast<size_t>(op.ring_index(-rd.d))], op.tag(Phase::kDoubling, r), slots_,
              static_cast<uint64_t>(rd.cnt) * bytes);
    }
    return false;
  }

  bool pending() const override {
    return std::any_of(rounds_.begin(), rounds_.end(), [](const Round& r) { return !r.sent; });
  }

  std::vector<int> neighbours(const Op& op) const override {
    std::vector<int> out;
    for (int qi : doubling_partners(op.my_index(), op.process_count())) out.push_back(op.procs()[static_cast<size_t>(qi)]);
    return out;
  }

 private:
  struct Round {
    int d, cnt;
    bool sent;
  };
  std::vector<Round> rounds_;
  uint8_t* slots_ = nullptr;     // every process's local sum, by ring distance
  std::vector<int> slot_msg_;    // the receive that fills each slot (-1: local)
};

}  // namespace

std::unique_ptr<Algorithm> doubling_algorithm(Kind kind) {
  if (kind != Kind::kAllReduce)
    runs_no("doubling", kind);
  return std::make_unique<DoublingAllReduce>();
}

}  // namespace r2ccl::coll
