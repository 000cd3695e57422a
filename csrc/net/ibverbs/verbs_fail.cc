// A verbs link's failure and teardown (verbs_internal.h): what a failed work completion, an
// async event or the bootstrap socket's end means for the link (LinkError), and the release of
// its QP, CQs and memory on the device's thread, off the caller's. Nothing of set-up or segments.
#if R2CCL_HAVE_IBVERBS

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "net/ibverbs/verbs_internal.h"

namespace r2ccl::verbs {

bool VerbsLink::sys_fail(const std::string& what, int e) {
  const int err = e ? e : errno;
  fail(LinkError::kIo, err, what + " failed on " + at_.dev->name + ":" + std::to_string(at_.port) +
                                (err ? std::string(": ") + std::strerror(err) : std::string()));
  return false;
}

void VerbsLink::fail(LinkError e, int err, std::string detail) {
  if (failed()) return;
  failure_.error = e;
  failure_.sys_error = err;
  failure_.detail = std::move(detail);
  R2_TRACE("%s: %s", desc_.c_str(), failure_.detail.c_str());
  update_ready();
}

void VerbsLink::fail_wc(const ibv_wc& wc) {
  if (wc.status == IBV_WC_WR_FLUSH_ERR) {
    fail(closing_ ? LinkError::kClosedByPeer : LinkError::kIo, wc.status, "work request flushed: the QP is in error");
  } else if (wc.status == IBV_WC_REM_ACCESS_ERR) {
    // The peer's memory refused our WRITE: it revoked the keys of a receive it gave up (its
    // cancel re-registered the memory). The message is abandoned; the link is not at fault.
    fail(LinkError::kAbandoned, wc.status, "remote access error on a one-sided write: the peer revoked that memory "
                                           "(message abandoned)");
  } else {
    fail(wc.status == IBV_WC_RETRY_EXC_ERR ? LinkError::kTimedOut : LinkError::kIo, wc.status,
         std::string("work completion: ") + api_->wc_status_str(wc.status) + " (wc status " +
             std::to_string(static_cast<int>(wc.status)) + ")");
  }
}

void VerbsLink::check_device() {
  std::string why = at_.dev->port_down(at_.port);
  if (!why.empty()) fail(LinkError::kUnreachable, 0, why);
  else if (at_.dev->qp_dead(qp_->qp_num)) fail(LinkError::kIo, 0, "the QP was put in error by the device (async event)");
}

void VerbsLink::check_bootstrap() {
  uint8_t x;
  ssize_t r = ::recv(boot_->fd(), &x, 1, MSG_DONTWAIT);
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    closing_ = true;
    fail(LinkError::kClosedByPeer, r < 0 ? errno : 0, "connection closed by the peer (its verbs bootstrap socket ended)");
  } else if (r > 0) {
    fail(LinkError::kIo, 0, "verbs link: unexpected bytes on the bootstrap socket");
  }
}

void VerbsLink::shutdown() {
  boot_->shutdown();
  if (qp_) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    api_->modify_qp(qp_, &a, IBV_QP_STATE);
  }
}

VerbsLink::~VerbsLink() {
  at_.dev->unwatch(ready_fd_);
  if (epfd_ >= 0) ::close(epfd_);
  if (ready_fd_ >= 0) ::close(ready_fd_);
  // The QP, CQs, channel and registered memory go on the device's thread (Device::retire):
  // nothing else refers to them (frames were copied into mem_, which dies with them).
  at_.dev->retire([api = api_, qp = qp_, scq = scq_, scq_events = scq_events_, rcq = rcq_,
                   rcq_events = rcq_events_, ch = ch_, mr = mr_, mem = mem_, desc = desc_] {
    const int64_t t0 = now_ns();
    if (qp) api->destroy_qp(qp);
    const int64_t t1 = now_ns();
    if (scq) {
      if (scq_events) api->ack_cq_events(scq, scq_events);
      api->destroy_cq(scq);
    }
    if (rcq) {
      if (rcq_events) api->ack_cq_events(rcq, rcq_events);
      api->destroy_cq(rcq);
    }
    if (ch) api->destroy_comp_channel(ch);
    const int64_t t2 = now_ns();
    if (mr) api->dereg_mr(mr);
    std::free(mem);
    const int64_t t3 = now_ns();
    if (t3 - t0 > 10000000)
      R2_INFO("%s: teardown took %.0f ms (QP %.0f, CQs %.0f, MR %.0f), off the progress thread", desc.c_str(),
              (t3 - t0) / 1e6, (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6);
  });
}

}  // namespace r2ccl::verbs

#endif  // R2CCL_HAVE_IBVERBS
