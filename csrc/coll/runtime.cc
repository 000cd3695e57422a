// Rendezvous of local ranks and dispatch of process-level calls (see runtime.h).
#include "coll/runtime.h"

#include <algorithm>

#include "base/log.h"

#include <chrono>
#include <utility>

namespace r2ccl::coll {

namespace {
std::mutex g_mu;
std::shared_ptr<Runtime> g_runtime;
constexpr size_t kRunsRemembered = 256;

uint64_t hash_combine(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 29);
}
uint64_t next_serial() {
  static std::atomic<uint64_t> n{0};
  return ++n;
}
}  // namespace

bool Runtime::register_memory(const void* p, size_t bytes) {
  try {
    ep_->register_memory(p, bytes);   // held until the endpoint is destroyed
    return true;
  } catch (const Error& e) {
    R2_WARN("staging memory (%zu bytes) stays unregistered, so it moves by copies: %s", bytes, e.what());
    return false;
  }
}

std::shared_ptr<Runtime> Runtime::current() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_runtime;
}

void Runtime::install(std::shared_ptr<Runtime> rt) {
  std::shared_ptr<Runtime> old;   // released outside the lock: its destructor joins a thread
  {
    std::lock_guard<std::mutex> g(g_mu);
    old = std::exchange(g_runtime, std::move(rt));
  }
}

void Runtime::uninstall(const Runtime* rt) {
  std::shared_ptr<Runtime> old;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_runtime.get() == rt) old = std::move(g_runtime);
  }
}

Runtime::Runtime(std::shared_ptr<Endpoint> ep, std::shared_ptr<Executor> ex, int my_process, double timeout_s)
    : ep_(std::move(ep)), ex_(std::move(ex)), serial_(next_serial()), my_process_(my_process), timeout_s_(timeout_s) {
  if (!ep_ || !ex_) throw Error(Cause::kInvalidArgument, -1, "the collective runtime needs an endpoint and an executor");
  watch_ = std::thread([this] { watchdog(); });
}

Runtime::~Runtime() { close(); }

void Runtime::close() {
  std::map<Key, Pending> waiting;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return;
    closed_ = true;
    stop_ = true;
    waiting = std::move(pending_);
    pending_.clear();
  }
  watch_cv_.notify_all();
  if (watch_.joinable() && watch_.get_id() != std::this_thread::get_id()) watch_.join();
  // Local ranks that arrived and wait for the others would otherwise wait for good.
  const Error e(Cause::kClosed, -1, "jax_r2ccl was shut down while this collective waited for the process's "
                                    "other local ranks");
  for (auto& [key, p] : waiting)
    for (auto& c : p.calls)
      if (c.done) c.done(&e);
}

Runtime::CallToken Runtime::enter_call() {
  calls_.enter();
  // The token's deleter holds the runtime: whichever thread drops the last copy ends the call.
  std::shared_ptr<Runtime> self = shared_from_this();
  return CallToken(static_cast<void*>(this), [self](void*) { self->calls_.leave(); });
}

size_t Runtime::drain(double timeout_s) { return calls_.drain(timeout_s); }

size_t Runtime::calls_in_progress() const { return calls_.count(); }

void Runtime::watchdog() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto limit = static_cast<int64_t>(timeout_s_ * 1e9);
  while (!stop_) {
    watch_cv_.wait_for(lk, std::chrono::milliseconds(100));
    const int64_t now = now_ns();
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      if (!p.failed && now - p.since_ns > limit) {
        const DeviceCall& a = p.calls.front();
        poison_locked(it->first, p, Error(Cause::kTimeout, -1,
                                          std::to_string(p.arrived) + " of this process's local ranks made " +
                                              kind_name(a.kind) + " op " + std::to_string(a.op_id) +
                                              " and the others did not within R2CCL_TIMEOUT (" +
                                              std::to_string(timeout_s_) + " s): their launch failed or never came"));
      }
      // A poisoned call whose remaining local ranks never come is forgotten after a while.
      if (p.failed && now - p.since_ns > 10 * limit)
        it = pending_.erase(it);
      else
        ++it;
    }
  }
}

Runtime::Slot Runtime::arrive_locked(const DeviceCall& call) {
  const Comm& comm = comms_.find(call.comm_id)->second;
  const std::vector<int>& members = comm.groups[static_cast<size_t>(call.group)];
  // k: how many times this rank already ran this op in this run (loops run an op repeatedly).
  if (!counts_.count(call.run_id)) {
    run_order_.push_back(call.run_id);
    if (run_order_.size() > kRunsRemembered) {
      counts_.erase(run_order_.front());
      run_order_.erase(run_order_.begin());
    }
  }
  uint64_t k = counts_[call.run_id][{call.comm_id, call.group, call.rank, call.op_id}]++;
  Key key{call.comm_id, call.group, call.run_id, call.op_id, k};
  Pending& p = pending_[key];
  if (p.arrived == 0) p.since_ns = now_ns();
  p.arrived++;
  return {&p, k, static_cast<size_t>(std::count(members.begin(), members.end(), my_process_))};
}

