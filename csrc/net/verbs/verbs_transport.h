// The RDMA verbs backend of the transport seam (net/transport.h): InfiniBand or RoCE, one
// reliable-connected (RC) queue pair per link. This header is the backend's design, written
// against the seam to show that the seam fits RDMA; the implementation (verbs_transport.cc)
// is a later issue. It compiles without rdma-core: the verbs objects are only
// forward-declared, and the implementation loads libibverbs at run time, so one build serves
// machines with and without RDMA.
//
// How a link works, in short:
//  - Setup: a TCP connection to the listener's port exchanges queue-pair numbers, GIDs and
//    PSNs, and stays open for the link's life as its close and peer-death signal. The
//    engine's own handshake frames then run over the queue pair like any other frames.
//  - A frame is one SEND of [link prefix][header][payload]. Payloads up to eager_bytes are
//    copied into a registered bounce buffer (eager); larger ones go by rendezvous: the SEND
//    carries [prefix][header][descriptor: address, rkey], the receiver RDMA READs the payload
//    into the space it posts, then SENDs a FIN that completes the sender's post.
//  - Credits: a side SENDs only into receives the peer has posted. Credits come back in
//    every message's prefix, so a receive queue never runs dry. A side never spends its
//    last credit on a frame: that one is kept for a FIN or credit message, so two sides
//    that both owe credits can never both be stuck. A credit-only message goes out when
//    half the window is owed and nothing else is going, or at once when the peer flags
//    that it is down to its reserve.
//  - Completions: a send CQ and a receive CQ, both on one completion channel, so one fd wakes
//    the progress thread.
// Knows verbs and the seam; nothing of rails, the frame format's fields, collectives or JAX.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "net/transport.h"

// rdma-core's objects, never dereferenced here (the header must not need <infiniband/verbs.h>).
struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_mr;
struct ibv_comp_channel;
struct ibv_wc;

namespace r2ccl {

// How the verbs backend makes its links. Defaults suit one RoCEv2 or IB port per NIC and
// also work on Soft-RoCE (rxe: 400-byte inline limit, 8 MiB maximum message, IB MTU 1024 on
// a 1500-byte link). `problem()` says what is wrong with a setting, or returns null.
struct VerbsOptions {
  // Which device and port serve a NIC. "" (auto): the device and port whose GID table holds
  // the NIC's IPv4 address as a RoCEv2 GID (RoCE), or whose port's netdev is the NIC's
  // interface (IB over IPoIB). Otherwise a device name ("mlx5_0", "rxe0").
  std::string device;
  int port = 0;             // 1-based port number; 0: auto, as above
  int gid_index = -1;       // -1: auto (the RoCEv2 GID of the NIC's IPv4 address; rxe: 1)

  // Queues. send_queue_depth is send_slots(): the posts a link takes before kSent frees one.
  // The QP gets more send work requests than that, for its own READs, FINs and credit
  // messages. recv_queue_depth receives stay posted, each with a bounce buffer, and are the
  // credits the peer starts with.
  uint32_t send_queue_depth = 32;
  uint32_t recv_queue_depth = 32;

  // Eager frames. Payloads up to eager_bytes are copied and sent in one SEND. The default
  // covers every control frame (the largest is an ack of 1024 ranges, 16 KiB) and the
  // smallest data chunk, so only data chunks above 16 KiB need registered memory.
  // Each bounce buffer holds link prefix + header + eager_bytes. With the defaults a link
  // pins (32 + 16) buffers of about 16 KiB each, roughly 0.8 MiB.
  size_t eager_bytes = 16 << 10;
  // Send-side bounce buffers. Rendezvous posts use none, so fewer than send_queue_depth is
  // fine. An eager post that finds none free waits in the link until one is freed.
  uint32_t send_bounce_buffers = 16;
  // Messages up to this size (prefix + header + payload) are sent with IBV_SEND_INLINE (no
  // DMA read of the bounce buffer). Capped at what the device grants when the QP is made.
  uint32_t inline_bytes = 128;
  // RDMA READs in flight per link (the QP's max_rd_atomic), capped by the device.
  uint32_t max_reads = 8;

