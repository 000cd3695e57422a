// The RDMA verbs backend of the transport seam (net/transport.h): InfiniBand or RoCE, one
// reliable-connected (RC) queue pair per link. libibverbs is loaded at run time
// (verbs_api.h), so the package imports and the socket backend runs where rdma-core is
// absent; this backend then says why it is unavailable.
//
// How a link works:
//  - Setup: the dialler opens a TCP connection to the listener's port (on the NIC's
//    address, as the socket backend does); both sides exchange one fixed record (QP number,
//    PSN, GID, LID, MTU, the receive buffers they offer, their size), move their QP
//    INIT -> RTR -> RTS, and the dialler sends one "ready" byte. The TCP connection stays
//    open for the link's life: the peer process dying turns into EOF within a round trip.
//    The engine's own handshake (the job secret) then runs over the queue pair like any
//    other frames, so a stranger gets a QP but never a frame through.
//  - Frames go as SENDs of registered bounce buffers ("segments"): each segment is an
//    8-byte prefix and up to header_bytes + segment_bytes of the frame's header-then-payload
//    stream; a frame starts a new segment and its first segment's prefix carries the
//    payload length, which accept_header checks. A post is kSent once its last byte is
//    copied into a segment and handed to the NIC: like a socket's send buffer, the copy
//    frees the caller's memory at once, and the channel's acks, not the link, say when the
//    peer has it. Receives copy out of the receive buffers into the space the engine posts.
//    One copy on each side, no registration of the engine's memory (rendezvous READs of
//    registered user buffers are the next step; see docs/design.md).
//  - Credits: a side SENDs a data segment only into a receive buffer the peer has posted
//    for it. Every prefix carries the count of data buffers its sender has reposted (mod
//    2^16), so credits ride on traffic; a credit-only message goes when half of them are
//    owed, or at once when the peer says it ran out. Credit-only messages land in a few
//    extra receive buffers that are reposted at once and owed to nobody, so credit messages
//    never wait for credits (no deadlock when both sides owe each other). If those extra
//    buffers are momentarily all in use, the NIC's receiver-not-ready retry (rnr_retry 7,
//    a 0.01 ms timer) resends the credit message: nothing is lost and nothing waits on it.
//  - Completions: one completion channel for both CQs; its fd, the bootstrap socket, the
//    device's async-event fd and an eventfd ("events taken but not handed out") are in the
//    link's own epoll fd, which is wait_fd().
//  - Failure: a failed work completion fails the link (IBV_WC_RETRY_EXC_ERR: kTimedOut; the
//    rest: kIo); an IBV_EVENT_PORT_ERR on the link's port fails it at once (kUnreachable),
//    and a dial on a port that is not ACTIVE fails the same way, so failback re-creates the
//    QPs once the port is ACTIVE again; EOF on the bootstrap socket is kClosedByPeer.
//  - Teardown: a link's QP, CQs and registered memory are released on its device's own
//    thread, never the caller's (the progress thread, which carries the other rails):
//    destroying a QP can block in the kernel for seconds after its port went down.
// Knows verbs and the seam; nothing of rails, the frame format's fields, collectives or JAX.
#pragma once
#include <memory>
#include <string>

#include "net/ibverbs/rdma_ports.h"
#include "net/transport.h"

namespace r2ccl {

// A listener address served by this backend, as endpoints publish it: "ibverbs:IP:PORT"
// (a socket listener's is plain "IP:PORT"), so peers dial each NIC with the right backend.
inline constexpr const char kVerbsAddrPrefix[] = "ibverbs:";

// How the verbs backend makes its links; problem() says what is wrong with a setting.
struct VerbsOptions {
  int gid_index = -1;                 // R2CCL_IB_GID_INDEX (-1: the RoCEv2 GID of the NIC's IPv4 address)
  // ACK timeout = 4.096 us x 2^timeout per try; with 7 retries, 14 gives ~0.5 s before
  // IBV_WC_RETRY_EXC_ERR (NCCL: 20 and 7, ~34 s). Heartbeats and the port events find a
  // dead path well before; this is the backstop.
  int timeout = 14;                   // R2CCL_IB_TIMEOUT, 1..31
  int retry_count = 7;                // R2CCL_IB_RETRY_COUNT, 0..7
  int traffic_class = 0;              // RoCE GRH traffic class (DSCP << 2)
  uint32_t segment_bytes = 1u << 16;  // payload bytes per bounce buffer, beyond the frame header (64 KiB)
  uint32_t send_buffers = 32;         // send bounce buffers per link
  uint32_t recv_buffers = 32;         // receive buffers per link for data (the peer's credits)
  int bootstrap_timeout_ms = 5000;    // a setup exchange not done by then fails

  const char* problem() const;
};

// Why the verbs backend cannot run in this process ("" when it can): not built (no rdma-core
// headers at build time), libibverbs not loadable, or no RDMA device.
std::string verbs_unavailable_reason();

// What GPUDirect RDMA would need that this host has, as a sentence: libibverbs with
// ibv_reg_dmabuf_mr, the nvidia-peermem module, and each RDMA device's answer to the dma-buf
// probe (verbs_device.cc). The data path moves no device memory yet (docs/design.md §10).
std::string gpudirect_report();

// Whether `nic` maps to an ACTIVE RDMA port in `ports` (rdma_ports(): one scan serves every
// NIC; under emulation a scan takes ~0.3 s) and the backend can run (R2CCL_TRANSPORT=auto
// picks verbs there); else false with the reason in *why.
bool verbs_serves(const Nic& nic, const VerbsOptions& opt, const std::vector<RdmaPort>& ports, std::string* why);

// The verbs backend. Throws Error(kInvalidArgument) for options with a problem(), and
// Error(kSystem) with verbs_unavailable_reason() when it cannot run. listen/connect on a NIC
// without an RDMA port throw Error(kSystem) naming the NIC.
std::unique_ptr<Transport> make_verbs_transport(const VerbsOptions& opt);

}  // namespace r2ccl
