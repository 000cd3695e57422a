// One process's part of one collective, as a non-blocking state machine the executor steps
// whenever one of its messages finishes: the messages it posted, the pieces it folds in
// canonical order as contributions arrive (and the sends that follow a fold), the copies that
// end it, the signature exchange that catches a disagreement, the probe that catches peers in
// another program, failures and the deadline. Which messages a call posts is its algorithm's
// business (coll/algorithm.h); what an algorithm may use of the op is the second half below.
// Knows nothing of sockets, rails or JAX.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coll/algorithm.h"
#include "coll/collectives.h"
#include "coll/signature.h"

namespace r2ccl::coll {

// Whether [a, a+an) and [b, b+bn) share a byte (empty ranges share none).
bool buffers_overlap(const void* a, uint64_t an, const void* b, uint64_t bn);

class Op {
 public:
  Op(Executor* ex, Endpoint& ep, ProcessCall c, int my_process, const CollectiveOptions& opt);
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // ---- The executor's side (collectives.h's threads).
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }
  // Posts what can be posted; returns true when the op already finished.
  bool start();
  // The executor's step: also looks for a peer that is evidently in another collective.
  bool step_locked();
  // Called on the engine thread when one of this op's messages finished. A small all-reduce
  // whose messages all arrived intact completes right here (a small fold, then handing the
  // result over): one thread hop less on the latency path. Everything else, failures
  // included (they cancel requests, which must not happen on the engine thread), goes to
  // the executor. Returns false when the executor must take it.
  bool try_complete_inline();
  // A small all-reduce normally completes on the engine thread; the executor holds it only
  // for its deadline, and is woken for it only when the engine thread handed it over.
  bool completes_inline() const { return inline_ok_; }
  bool wants_executor() const { return wants_executor_.load(); }
  int64_t deadline_ns() const { return deadline_ns_; }
  // Any thread; serialised with the engine thread's inline completion, so an op finishes once.
  void abort(const Error& e);
  // The executor closed with this op unfinished: it fails with kClosed, naming itself.
  void abort_closed();

  // ---- What an algorithm uses (coll/algo/*.cc), on the thread that steps the op.
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

  const ProcessCall& call() const { return c_; }
  int me() const { return me_; }                             // this process
  const std::vector<int>& procs() const { return procs_; }   // the group's processes, canonical order
  int my_index() const { return mi_; }                       // this process's place in procs()
  int process_count() const { return static_cast<int>(procs_.size()); }
  int ranks() const { return static_cast<int>(c_.process_of_rank.size()); }
  int process_of(int rank) const { return c_.process_of_rank[static_cast<size_t>(rank)]; }
  int index_of(int process) const;                           // its place in procs()
  int local_index(int rank) const;                           // its place in call().my_ranks
  size_t esize() const { return esize_; }
  uint64_t piece_elems() const;                              // the pipelining unit, in elements
  uint64_t small_bytes() const { return opt_.small_bytes; }   // at or below: the one-step all-reduce
  PlanKind plan_kind() const { return plan_kind_; }          // the call's plan (kAuto: by the model)
  int group_size() const { return group_; }                  // two_level's groups (plan.h: two_level_group)
  std::string describe() const;                              // for errors: the kind, what, size, process
  // The process `d` places after this one in canonical order (wrapping), as an index of procs().
  int ring_index(int d) const;
  int ring_next() const { return procs_[static_cast<size_t>(ring_index(1))]; }
  int ring_prev() const { return procs_[static_cast<size_t>(ring_index(-1))]; }

  // A message's tag: the call's tag mixed with the message's phase and place in it.
  uint64_t tag(Phase phase, uint64_t a = 0, uint64_t b = 0, uint64_t piece = 0) const;
  // Posts a message; returns its index (its request is the op's until the op finishes).
  int send(int peer, uint64_t tag, const void* p, uint64_t bytes);
  int recv(int peer, uint64_t tag, void* p, uint64_t bytes);
  // Whether message `i` arrived intact (finished and not failed).
  bool arrived(int i) const;
  // Scratch that lives as long as the op (coll/scratch.h: registered from 64 KiB up).
  uint8_t* temp(uint64_t bytes);
  uint8_t* at(const void* base, uint64_t elems) const {
    return static_cast<uint8_t*>(const_cast<void*>(base)) + elems * esize_;
  }
  // Returns the piece's index (piece_done).
  int add_piece(Piece p) {
    pieces_.push_back(std::move(p));
    return static_cast<int>(pieces_.size()) - 1;
  }
  bool piece_done(int i) const { return pieces_[static_cast<size_t>(i)].done; }
  // Copies (or zeroes, src null) that run once every message arrived and every piece folded,
  // in the order added.
  void add_final_copy(void* dst, const void* src, uint64_t bytes) { final_copies_.push_back({dst, src, bytes}); }
  void copy_out_to_other_locals(uint64_t out_elems);