  // Path and timeouts. ACK timeout = 4.096 us x 2^timeout per try, so 16 gives about 268 ms
  // and 7 retries give about 2 s before IBV_WC_RETRY_EXC_ERR. NCCL uses 20 and 7, about
  // 34 s. The engine's heartbeats find a silent rail well before either; this is only the
  // backstop, and it is kept long enough for emulated Soft-RoCE.
  int timeout = 16;         // 0..31 (0: infinite, refused)
  int retry_count = 7;      // 0..7
  // Credits guarantee a posted receive for every SEND, so receiver-not-ready means a bug.
  // 0 retries makes it fail the link loudly (kIo) instead of stalling it quietly.
  int rnr_retry = 0;        // 0..6 (7 means retry forever, and is refused)
  int mtu = 0;              // 256, 512, 1024, 2048 or 4096; 0: the smaller active MTU of both ports
  int traffic_class = 0;    // RoCE: the GRH traffic class (DSCP << 2) of a lossless class
  int bootstrap_timeout_ms = 10000;   // a setup exchange not done by then fails (kTimedOut)

  const char* problem() const {
    if (port < 0 || port > 255) return "port must be 0 (auto) or 1..255";
    if (gid_index < -1 || gid_index > 255) return "gid_index must be -1 (auto) or 0..255";
    if (send_queue_depth < 1 || send_queue_depth > 4096) return "send_queue_depth must be 1..4096";
    if (recv_queue_depth < 4 || recv_queue_depth > 4096) return "recv_queue_depth must be 4..4096";
    if (eager_bytes > (size_t{1} << 20)) return "eager_bytes must be at most 1 MiB";
    if (send_bounce_buffers < 1 || send_bounce_buffers > send_queue_depth)
      return "send_bounce_buffers must be 1..send_queue_depth";
    if (inline_bytes > 1024) return "inline_bytes must be at most 1024";
    if (max_reads < 1 || max_reads > 255) return "max_reads must be 1..255";
    if (timeout < 1 || timeout > 31) return "timeout must be 1..31";
    if (retry_count < 0 || retry_count > 7) return "retry_count must be 0..7";
    if (rnr_retry < 0 || rnr_retry > 6) return "rnr_retry must be 0..6";
    if (mtu != 0 && mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096)
      return "mtu must be 0 (auto) or 256, 512, 1024, 2048, 4096";
    if (traffic_class < 0 || traffic_class > 255) return "traffic_class must be 0..255";
    if (bootstrap_timeout_ms < 1) return "bootstrap_timeout_ms must be positive";
    return nullptr;
  }
};

// What the link puts on the queue pair. Its own format: none of it is the engine's frame
// header, which it carries opaque. Little-endian.
namespace verbs_wire {
// Every SEND starts with an 8-byte prefix: kind (u8), flags (u8), credits returned (u16),
// length (u32). Length is the frame's payload length (kEager, kRendezvous) or the bytes
// read (kFin).
constexpr size_t kPrefixBytes = 8;
enum Kind : uint8_t {
  kEager = 1,        // prefix, header, payload (the length in the prefix)
  kRendezvous = 2,   // prefix, header, descriptor; the payload waits in the sender's memory
  kFin = 3,          // prefix: the receiver is done reading the oldest rendezvous payload
  kCredit = 4,       // prefix only: credits returned, nothing else to say
};
constexpr uint8_t kFlagLastCredit = 1;   // the sender is down to its reserve: return credits at once
// The rendezvous descriptor after the header: payload address (u64), rkey (u32), zero (u32).
constexpr size_t kDescriptorBytes = 16;
// The setup exchange on the TCP connection, one fixed record each way: magic "R2VB",
// version, QP number, initial PSN, LID, GID (16 bytes), active MTU, receive depth (the
// credits offered), header bytes, eager bytes the receiver's buffers hold, READs it
// answers at once, and a reject reason (0: accepted). The connector then sends one byte:
// "my QP is ready to receive".
constexpr uint32_t kBootMagic = 0x42563252;   // "R2VB"
constexpr uint16_t kBootVersion = 1;
constexpr size_t kBootRecordBytes = 64;
}  // namespace verbs_wire

// One opened device: context, protection domain, the port and GID serving a NIC, and the
// device's async-event fd. Shared by the transport and its links (a link keeps its device
// alive). Defined in the implementation.
struct VerbsDevice;
// The transport's registry of memory regions: one ibv_mr per region per opened device.
struct VerbsRegistry;

class VerbsLink final : public FrameLink {
 public:
  // Made by VerbsTransport::connect (pending, with `boot_fd` connecting) or by
  // VerbsListener::accept (already up). Takes ownership of `boot_fd`.
  VerbsLink(std::shared_ptr<VerbsDevice> dev, std::shared_ptr<VerbsRegistry> reg, int boot_fd, bool connector,
            const LinkOptions& lopt, const VerbsOptions& vopt);
  ~VerbsLink() override;   // destroys the QP, CQs, channel and bounce buffers; closes its fds
  VerbsLink(const VerbsLink&) = delete;
  VerbsLink& operator=(const VerbsLink&) = delete;

