// ragged_all_to_all (jax.lax.ragged_all_to_all). Each local rank's slices go out at once;
// where they land is the receiver's business, and it learns that from one metadata message
// per (sender rank, receiver rank): the sender's output offsets, send sizes and receive sizes
// for that pair, and whether its own slices were valid (with why not). Once every metadata
// message and signature is here, each process checks the pairs both ways (what a sends b
// equals what b expects from a), the placements and that no two slices overlap in an output,
// then posts each slice's receive straight into the output at its offset. A bad slice
// anywhere fails every process.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "coll/op.h"

namespace r2ccl::coll {

namespace {

// The metadata's words, little-endian on the wire.
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

class Ragged final : public Algorithm {
 public:
  void start(Op& op) override {
    op.exchange_signatures(false);
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    spr_ = c.ragged.front().send.size() / static_cast<size_t>(n);
    const uint64_t row = c.row_elems * op.esize(), mlen = meta_bytes();
    for (size_t i = 0; i < c.in.size(); i++)
      for (size_t j = 0; j < c.out.size(); j++)
        if (buffers_overlap(c.in[i], c.count * op.esize(), c.out[j], c.out_count * op.esize()))
          throw Error(Cause::kInvalidArgument, -1, op.describe() + ": an input shares memory with an output");
    for (size_t i = 0; i < c.my_ranks.size(); i++) {
      const int r = c.my_ranks[i];
      const RaggedSlices& sl = c.ragged[i];
      why_.push_back(problem(c, i));
      const std::string& why = why_.back();
      for (int d = 0; d < n; d++) {
        const int q = op.process_of(d);
        if (q == op.me()) continue;
        uint8_t* m = op.temp(mlen);
        std::memset(m, 0, mlen);
        put64(m, kRaggedMagic);
        put64(m + 8, why.empty() ? 0 : 1);
        put64(m + 16, c.out_count);
        put64(m + 24, c.row_elems);
        for (size_t t = 0; t < spr_; t++) {
          const size_t k = static_cast<size_t>(d) * spr_ + t;
          put64(m + 32 + 24 * t, static_cast<uint64_t>(sl.out_off[k]));
          put64(m + 40 + 24 * t, static_cast<uint64_t>(sl.send[k]));
          put64(m + 48 + 24 * t, static_cast<uint64_t>(sl.recv[k]));
        }
        std::memcpy(m + mlen - kRaggedWhyBytes, why.data(), std::min<size_t>(why.size(), kRaggedWhyBytes - 1));
        op.send(q, op.tag(Phase::kRaggedMeta, static_cast<uint64_t>(r), static_cast<uint64_t>(d)), m, mlen);
        uint8_t* got = op.temp(mlen);
        meta_.push_back(
            {op.recv(q, op.tag(Phase::kRaggedMeta, static_cast<uint64_t>(d), static_cast<uint64_t>(r)), got, mlen), d, i, got});
        if (!why.empty()) continue;   // nothing of a bad rank's moves
        for (size_t t = 0; t < spr_; t++) {
          const size_t k = static_cast<size_t>(d) * spr_ + t;
          if (sl.send[k] > 0)
            op.send(q, op.tag(Phase::kRaggedRows, static_cast<uint64_t>(r), static_cast<uint64_t>(d), t),
                    op.at(c.in[i], static_cast<uint64_t>(sl.in_off[k]) * c.row_elems),
                    static_cast<uint64_t>(sl.send[k]) * row);
        }
      }
    }
    pending_ = true;
  }

  // Returns true when the op finished (with an error); false while metadata is on its way or
  // once the slices' receives are posted.
  bool advance(Op& op) override {
    if (!pending_ || !op.signatures_here()) return false;
    for (const Meta& rm : meta_)
      if (!op.arrived(rm.msg)) return false;
    pending_ = false;
    const ProcessCall& c = op.call();
    const int n = op.ranks();
    const auto out_rows = static_cast<int64_t>(c.out_count / c.row_elems);
    const uint64_t row = c.row_elems * op.esize(), mlen = meta_bytes();
    auto fail = [&](Cause cause, int peer_rank, const std::string& why) {
      return op.fail(cause, peer_rank < 0 ? -1 : op.process_of(peer_rank), why);
    };
    // A rank whose own slices are wrong: every process names it and its reason.
    for (size_t i = 0; i < why_.size(); i++)
      if (!why_[i].empty())
        return fail(Cause::kInvalidArgument, -1, "rank " + std::to_string(c.my_ranks[i]) + ": " + why_[i]);
    for (const Meta& rm : meta_) {
      const uint8_t* m = rm.where;
      if (get64(m) != kRaggedMagic || get64(m + 16) != c.out_count || get64(m + 24) != c.row_elems)
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
    std::map<std::pair<int, size_t>, const Meta*> meta_of;   // (sender rank, local receiver)
    for (const Meta& x : meta_) meta_of[{x.from, x.local}] = &x;
    for (size_t bi = 0; bi < c.my_ranks.size(); bi++) {
      const int b = c.my_ranks[bi];
      const RaggedSlices& mine = c.ragged[bi];
      std::vector<Land> lands;
      for (int a = 0; a < n; a++) {
        const bool local = op.process_of(a) == op.me();
        const Meta* rm = local ? nullptr : meta_of.at({a, bi});
        const size_t ai = local ? static_cast<size_t>(op.local_index(a)) : 0;
        for (size_t t = 0; t < spr_; t++) {
          const size_t k = static_cast<size_t>(b) * spr_ + t, j = static_cast<size_t>(a) * spr_ + t;
          int64_t off, rows;
          if (local) {
            off = c.ragged[ai].out_off[k];
            rows = c.ragged[ai].send[k];
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
                             local ? op.at(c.in[ai], static_cast<uint64_t>(c.ragged[ai].in_off[k]) * c.row_elems)
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
        uint8_t* dst = op.at(c.out[bi], static_cast<uint64_t>(l.off) * c.row_elems);
        const uint64_t bytes = static_cast<uint64_t>(l.rows) * row;
        if (l.src)
          op.add_final_copy(dst, l.src, bytes);
        else
          op.recv(op.process_of(l.from),
                  op.tag(Phase::kRaggedRows, static_cast<uint64_t>(l.from), static_cast<uint64_t>(b), l.t), dst, bytes);
      }
    }
    return false;
  }

  bool pending() const override { return pending_; }

 private:
  uint64_t meta_bytes() const { return 8 * (4 + 3 * spr_) + kRaggedWhyBytes; }

  // Why local rank i's own slices are invalid (empty: they are valid).
  static std::string problem(const ProcessCall& c, size_t i) {
    const RaggedSlices& r = c.ragged[i];
    const auto in_rows = static_cast<int64_t>(c.count / c.row_elems);
    const auto out_rows = static_cast<int64_t>(c.out_count / c.row_elems);
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

  struct Meta {
    int msg;
    int from;                // the sending rank
    size_t local;            // index into my_ranks of the receiving rank
    const uint8_t* where;
  };
  size_t spr_ = 0;                  // slices per peer
  std::vector<std::string> why_;    // each local rank's account of its own bad slices (empty: valid)
  std::vector<Meta> meta_;          // the metadata messages from remote ranks
  bool pending_ = false;            // the receives wait for them
};

}  // namespace

std::unique_ptr<Algorithm> ragged_algorithm(Kind kind) {
  if (kind != Kind::kRaggedAllToAll)
    runs_no("the ragged exchange", kind);
  return std::make_unique<Ragged>();
}

}  // namespace r2ccl::coll