uint64_t Runtime::process_tag(const Key& key) {
  const auto& [comm_id, group, run_id, op_id, k] = key;
  return hash_combine(hash_combine(hash_combine(hash_combine(hash_combine(0x52324343, comm_id),
                                                             static_cast<uint64_t>(group)),
                                                run_id),
                                   op_id),
                      k);
}

void Runtime::poison_locked(const Key& key, Pending& p, const Error& e) {
  // This process will not run that collective: a peer's announcement of it is late news,
  // not another program (else the next collective here would blame the peer for a mismatch).
  ex_->skipped(process_tag(key));
  p.failed = e;
  std::vector<DeviceCall> waiting = std::move(p.calls);
  p.calls.clear();
  for (auto& c : waiting)
    if (c.done) c.done(&e);
}

void Runtime::abandon(const DeviceCall& call, const Error& why) {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  if (closed_) return;
  if (!check_locked(call, &n).empty()) return;   // a call that could never be made: nothing to match
  Slot s = arrive_locked(call);
  Key key{call.comm_id, call.group, call.run_id, call.op_id, s.k};
  if (!s.p->failed)
    poison_locked(key, *s.p,
                  Error(why.cause(), why.peer(),
                        "local rank " + std::to_string(call.rank) + " could not take part: " + why.what()));
  if (s.p->arrived >= s.local) pending_.erase(key);
}

void Runtime::register_comm(uint64_t comm_id, std::vector<std::vector<int>> groups, std::string name,
                            std::vector<int> perm) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = comms_.find(comm_id);
  if (it != comms_.end()) {
    if (it->second.groups != groups || it->second.perm != perm)
      throw Error(Cause::kInvalidArgument, -1, "communicator id " + std::to_string(comm_id) + " (" + name +
                                                   ") was registered before with another layout");
    return;
  }
  comms_[comm_id] = Comm{std::move(groups), std::move(name), std::move(perm)};
}

const Config& Runtime::config() const { return ep_->config(); }

std::string Runtime::check_locked(const DeviceCall& call, size_t* n_ranks) const {
  auto ci = comms_.find(call.comm_id);
  if (ci == comms_.end())
    return "collective on an unknown communicator (was jax_r2ccl.initialize() called in this process before the "
           "program was compiled?)";
  const Comm& comm = ci->second;
  if (call.group < 0 || call.group >= static_cast<int64_t>(comm.groups.size()))
    return "group " + std::to_string(call.group) + " does not exist in " + comm.name;
  const std::vector<int>& members = comm.groups[static_cast<size_t>(call.group)];
  if (call.rank < 0 || call.rank >= static_cast<int64_t>(members.size()) ||
      members[static_cast<size_t>(call.rank)] != my_process_)
    return "rank " + std::to_string(call.rank) + " of group " + std::to_string(call.group) + " of " + comm.name +
           " does not live in process " + std::to_string(my_process_);
  const uint64_t n = members.size();
  if ((call.kind == Kind::kPermute) != !comm.perm.empty())
    return call.kind == Kind::kPermute ? "permute on " + comm.name + ", which has no permutation"
                                       : std::string(kind_name(call.kind)) + " on " + comm.name + ", a permute's communicator";
  if ((call.kind == Kind::kReduceScatter || call.kind == Kind::kAllToAll) && call.count % n != 0)
    return std::string(kind_name(call.kind)) + " needs an input size divisible by the group size (" +
           std::to_string(call.count) + " elements over " + std::to_string(n) + " ranks)";
  if (call.kind == Kind::kRaggedAllToAll) {   // (the slices' values are checked in the collective)
    const size_t K = call.ragged.send.size();
    if (call.row_elems == 0 || call.count % call.row_elems || call.out_count % call.row_elems)
      return "ragged_all_to_all needs whole rows of " + std::to_string(call.row_elems) + " elements";
    if (K == 0 || K % n || call.ragged.in_off.size() != K || call.ragged.out_off.size() != K ||
        call.ragged.recv.size() != K)
      return "ragged_all_to_all needs offsets and sizes of one length, a multiple of the group size " +
             std::to_string(n) + " (got " + std::to_string(K) + ")";
    *n_ranks = members.size();
    return {};
  }
  // The result buffer must hold exactly what the collective writes: checked before anything
  // is handed on, so a wrong buffer fails the call instead of being overrun.
  const uint64_t expect = output_count(call.kind, call.count, static_cast<int>(n));
  if (call.out_count != expect)
    return std::string(kind_name(call.kind)) + " of " + std::to_string(call.count) + " elements over " +
           std::to_string(n) + " ranks writes " + std::to_string(expect) +
           " elements, but the result buffer holds " + std::to_string(call.out_count);
  *n_ranks = members.size();
  return {};
}

