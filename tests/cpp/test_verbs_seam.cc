// Checks that the RDMA verbs backend's header, csrc/net/verbs/verbs_transport.h, fits the
// transport seam (net/transport.h): VerbsLink, VerbsListener and VerbsTransport are concrete,
// derive from the seam's classes and declare every one of its calls themselves, with the
// seam's exact types; the factory has the seam's shape; VerbsOptions' defaults are sane.
// Compile-time checks only touch declarations (nothing is constructed or called but
// VerbsOptions), so this builds and runs with no rdma-core and no backend implementation.
// Standalone: exits non-zero and names each failing check.
#include "net/verbs/verbs_transport.h"

#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

using namespace r2ccl;

// ---------------------------------------------------------------- compile time

// Concrete, derived from the seam, final, destroyed through the seam's pointer.
static_assert(!std::is_abstract_v<VerbsLink>, "VerbsLink leaves a seam call pure");
static_assert(!std::is_abstract_v<VerbsListener>, "VerbsListener leaves a seam call pure");
static_assert(!std::is_abstract_v<VerbsTransport>, "VerbsTransport leaves a seam call pure");
static_assert(std::is_base_of_v<FrameLink, VerbsLink>, "VerbsLink is not a FrameLink");
static_assert(std::is_base_of_v<FrameListener, VerbsListener>, "VerbsListener is not a FrameListener");
static_assert(std::is_base_of_v<Transport, VerbsTransport>, "VerbsTransport is not a Transport");
static_assert(std::is_convertible_v<VerbsLink*, FrameLink*>, "FrameLink is not a public base");
static_assert(std::is_convertible_v<VerbsListener*, FrameListener*>, "FrameListener is not a public base");
static_assert(std::is_convertible_v<VerbsTransport*, Transport*>, "Transport is not a public base");
static_assert(std::is_final_v<VerbsLink> && std::is_final_v<VerbsListener> && std::is_final_v<VerbsTransport>,
              "the backend classes are final");
static_assert(std::has_virtual_destructor_v<VerbsLink> && std::has_virtual_destructor_v<VerbsListener> &&
                  std::has_virtual_destructor_v<VerbsTransport>,
              "destroyed through the seam's unique_ptr");
static_assert(!std::is_copy_constructible_v<VerbsLink> && !std::is_copy_assignable_v<VerbsLink> &&
                  !std::is_copy_constructible_v<VerbsListener> && !std::is_copy_constructible_v<VerbsTransport>,
              "objects owning queue pairs and fds must not be copied");

// Each seam call is declared by the backend class itself: &Class::f has type `R (Class::*)(...)`
// only when Class declares f (an inherited f would give `R (Base::*)(...)`), and the rest of
// the type pins the exact signature. decltype does not odr-use anything, so no definition is
// needed.
#define R2CCL_DECLARES(cls, fn, type)                                                                  \
  static_assert(std::is_same_v<decltype(&cls::fn), type>, #cls "::" #fn " is not declared with the " \
                                                          "seam's signature")

R2CCL_DECLARES(VerbsLink, wait_fd, int (VerbsLink::*)() const);
R2CCL_DECLARES(VerbsLink, needs_writable_watch, bool (VerbsLink::*)() const);
R2CCL_DECLARES(VerbsLink, finish_connect, ConnectState (VerbsLink::*)());
R2CCL_DECLARES(VerbsLink, send_slots, size_t (VerbsLink::*)() const);
R2CCL_DECLARES(VerbsLink, post_send, void (VerbsLink::*)(const SendPost&));
R2CCL_DECLARES(VerbsLink, poll_send, LinkCompletion (VerbsLink::*)(size_t));
R2CCL_DECLARES(VerbsLink, head_sent, size_t (VerbsLink::*)() const);
R2CCL_DECLARES(VerbsLink, send_blocked, bool (VerbsLink::*)() const);
R2CCL_DECLARES(VerbsLink, move_payload, bool (VerbsLink::*)(uint64_t, const void*));
R2CCL_DECLARES(VerbsLink, poll_recv, LinkCompletion (VerbsLink::*)());
R2CCL_DECLARES(VerbsLink, accept_header, void (VerbsLink::*)(size_t));
R2CCL_DECLARES(VerbsLink, post_recv, void (VerbsLink::*)(void*, size_t, const MemRegion*));
R2CCL_DECLARES(VerbsLink, drop_recv, bool (VerbsLink::*)());
R2CCL_DECLARES(VerbsLink, failure, const LinkFailure& (VerbsLink::*)() const);
R2CCL_DECLARES(VerbsLink, shutdown, void (VerbsLink::*)());
R2CCL_DECLARES(VerbsLink, describe, std::string (VerbsLink::*)() const);

