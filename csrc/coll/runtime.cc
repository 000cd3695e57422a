// Rendezvous of local ranks and dispatch of process-level calls (see runtime.h).
#include "coll/runtime.h"

#include <algorithm>

#include "base/log.h"

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
}  // namespace

std::shared_ptr<Runtime> Runtime::current() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_runtime;
}

void Runtime::install(std::shared_ptr<Runtime> rt) {
  std::lock_guard<std::mutex> g(g_mu);
  g_runtime = std::move(rt);
}

Runtime::Runtime(Endpoint& ep, Executor& ex, int my_process, double timeout_s)
    : ep_(ep), ex_(ex), my_process_(my_process), timeout_s_(timeout_s) {}

void Runtime::register_comm(uint64_t comm_id, std::vector<std::vector<int>> groups, std::string name) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = comms_.find(comm_id);
  if (it != comms_.end()) {
    if (it->second.groups != groups)
      throw Error(Cause::kInvalidArgument, -1, "communicator id " + std::to_string(comm_id) + " (" + name +
                                                   ") was registered before with another layout");
    return;
  }
  comms_[comm_id] = Comm{std::move(groups), std::move(name)};
}

const Config& Runtime::config() const { return ep_.config(); }

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
    auto ci = comms_.find(call.comm_id);
    if (ci == comms_.end())
      return fail(Cause::kInvalidArgument, "collective on an unknown communicator (was jax_r2ccl.initialize() called "
                                           "in this process before the program was compiled?)");
    const Comm& comm = ci->second;
    if (call.group < 0 || call.group >= static_cast<int64_t>(comm.groups.size()))
      return fail(Cause::kInvalidArgument, "group " + std::to_string(call.group) + " does not exist in " + comm.name);
    const std::vector<int>& members = comm.groups[static_cast<size_t>(call.group)];
    if (call.rank < 0 || call.rank >= static_cast<int64_t>(members.size()) ||
        members[static_cast<size_t>(call.rank)] != my_process_)
      return fail(Cause::kInvalidArgument, "rank " + std::to_string(call.rank) + " of group " +
                                               std::to_string(call.group) + " of " + comm.name +
                                               " does not live in process " + std::to_string(my_process_));
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
    if (!p.calls.empty()) {
      const DeviceCall& a = p.calls.front();
      if (a.kind != call.kind || a.dtype != call.dtype || a.op != call.op || a.count != call.count ||
          a.root != call.root) {
        std::string why = std::string("local ranks disagree about a collective: rank ") + std::to_string(a.rank) +
                          " called " + kind_name(a.kind) + " of " + std::to_string(a.count) + " " +
                          dtype_name(a.dtype) + ", rank " + std::to_string(call.rank) + " called " +
                          kind_name(call.kind) + " of " + std::to_string(call.count) + " " + dtype_name(call.dtype);
        std::vector<DeviceCall> all = std::move(p.calls);
        all.push_back(std::move(call));
        pending_.erase(key);
        Error e(Cause::kMismatch, -1, why);
        for (auto& c : all)
          if (c.done) c.done(&e);
        return true;
      }
    }
    p.calls.push_back(std::move(call));
    size_t local = static_cast<size_t>(std::count(members.begin(), members.end(), my_process_));
    if (p.calls.size() < local) return in_flight_->load() == 0 && pending_.size() == 1;
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
    pc.count = a.count;
    pc.process_of_rank = members;
    pc.timeout_s = timeout_s_;
    pc.what = comm.name;
    uint64_t tag = hash_combine(hash_combine(hash_combine(hash_combine(hash_combine(0x52324343, a.comm_id),
                                                                       static_cast<uint64_t>(a.group)),
                                                          a.run_id),
                                             a.op_id),
                                k);
    pc.tag = tag;
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
  ex_.submit(std::move(pc));
  return alone;
}

}  // namespace r2ccl::coll