  // The link's own epoll fd, the same for its whole life. It watches the completion
  // channel, the bootstrap socket (for setup, then EOF), the device's async-event fd, and an
  // eventfd that stays readable while the link holds completions it has already taken from
  // a CQ but not yet handed out. An epoll fd only ever reads as readable: for this link,
  // readable means "call finish_connect while pending, else poll_send and poll_recv". It
  // never reports writable (see send_blocked).
  int wait_fd() const override;
  // False: an epoll fd never reads as writable (see wait_fd).
  bool needs_writable_watch() const override;
  // The setup exchange, driven by the bootstrap socket: connect(2) finishes, send our record,
  // read the peer's, move the QP INIT -> RTR -> RTS (receives are posted before RTR), send
  // the ready byte, then kUp. Errors: ECONNREFUSED -> kRefused; ENETUNREACH/EHOSTUNREACH, no
  // device for the NIC, or a GID the port lacks -> kUnreachable; past bootstrap_timeout_ms
  // -> kTimedOut; the peer's record rejects us (another version, a header size we do not
  // share, or a socket-backend peer answering garbage) -> kRefused, with the reason in
  // failure().detail. RDMA CM's REJ would map to kRefused too, but this backend does not use
  // the CM. Plain TCP on the listener's port keeps the socket backend's ip:port addressing,
  // is pollable like any socket, and needs no librdmacm. The open socket also turns a dead
  // peer process into EOF or RST within a round trip. Without it a dead peer is only seen
  // when the QP's retries run out.
  ConnectState finish_connect() override;

  // send_queue_depth (the QP holds extra work requests for the link's own READs, FINs and
  // credit messages, so these never compete with the caller's posts).
  size_t send_slots() const override;
  // Copies the header at once. payload_len <= the smaller of both sides' eager_bytes: the
  // payload is copied into a send bounce buffer as well (`mr` not needed). Otherwise: a
  // rendezvous, and `mr` must cover the payload (its rkey goes in the descriptor; a missing
  // or short region fails the link, kIo, "transport misuse"). A post that finds no credit
  // or (eager) no bounce buffer waits in the link in order. post_send never blocks and
  // never fails for lack of them.
  void post_send(const SendPost& post) override;
  // Hands waiting posts to the NIC, then drains both CQs into the link's state and reports
  // the oldest post whose completion is in: eager at its SEND's work completion (on RC, the
  // peer's NIC has it), rendezvous at the peer's FIN. kSent comes in post order even when a
  // later eager SEND finishes before an earlier rendezvous.
  // Budget: the NIC cannot split a posted message, so 0 holds the next post and any other
  // budget lets it go whole. `moved` counts frame bytes, as TCP would (header and eager
  // payload when handed to the NIC, not the link's prefix; a rendezvous payload when its
  // FIN arrives). A software rate cap charging `moved` then runs into debt and waits,
  // which keeps the average rate right.
  LinkCompletion poll_send(size_t budget = SIZE_MAX) override;
  // The NIC reports no partial progress: 0 until the oldest post's SEND completes, then
  // header_bytes (a rendezvous then waits for the peer's READs). Whole only at kSent.
  size_t head_sent() const override;
  // Always false. The NIC, not the poller, moves what was handed to it. A post waiting for
  // a credit or a bounce buffer is woken by the completion that frees one, and that makes
  // wait_fd readable.
  bool send_blocked() const override;
  // Eager: true (the payload was copied at post, so neither pointer is read again).
  // Rendezvous: false. The peer holds the original's address and rkey and may READ it
  // until its FIN, and the copy has no registration (the seam passes no region for it).
  // Finished or unknown cookie: true.
  bool move_payload(uint64_t cookie, const void* payload) override;