R2CCL_DECLARES(VerbsListener, wait_fd, int (VerbsListener::*)() const);
R2CCL_DECLARES(VerbsListener, local_addr, NetAddr (VerbsListener::*)() const);
R2CCL_DECLARES(VerbsListener, accept, std::unique_ptr<FrameLink> (VerbsListener::*)());

R2CCL_DECLARES(VerbsTransport, name, const char* (VerbsTransport::*)() const);
R2CCL_DECLARES(VerbsTransport, listen,
               std::unique_ptr<FrameListener> (VerbsTransport::*)(const Nic&, int, const LinkOptions&));
R2CCL_DECLARES(VerbsTransport, connect,
               std::unique_ptr<FrameLink> (VerbsTransport::*)(const Nic&, const NetAddr&, const LinkOptions&));
R2CCL_DECLARES(VerbsTransport, needs_registration, bool (VerbsTransport::*)() const);
R2CCL_DECLARES(VerbsTransport, register_memory, MemRegion (VerbsTransport::*)(const void*, size_t));
R2CCL_DECLARES(VerbsTransport, deregister_memory, void (VerbsTransport::*)(const MemRegion&));
#undef R2CCL_DECLARES

// The factory, beside make_socket_transport.
static_assert(std::is_same_v<decltype(&make_verbs_transport), std::unique_ptr<Transport> (*)(const VerbsOptions&)>,
              "make_verbs_transport(const VerbsOptions&) -> std::unique_ptr<Transport>");
static_assert(std::is_same_v<decltype(&make_socket_transport), std::unique_ptr<Transport> (*)(int)>,
              "the socket factory the verbs one stands beside");

// The link's own wire: a rendezvous SEND (prefix, the largest header, descriptor) and the
// setup record fit where they must.
static_assert(verbs_wire::kPrefixBytes + kMaxLinkHeaderBytes + verbs_wire::kDescriptorBytes <= 512,
              "a rendezvous message stays small");
static_assert(verbs_wire::kBootRecordBytes >= 4 + 2 + 4 + 4 + 2 + 16 + 2 + 4 + 2 + 4 + 2 + 2,
              "the setup record holds its fields");

// ---------------------------------------------------------------- run time

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++g_failures;
  }
}

