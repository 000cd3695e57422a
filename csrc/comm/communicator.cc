// The communicator's construction and shutdown order (see communicator.h).
#include "comm/communicator.h"

#include "base/error.h"
#include "base/log.h"

namespace r2ccl::comm {

std::shared_ptr<Communicator> Communicator::open(std::shared_ptr<Endpoint> ep, int my_process) {
  if (!ep) throw Error(Cause::kInvalidArgument, -1, "a communicator needs an endpoint");
  if (my_process < 0 || my_process >= ep->world())
    throw Error(Cause::kInvalidArgument, -1, "process " + std::to_string(my_process) + " is not one of the endpoint's " +
                                                 std::to_string(ep->world()));
  std::shared_ptr<Communicator> c(new Communicator(std::move(ep), my_process));
  coll::Runtime::install(c->rt_);
  return c;
}

Communicator::Communicator(std::shared_ptr<Endpoint> ep, int my_process)
    : ep_(std::move(ep)), my_process_(my_process) {
  const Config& cfg = ep_->config();
  ex_ = std::make_shared<coll::Executor>(ep_, my_process_);
  try {
    if (cfg.monitor_ms > 0) {
      mon_ = std::make_shared<monitor::Monitor>(ep_, cfg);
      // The planner reads a cell that outlives the monitor: never a dangling monitor.
      ex_->set_capacity_source([cell = mon_->capacity_cell()] { return cell->load(); });
    }
    rt_ = std::make_shared<coll::Runtime>(ep_, ex_, my_process_, cfg.timeout_s);
  } catch (...) {
    if (mon_) mon_->close();
    ex_->close();
    throw;
  }
}

Communicator::~Communicator() { close(); }

bool Communicator::closed() const {
  std::lock_guard<std::mutex> g(mu_);
  return closed_;
}

size_t Communicator::drain(double timeout_s) {
  const int64_t t0 = now_ns();
  const size_t before = rt_->calls_in_progress();
  const size_t left = rt_->drain(timeout_s);
  const double waited_ms = static_cast<double>(now_ns() - t0) / 1e6;
  if (left > 0)
    R2_WARN("shutdown: %zu collective call(s) still in progress after %.0f ms (R2CCL_TIMEOUT or shutdown's "
            "timeout): closing fails them with cause closed", left, waited_ms);
  else if (before > 0)
    R2_INFO("shutdown: waited %.1f ms for the collective calls in progress", waited_ms);
  return left;
}

size_t Communicator::calls_in_progress() const { return rt_->calls_in_progress(); }

void Communicator::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return;
    closed_ = true;
  }
  coll::Runtime::uninstall(rt_.get());
  rt_->close();
  if (mon_) mon_->close();
  ex_->set_capacity_source(nullptr);
  ex_->close();
  ep_->close();
}

}  // namespace r2ccl::comm