  // Drains both CQs (receive CQ: frames, FINs, credits; send CQ: READs done), then hands out
  // the next event in order: kHeader (pointing into the receive bounce buffer, valid until
  // the next poll_recv) or kPayload. Reposts a receive buffer once its frame is consumed, and
  // only then counts it as a credit owed to the peer.
  LinkCompletion poll_recv() override;
  // Checks the engine's length against what the link carried. Eager: the work completion's
  // byte_len minus prefix and header, which must also equal the prefix's length.
  // Rendezvous: the prefix's length. A mismatch fails the link (kIo, "frame announced N
  // payload bytes, the link carried M"). 0: the frame is done and its buffer is reposted.
  void accept_header(size_t payload_len) override;
  // Eager: copies the piece out of the bounce buffer (dst null: skipped). kPayload follows on
  // the next poll_recv, and the buffer is reposted after the last piece. Rendezvous: one RDMA
  // READ from the sender's address + offset into `dst`, using mr->lkey (split at the port's
  // maximum message size, e.g. rxe's 8 MiB; kPayload when all of its READs are done; at
  // most max_reads in flight, the rest queue). dst null: no READ at all, the bytes are never
  // moved. After the last piece the link SENDs a FIN (returning credits too).
  // Why READ and not "the sender WRITEs into space the receiver advertises": the seam has
  // the receiver choose the space after the header arrives. With READ it moves the bytes
  // the moment it knows where they go. With WRITE the space would have to be advertised back
  // and the sender would have to notice and act: one more message, sender-side progress
  // latency. The receiver also never opens its own memory to the peer (no REMOTE_WRITE
  // anywhere), and dropped pieces cost no bandwidth. The price is the FIN, and the sender's
  // payload staying readable until then.
  void post_recv(void* dst, size_t len, const MemRegion* mr) override;
  // Eager: true (nothing is copied until the next poll_recv, which then skips the piece).
  // Rendezvous: false while a READ into the piece is in flight (the NIC writes the old
  // space until its completion); true once none is, the remaining READs then not issued.
  bool drop_recv() override;

  // The first failure wins and stays. ibv_wc_status: IBV_WC_RETRY_EXC_ERR -> kTimedOut;
  // IBV_WC_RNR_RETRY_EXC_ERR, REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR, LOC_PROT_ERR,
  // LOC_LEN_ERR, LOC_QP_OP_ERR, BAD_RESP_ERR, GENERAL_ERR -> kIo; IBV_WC_WR_FLUSH_ERR is only
  // a consequence: kClosedByPeer when the bootstrap socket saw EOF or RST first, otherwise
  // the earlier error's kind (kIo if none). Bootstrap socket EOF or RST after setup ->
  // kClosedByPeer. Async events: IBV_EVENT_PORT_ERR on the link's port -> kUnreachable (at
  // once: a downed port otherwise stalls an RC QP with no completion error for the whole
  // retry time); QP_FATAL / QP_REQ_ERR / QP_ACCESS_ERR on its QP, or DEVICE_FATAL -> kIo.
  // sys_error holds the wc status, the async event type, or errno (bootstrap socket).
  const LinkFailure& failure() const override;
  // Closes the bootstrap socket (the peer sees EOF: kClosedByPeer) and moves the QP to ERR.
  // Its own flushed work requests are then discarded, not reported as failures.
  void shutdown() override;
  // "verbs mlx5_0:1 198.18.0.1:40000->198.18.0.2:5000 qp 0x1a2->0x3b4"
  std::string describe() const override;

 private:
  struct State;            // send queue, receive queue, credits, pending READs and FINs

  // Drains a CQ into State, mapping failed work completions (IBV_WC_*) to a LinkFailure.
  void drain(ibv_cq* cq);
  void absorb(const ibv_wc& wc);
  // After both CQs read empty: ibv_req_notify_cq on both, then poll once more, so a
  // completion that arrived between the last poll and the re-arm is not missed. CQ events
  // are acknowledged (ibv_ack_cq_events) in batches and before the CQ is destroyed.
  void rearm();
  void fail(LinkError e, int sys_error, std::string detail);

  std::shared_ptr<VerbsDevice> dev_;
  std::shared_ptr<VerbsRegistry> reg_;
  ibv_comp_channel* channel_ = nullptr;   // one per link; its fd is in the epoll set
  ibv_cq* send_cq_ = nullptr;             // SEND and READ completions
  ibv_cq* recv_cq_ = nullptr;             // incoming SENDs (frames, FINs, credits)
  ibv_qp* qp_ = nullptr;                  // RC
  ibv_mr* bounce_mr_ = nullptr;           // one registration over both bounce pools
  uint8_t* bounce_ = nullptr;             // page-aligned: send pool, then receive pool
  int boot_fd_ = -1;                      // the TCP bootstrap connection, open for the link's life
  int epoll_fd_ = -1;                     // wait_fd()
  int ready_fd_ = -1;                     // eventfd: completions taken but not handed out
  bool connector_ = false;
  size_t header_bytes_ = 0;
  VerbsOptions opt_;
  std::unique_ptr<State> st_;
  LinkFailure failure_;
  std::string desc_;
};

class VerbsListener final : public FrameListener {
 public:
  // A TCP listening socket on the NIC's address and `port` (0: any free port). `dev` is the
  // device serving that NIC (VerbsTransport::listen refuses a NIC without one).
  VerbsListener(std::shared_ptr<VerbsDevice> dev, std::shared_ptr<VerbsRegistry> reg, int listen_fd, const Nic& nic,
                const LinkOptions& lopt, const VerbsOptions& vopt);
  ~VerbsListener() override;
  VerbsListener(const VerbsListener&) = delete;
  VerbsListener& operator=(const VerbsListener&) = delete;