void test_defaults() {
  const VerbsOptions o{};
  const char* p = o.problem();
  check(p == nullptr, std::string("the defaults have a problem: ") + (p ? p : ""));
  check(o.device.empty() && o.port == 0 && o.gid_index == -1, "device, port and GID default to auto");
  check(o.send_queue_depth >= 8 && o.send_queue_depth <= 1024, "send_queue_depth is modest");
  check(o.recv_queue_depth >= 8 && o.recv_queue_depth <= 1024, "recv_queue_depth is modest");
  check(o.send_bounce_buffers >= 1 && o.send_bounce_buffers <= o.send_queue_depth,
        "send bounce buffers: at least one, no more than send slots");
  // Every control frame is eager (the largest is an ack of 1024 ranges of 16 bytes), so they
  // never need registered memory.
  check(o.eager_bytes >= 1024 * 16, "eager_bytes covers the largest control frame");
  check(o.eager_bytes <= (size_t{1} << 20), "eager_bytes is a bounce size, not a chunk size");
  // Soft-RoCE grants 400 bytes inline; a frame's header with the link's prefix must fit.
  check(o.inline_bytes >= verbs_wire::kPrefixBytes + 64 && o.inline_bytes <= 400,
        "inline_bytes holds a bare 64-byte header and fits rxe's limit");
  check(o.max_reads >= 1 && o.max_reads <= 16, "max_reads is within what devices grant");
  // ACK timeout 4.096 us * 2^timeout per try, (retry_count + 1) tries: a backstop of
  // seconds, not NCCL's tens of seconds, nor so short that emulated Soft-RoCE trips it.
  const double backstop_s = 4.096e-6 * static_cast<double>(1u << o.timeout) * (o.retry_count + 1);
  check(backstop_s >= 0.5 && backstop_s <= 10, "QP retries give up after 0.5..10 s (" + std::to_string(backstop_s) + ")");
  check(o.rnr_retry >= 0 && o.rnr_retry < 7, "receiver-not-ready never retries forever");
  check(o.mtu == 0, "MTU defaults to what both ports run");
  check(o.bootstrap_timeout_ms >= 1000 && o.bootstrap_timeout_ms <= 60000, "bootstrap timeout of seconds");
  // Memory pinned per link by the defaults (bounce buffers, largest header): under 2 MiB.
  const size_t per_buffer = verbs_wire::kPrefixBytes + kMaxLinkHeaderBytes + o.eager_bytes;
  const size_t pinned = per_buffer * (o.recv_queue_depth + o.send_bounce_buffers);
  check(pinned < (size_t{2} << 20), "bounce buffers pin under 2 MiB per link (" + std::to_string(pinned) + ")");
}

void test_problems() {
  auto bad = [](const char* what, void (*edit)(VerbsOptions&)) {
    VerbsOptions o;
    edit(o);
    check(o.problem() != nullptr, std::string("problem() accepts ") + what);
  };
  bad("a zero send queue", [](VerbsOptions& o) { o.send_queue_depth = 0; });
  bad("a receive queue too short for a reserved credit", [](VerbsOptions& o) { o.recv_queue_depth = 1; });
  bad("more bounce buffers than send slots", [](VerbsOptions& o) { o.send_bounce_buffers = o.send_queue_depth + 1; });
  bad("no send bounce buffer", [](VerbsOptions& o) { o.send_bounce_buffers = 0; });
  bad("a 64 MiB eager size", [](VerbsOptions& o) { o.eager_bytes = size_t{64} << 20; });
  bad("an infinite ACK timeout", [](VerbsOptions& o) { o.timeout = 0; });
  bad("a 6-bit ACK timeout", [](VerbsOptions& o) { o.timeout = 32; });
  bad("8 retries", [](VerbsOptions& o) { o.retry_count = 8; });
  bad("endless receiver-not-ready retries", [](VerbsOptions& o) { o.rnr_retry = 7; });
  bad("an MTU of 1500", [](VerbsOptions& o) { o.mtu = 1500; });
  bad("GID index -2", [](VerbsOptions& o) { o.gid_index = -2; });
  bad("port 256", [](VerbsOptions& o) { o.port = 256; });
  bad("no READs in flight", [](VerbsOptions& o) { o.max_reads = 0; });
  bad("a zero bootstrap timeout", [](VerbsOptions& o) { o.bootstrap_timeout_ms = 0; });

  VerbsOptions named;
  named.device = "rxe0";
  named.port = 1;
  named.gid_index = 1;   // Soft-RoCE's RoCEv2 IPv4 GID
  named.mtu = 1024;
  check(named.problem() == nullptr, "a named rxe device, port 1, GID 1, MTU 1024 is accepted");
}

}  // namespace

int main() {
  test_defaults();
  test_problems();
  if (g_failures) {
    std::fprintf(stderr, "test_verbs_seam: %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("test_verbs_seam: all checks passed\n");
  return 0;
}
