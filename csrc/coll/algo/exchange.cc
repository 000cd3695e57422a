// The exchanges: all-to-all and permute (jax.lax.ppermute) move fixed blocks between fixed
// pairs of ranks, straight from the sender's input into the receiver's output; a block between
// two ranks of one process is a copy.
#include "coll/op.h"

namespace r2ccl::coll {

namespace {

// All-to-all: block j of rank r's input becomes block r of rank j's output.
class AllToAll final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    const uint64_t chunk = c.count / static_cast<uint64_t>(n), bytes = chunk * op.esize();
    for (size_t i = 0; i < c.my_ranks.size(); i++) {
      const int r = c.my_ranks[i];
      for (int j = 0; j < n; j++) {
        const uint8_t* src = op.at(c.in[i], chunk * static_cast<uint64_t>(j));
        if (op.process_of(j) == op.me())
          op.add_final_copy(op.at(c.out[static_cast<size_t>(op.local_index(j))], chunk * static_cast<uint64_t>(r)), src,
                            bytes);
        else
          op.send(op.process_of(j), op.tag(Phase::kAllToAll, static_cast<uint64_t>(r), static_cast<uint64_t>(j)), src,
                  bytes);
      }
    }
    for (int r = 0; r < n; r++) {
      if (op.process_of(r) == op.me()) continue;
      for (size_t i = 0; i < c.my_ranks.size(); i++) {
        const int j = c.my_ranks[i];
        op.recv(op.process_of(r), op.tag(Phase::kAllToAll, static_cast<uint64_t>(r), static_cast<uint64_t>(j)),
                op.at(c.out[i], chunk * static_cast<uint64_t>(r)), bytes);
      }
    }
  }
};

// Permute: rank r's input goes to rank perm[r]: a copy when that rank is ours, else one
// message; a rank no one sends to gets zeros.
class Permute final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    const uint64_t bytes = c.count * op.esize();
    std::vector<int> source(static_cast<size_t>(n), -1);
    for (int r = 0; r < n; r++)
      if (c.perm[static_cast<size_t>(r)] >= 0) source[static_cast<size_t>(c.perm[static_cast<size_t>(r)])] = r;
    for (size_t i = 0; i < c.my_ranks.size(); i++) {
      const int r = c.my_ranks[i], d = c.perm[static_cast<size_t>(r)];
      if (d < 0) continue;
      if (op.process_of(d) == op.me())
        op.add_final_copy(c.out[static_cast<size_t>(op.local_index(d))], c.in[i], bytes);
      else
        op.send(op.process_of(d), op.tag(Phase::kPermute, static_cast<uint64_t>(r), static_cast<uint64_t>(d)), c.in[i],
                bytes);
    }
    for (size_t i = 0; i < c.my_ranks.size(); i++) {
      const int r = c.my_ranks[i], s = source[static_cast<size_t>(r)];
      if (s < 0)
        op.add_final_copy(c.out[i], nullptr, bytes);
      else if (op.process_of(s) != op.me())
        op.recv(op.process_of(s), op.tag(Phase::kPermute, static_cast<uint64_t>(s), static_cast<uint64_t>(r)), c.out[i],
                bytes);
    }
  }
};

}  // namespace

std::unique_ptr<Algorithm> exchange_algorithm(Kind kind) {
  switch (kind) {
    case Kind::kAllToAll: return std::make_unique<AllToAll>();
    case Kind::kPermute: return std::make_unique<Permute>();
    default: runs_no("the exchange", kind);
  }
}

}  // namespace r2ccl::coll