  // An epoll fd over the listening socket and the bootstrap sockets of setups in progress.
  int wait_fd() const override;
  // The TCP listener's address: what the peer dials, as with the socket backend.
  NetAddr local_addr() const override;
  // Accepts waiting TCP connections and moves every setup in progress on (read the
  // connector's record, make the QP, post receives, RTR -> RTS, answer with our record).
  // Returns a link only when its connector's ready byte has arrived, so the link is up in
  // both directions. A setup that fails or takes longer than bootstrap_timeout_ms is dropped
  // (the dialler sees its failure). At most 64 at a time, so strangers on the port cannot
  // pin memory or QPs.
  std::unique_ptr<FrameLink> accept() override;

 private:
  struct Pending;          // setups in progress, each with its QP and bounce buffers

  std::shared_ptr<VerbsDevice> dev_;
  std::shared_ptr<VerbsRegistry> reg_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  Nic nic_;
  LinkOptions lopt_;
  VerbsOptions vopt_;
  std::unique_ptr<Pending> pending_;
};

class VerbsTransport final : public Transport {
 public:
  explicit VerbsTransport(const VerbsOptions& opt);
  ~VerbsTransport() override;   // closes devices no link still holds
  VerbsTransport(const VerbsTransport&) = delete;
  VerbsTransport& operator=(const VerbsTransport&) = delete;

  const char* name() const override;   // "verbs"
  // Finds (opening once, then sharing) the device and port serving `nic`; throws
  // Error(kSystem) naming the NIC when none does. The LinkOptions socket fields
  // (bind_device, user_timeout_ms, buffer_bytes) apply to the bootstrap sockets;
  // header_bytes sizes the bounce buffers.
  std::unique_ptr<FrameListener> listen(const Nic& nic, int port, const LinkOptions& opt) override;
  // A pending link. Its QP is made at once (INIT, receives posted) because our record
  // carries its number. A nonblocking connect(2) starts the bootstrap. What fails here
  // (no device for `local`, no route, no QP) is reported by finish_connect, not thrown.
  std::unique_ptr<FrameLink> connect(const Nic& local, const NetAddr& remote, const LinkOptions& opt) override;
  // True: posts name regions covering their bytes (an eager send's region goes unused).
  bool needs_registration() const override;
  // ibv_reg_mr(LOCAL_WRITE | REMOTE_READ) on every device the transport has opened. A
  // device opened later registers the live regions when it opens. LOCAL_WRITE because READs
  // land in it; REMOTE_READ because a rendezvous peer reads it; never REMOTE_WRITE. Since one
  // region may need a key per device (one device per NIC), the keys live behind `handle`,
  // in the transport's registry. lkey/rkey are the first device's, for logs. No cache here:
  // each call pins, and deregister_memory unpins. A registration cache keyed by address
  // range is the engine's job. Only the engine knows when a buffer's life ends (a request
  // done, a staging buffer freed), and that is when a cached registration must go:
  // otherwise a reused address would hit stale pinned pages. Either call may come from any
  // thread (the registry is locked). rkeys leave this process only in rendezvous
  // descriptors. The handshake frames are small and eager, so no key reaches a peer
  // that has not yet proven the job's secret. Throws Error(kSystem) when pinning fails
  // (RLIMIT_MEMLOCK, no memory). Needs fork safety (rdma-core's copy-on-fork, or
  // ibv_fork_init before the first registration) when the process may fork.
  MemRegion register_memory(const void* base, size_t len) override;
  void deregister_memory(const MemRegion& mr) override;

 private:
  std::shared_ptr<VerbsDevice> device_for(const Nic& nic);   // opens and caches; throws Error(kSystem)

  VerbsOptions opt_;
  std::shared_ptr<VerbsRegistry> reg_;   // opened devices (by name) and live regions, locked
};

// The verbs backend. Throws Error(kInvalidArgument) for options with a problem(), and
// Error(kSystem) when libibverbs cannot be loaded or no RDMA device is present.
std::unique_ptr<Transport> make_verbs_transport(const VerbsOptions& opt = VerbsOptions{});

}  // namespace r2ccl