  // The local pre-reduction S = x_l0 (op) x_l1 ... over this process's ranks, in rank order
  // (in[0] when there is one rank, or the devices pre-folded, and no copy is needed).
  const uint8_t* local_sum(uint64_t elems, bool must_copy);
  // An all-reduce's S: a copy where an input aliases an output (the results land in out[0]).
  const uint8_t* all_reduce_input();
  // Pieces that reduce elements [off, off+n) of every process's S at the process of index
  // `owner_idx` into dest, in pieces of piece_elems() tagged (reduce, seg_id, piece); with
  // a `result` phase, the owner then sends each folded piece to every other process (tagged
  // (result, seg_id, piece)) and they receive it into dest.
  void reduce_segment(Phase reduce, std::optional<Phase> result, uint64_t seg_id, int owner_idx, const uint8_t* S,
                      uint64_t off, uint64_t n, void* dest);
  // This call's signatures to and from neighbours() (with the capacity when planned).
  void exchange_signatures(bool with_capacity);
  // A signature received in front of a message's data (the one-step all-reduce): compared
  // like any other signature once message `msg` arrived.
  void expect_signature(int msg, int peer_process, const uint8_t* where);
  const Sig& my_signature() const { return my_sig_; }
  // Whether every signature (and capacity) from the neighbours arrived.
  bool signatures_here() const;
  // Each neighbour's capacity, per index of procs() (0 where none came; this process's own).
  std::vector<double> capacities() const;
  double my_capacity() const { return my_capacity_; }
  // Reads this process's capacity for a planned all-reduce (the executor's source, once).
  void read_capacity();
  // The chain and doubling have only their neighbours' signatures: listen for the abort
  // notices a failing neighbour passes on (see op.cc).
  void listen();
  // The small all-reduce completes on the engine thread when its messages all arrived.
  void complete_inline() { inline_ok_ = true; }
  // The plan this call ran (Executor::last_plan): shares and capacities per process of
  // `processes` (empty: the whole group; two_level records its own group).
  void record_plan(PlanKind kind, std::vector<double> shares, std::vector<double> caps,
                   std::vector<int> processes = {});
  // Fails the op (e non-null) or finishes it; returns true.
  bool finish(const Error* e);
  bool fail(Cause cause, int peer_process, const std::string& why);

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
  struct SigMsg {
    int msg;                 // message index
    int peer_process;
    const uint8_t* where;    // the peer's signature once the message arrived
  };
  struct Notice {
    std::shared_ptr<Request> msg_req;   // a listening receive (not in msgs_)
    int peer_process;
    const uint8_t* where;
  };

  bool step();
  bool failed_message();
  bool better_account(int failed_peer);
  bool awaiting_account();
  int64_t mismatch_grace_ns() const;
  bool fold(Piece& p);
  Sig signature() const;
  std::vector<int> neighbours() const { return algorithm_->neighbours(*this); }
  bool diverged();
  bool awaits_signature(int peer) const;
  bool foreign_announcement(int peer, Sig* out);
  bool same_instance_disagrees(int peer, Sig* out);
  Error disagreement(int peer, const Sig& other) const;
  Error divergence(int peer, const Sig& other, int64_t now) const;
  bool signatures_agree();
  bool notice_arrived();
  static std::string notice_text(const uint8_t* where);
  Error notice_error(int told_by, const uint8_t* where) const;
  void stop_listening(const Error* e);
  Error timed_out() const;

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
  std::unique_ptr<Algorithm> algorithm_;
  int group_ = 1;                       // two_level: processes per group (in the signature)
  double my_capacity_ = 1.0;
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
  std::vector<SigMsg> sig_msgs_;
  std::vector<Notice> notices_;   // the abort listeners (listen)
  int notice_from_ = -1;          // the neighbour whose abort notice failed this op
  std::string notice_text_;       // and its account, passed on as it came
  std::set<int> sig_sends_;       // message indices of this process's signature sends
  int64_t started_ns_ = 0;        // diverged(): when this op started, and its last look at staging
  int64_t next_probe_ns_ = 0;
  bool suspect_ = false;
  int64_t told_mismatch_ns_ = 0;   // when a peer first said it abandoned the call (awaiting_account)
};

}  // namespace r2ccl::coll