std::string Runtime::check(const DeviceCall& call, int* n_ranks) const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  std::string bad = check_locked(call, &n);
  *n_ranks = static_cast<int>(n);
  return bad;
}

std::vector<int> Runtime::local_ranks(const DeviceCall& call) const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  std::vector<int> out;
  if (!check_locked(call, &n).empty()) return out;
  const auto& members = comms_.find(call.comm_id)->second.groups[static_cast<size_t>(call.group)];
  for (size_t r = 0; r < members.size(); r++)
    if (members[r] == my_process_) out.push_back(static_cast<int>(r));
  return out;
}

bool Runtime::device_call(DeviceCall call) {
  auto fail = [&](Cause c, const std::string& why) {
    Error e(c, -1, why);
    if (call.done) call.done(&e);
    return true;
  };
  bool alone = false;
  ProcessCall pc;
  std::vector<DeviceCall> ready;
  {
    std::lock_guard<std::mutex> g(mu_);
    size_t n_ranks_unused = 0;
    if (closed_) return fail(Cause::kClosed, "jax_r2ccl was shut down (jax_r2ccl.shutdown()) before this collective ran");
    std::string bad = check_locked(call, &n_ranks_unused);
    if (!bad.empty()) return fail(Cause::kInvalidArgument, bad);
    const Comm& comm = comms_.find(call.comm_id)->second;
    const std::vector<int>& members = comm.groups[static_cast<size_t>(call.group)];
    Slot slot = arrive_locked(call);
    const uint64_t k = slot.k;
    Key key{call.comm_id, call.group, call.run_id, call.op_id, k};
    Pending& p = *slot.p;
    if (p.failed) {   // a local rank already failed this call: so does every other
      Error e = *p.failed;
      if (p.arrived >= slot.local) pending_.erase(key);
      if (call.done) call.done(&e);
      return true;
    }
    if (!p.calls.empty()) {
      const DeviceCall& a = p.calls.front();
      if (a.kind != call.kind || a.dtype != call.dtype || a.op != call.op || a.count != call.count ||
          a.root != call.root || a.prefolded != call.prefolded || a.out_count != call.out_count ||
          a.row_elems != call.row_elems || a.ragged.send.size() != call.ragged.send.size()) {
        std::string why = std::string("local ranks disagree about a collective: rank ") + std::to_string(a.rank) +
                          " called " + kind_name(a.kind) + " of " + std::to_string(a.count) + " " +
                          dtype_name(a.dtype) + ", rank " + std::to_string(call.rank) + " called " +
                          kind_name(call.kind) + " of " + std::to_string(call.count) + " " + dtype_name(call.dtype);
        Error e(Cause::kMismatch, -1, why);
        poison_locked(key, p, e);   // the local ranks still to come fail the same way
        if (p.arrived >= slot.local) pending_.erase(key);
        if (call.done) call.done(&e);
        return true;
      }
    }
    p.calls.push_back(std::move(call));
    if (p.arrived < slot.local) return in_flight_->load() == 0 && pending_.size() == 1;
    alone = in_flight_->load() == 0 && pending_.size() == 1;
    in_flight_->fetch_add(1);
    ready = std::move(p.calls);
    pending_.erase(key);
    std::sort(ready.begin(), ready.end(), [](const DeviceCall& x, const DeviceCall& y) { return x.rank < y.rank; });
    const DeviceCall& a = ready.front();
    pc.kind = a.kind;
    pc.dtype = a.dtype;
    pc.op = a.op;
    pc.root = a.root;
    if (a.kind == Kind::kPermute) pc.perm = comm.perm;
    pc.count = a.count;
    if (a.kind == Kind::kRaggedAllToAll) {
      pc.row_elems = a.row_elems;
      pc.out_count = a.out_count;
      for (auto& c : ready) pc.ragged.push_back(c.ragged);
    }
    pc.prefolded = a.prefolded && (a.kind == Kind::kAllReduce || a.kind == Kind::kReduceScatter);
    pc.process_of_rank = members;
    pc.timeout_s = timeout_s_;
    pc.what = comm.name;
    pc.tag = process_tag(key);
    for (auto& c : ready) {
      pc.my_ranks.push_back(static_cast<int>(c.rank));
      pc.in.push_back(c.in);
      pc.out.push_back(c.out);
    }
  }
  auto calls = std::make_shared<std::vector<DeviceCall>>(std::move(ready));
  pc.done = [in_flight = in_flight_, calls](const Error* e) {
    in_flight->fetch_sub(1);
    for (auto& c : *calls)
      if (c.done) c.done(e);
  };
  ex_->submit(std::move(pc));
  return alone;
}

}  // namespace r2ccl::coll
