// The transport seam: what a rail needs from the network, cut so that a TCP socket and an
// RDMA queue pair can both serve it. A link carries frames in order in both directions; a
// frame is a header of fixed size (LinkOptions::header_bytes) and a payload. Sends are
// posted (header plus memory the transport reads until the send completes); receives
// deliver the header first, and the payload lands in space the receiver posts once it has
// read the header, so the receiver, never the sender, decides where and how much memory
// the payload takes. Completions are polled, per direction (as verbs keep a send and a
// receive queue). A failed link says why as a LinkError. Memory the transport reads or
// writes may have to be registered first, by an explicit call (sockets need none).
// Nonblocking throughout: each link and listener has a pollable fd, so one progress thread
// drives many. Knows nothing of rails, the frame format's fields, collectives or JAX.
#pragma once
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace r2ccl {

// A NIC as the user named it (interface name or IPv4 address), resolved to an address.
struct Nic {
  std::string name;     // as given: "eth1", "nic0" or "127.0.0.2"
  std::string ifname;   // kernel interface name; empty if it could not be resolved
  in_addr addr{};       // the IPv4 address traffic on this NIC uses as its source
  std::string addr_str() const;
};

// Resolves "nic0", "eth1" or "198.18.0.1" to a Nic; throws Error(kInvalidArgument) naming the
// input when no such interface or local address exists.
Nic resolve_nic(const std::string& name);
// The NICs R2CCL_NICS means when empty: every non-loopback interface that is up (operstate up
// or unknown) and has an IPv4 address, in interface-index order; else {"127.0.0.1"}.
std::vector<std::string> default_nics();

struct NetAddr {
  sockaddr_in sa{};
  std::string str() const;                            // "ip:port"
  static NetAddr parse(const std::string& ip_port);   // throws Error(kInvalidArgument)
};

// Memory a transport may read sends from, land receives in, or let the peer write into.
// register_memory pins and keys it where the hardware needs that (verbs: ibv_reg_mr on every
// device the transport serves, so any of its links can use it); a transport that needs none
// (sockets) returns a region with no handle, and every post accepts a null region from it.
struct MemRegion {
  const void* base = nullptr;
  size_t len = 0;
  uint64_t handle = 0;           // the transport's own registration (0 where none); keys are per device
  bool covers(const void* p, size_t n) const {
    auto b = reinterpret_cast<uintptr_t>(base), x = reinterpret_cast<uintptr_t>(p);
    return x >= b && n <= len && x - b <= len - n;
  }
};

// A dma-buf that backs a region: memory the NIC reaches through the buffer's exporter rather
// than through this process's page tables (GPU memory exported with
// cuMemGetHandleForAddressRange; NCCL's regMrDmaBuf hands one over). `fd` is the caller's
// and stays open only for the call: a transport that keeps the region keeps its own dup.
// The region's bytes are at `offset` in the buffer; its address (MemRegion::base) is the one
// writes name, as with any region.
struct DmaBuf {
  int fd = -1;
  uint64_t offset = 0;
};

// Why a link failed, or why it could not be made.
enum class LinkError : uint8_t {
  kNone,
  kRefused,        // nothing listens there (connect refused; RDMA: REJ / no such service)
  kUnreachable,    // no route from this NIC (the route vanished, the address is unusable)
  kTimedOut,       // the path stopped answering (TCP_USER_TIMEOUT; RDMA: retries exhausted)
  kClosedByPeer,   // the other end closed or reset the link
  kIo,             // any other local or transport error (errno or work-completion status)
  kAbandoned,      // a one-sided write met memory the peer had revoked (its receive was cancelled)
};
const char* link_error_name(LinkError e);

struct LinkFailure {
  LinkError error = LinkError::kNone;
  int sys_error = 0;       // errno (sockets) or the work completion's status (verbs), 0 if none
  std::string detail;      // for logs and error messages: "send failed: Broken pipe"
};

// One posted send: the header (copied at post) and a payload the transport reads until the
// post completes (kSent) or the link fails. `mr` covers the payload where the transport
// needs registration.
struct SendPost {
  const uint8_t* header = nullptr;
  const void* payload = nullptr;
  size_t payload_len = 0;
  const MemRegion* mr = nullptr;
  uint64_t cookie = 0;     // handed back in its kSent
  // A one-sided write (links whose can_write() says so): the payload, read from `mr`'s memory,
  // is written into the peer's memory at remote_addr through remote_key, and the frame carries
  // the header alone, which reaches the peer only after the payload has landed. kSent comes once
  // the NIC has finished reading the payload.
  bool write = false;
  uint64_t remote_addr = 0;
  uint32_t remote_key = 0;
};

struct LinkCompletion {
  enum Kind : uint8_t {
    kNone,       // nothing finished (`moved` may still say bytes went by)
    kSent,       // the oldest unfinished send is done: its payload may be reused
    kHeader,     // a frame's header arrived (in `header`); post its payload's space next
    kPayload,    // the receive space posted last is full
    kFailed,     // the link is dead: failure() says why; nothing more completes
  } kind = kNone;
  uint64_t cookie = 0;                 // kSent
  const uint8_t* header = nullptr;     // kHeader: header_bytes, valid until the next poll_recv
  size_t bytes = 0;                    // kPayload: bytes landed (the whole posted piece)
  size_t moved = 0;                    // bytes this call moved on the wire (liveness, rate caps)
};

enum class ConnectState { kPending, kUp, kFailed };

class FrameLink {
 public:
  virtual ~FrameLink() = default;
  // For the caller's poller. Readable (EPOLLIN): some completion may be ready, of either
  // direction or of a pending connect; poll them all. Writable (EPOLLOUT): a send that
  // send_blocked() said waits for the network may move, or a pending connect finished
  // (plain sockets only).
  virtual int wait_fd() const = 0;
  // True when the poller must watch wait_fd for writable too (a plain socket: a pending
  // connect and a blocked send say so that way); false when every event reads as readable
  // (a link served by its own thread, verbs), where watching writable would only spin.
  virtual bool needs_writable_watch() const = 0;
  // A link made by connect() starts pending: kUp once established, kFailed with failure().
  virtual ConnectState finish_connect() = 0;
  // The most bytes one one-sided write (SendPost::write) may carry on this link; 0: it takes none.
  virtual size_t max_write_bytes() const { return 0; }
  // The peer proved itself on this link (the job secret's handshake): from now on its one-sided
  // writes may land in memory this side registered (verbs: the QP gains remote-write access,
  // which it lacks until then, so a stranger that dials gets no write into our memory). Until
  // this is called, a write from the peer fails at the peer.
  virtual void trust_peer() {}

  // Sends. Up to send_slots() posts may be outstanding; each completes, in order, as kSent.
  virtual size_t send_slots() const = 0;
  virtual void post_send(const SendPost& post) = 0;
  // Moves posted sends. `budget`: at most this many bytes onto the wire in this call (a
  // software rate cap; transports that cannot split a send treat any budget as "go").
  virtual LinkCompletion poll_send(size_t budget = SIZE_MAX) = 0;
  // Bytes of the oldest unfinished post already on the wire (0 when none), header included.
  virtual size_t head_sent() const = 0;
  // True while a posted send waits for the network (the poller should watch for writable).
  virtual bool send_blocked() const = 0;
  // The payload of a posted, unfinished send was copied to `payload` (its owner wants the
  // original back): read the rest from the copy. False when the transport cannot (the NIC
  // may still be reading the original); then the original must outlive the send.
  virtual bool move_payload(uint64_t cookie, const void* payload) = 0;

  // Receives: kHeader, then nothing more arrives on this link until the receiver calls
  // accept_header with the payload length that header announces (checked by transports that
  // know a frame's length, such as verbs), then posts space for it piece by piece. A piece
  // with `dst` null is read and dropped. The pieces add up to the payload length.
  virtual LinkCompletion poll_recv() = 0;
  virtual void accept_header(size_t payload_len) = 0;
  virtual void post_recv(void* dst, size_t len, const MemRegion* mr) = 0;
  // The space of the piece posted last is no longer the receiver's (the receive it belonged
  // to was cancelled, its buffer may be freed): drop the rest of that piece instead of
  // landing it. False when the transport cannot (an RDMA READ into it is in flight); then the
  // space must outlive the piece's kPayload.
  virtual bool drop_recv() = 0;
  // After poll_recv found nothing: true when the link has read everything the network had
  // for it (its receive side is idle, so the receiver's acks should go now), false when
  // more is arriving and being read off the caller's thread (a link served by an I/O
  // thread, between pieces). A link whose poll_recv reads the network itself is dry
  // whenever poll_recv finds nothing.
  virtual bool rx_drained() const { return true; }

  // Payload bytes this link copied on the CPU so far: into its own send buffers (tx) and out
  // of its receive buffers into posted space (rx); frame headers are not counted, nor a
  // kernel's copies (a socket's). What a zero-copy path saves: 0 where the NIC reads and
  // writes the posted memory itself.
  struct CopiedBytes {
    uint64_t tx = 0, rx = 0;
  };
  virtual CopiedBytes copied() const { return {}; }

  virtual const LinkFailure& failure() const = 0;
  // Ends traffic in both directions now (the peer sees its link close).
  virtual void shutdown() = 0;
  virtual std::string describe() const = 0;   // "198.18.0.1:40000->198.18.0.2:5000"
};

class FrameListener {
 public:
  virtual ~FrameListener() = default;
  virtual int wait_fd() const = 0;
  virtual NetAddr local_addr() const = 0;
  // Accepts one pending link (already up), or returns null when none is pending.
  virtual std::unique_ptr<FrameLink> accept() = 0;
};

// How links are made. Backends take what applies to them.
struct LinkOptions {
  size_t header_bytes = 64;      // every frame's header (at most kMaxLinkHeaderBytes)
  int buffer_bytes = 0;          // sockets: SO_SNDBUF/SO_RCVBUF when > 0
  int user_timeout_ms = 0;       // sockets: TCP_USER_TIMEOUT when > 0
  bool bind_device = true;       // sockets: SO_BINDTODEVICE when the NIC has an interface name
};
constexpr size_t kMaxLinkHeaderBytes = 256;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Listens on `port` of `nic` (0: any free port). Throws Error(kSystem) naming the NIC.
  virtual std::unique_ptr<FrameListener> listen(const Nic& nic, int port, const LinkOptions& opt) = 0;
  // Starts making a link from `local` to `remote`; finish with FrameLink::finish_connect. A
  // failure known at once (no route) is reported by finish_connect, not thrown.
  virtual std::unique_ptr<FrameLink> connect(const Nic& local, const NetAddr& remote, const LinkOptions& opt) = 0;
  // Memory registration: posts must name a region covering their bytes when this is true.
  // The defaults are a transport's that needs none (sockets; verbs, which copies into its
  // own registered buffers): a region with no keys, and nothing to undo.
  virtual bool needs_registration() const { return false; }
  virtual MemRegion register_memory(const void* base, size_t len) {
    MemRegion m;
    m.base = base;
    m.len = len;
    return m;
  }
  virtual void deregister_memory(const MemRegion&) {}
  // The same through a dma-buf (GPUDirect). Empty from dmabuf_support: every device this
  // transport has open takes dma-buf registrations; else why not (a transport that moves
  // bytes with the CPU never does). register_dmabuf throws Error(kInvalidArgument) with that
  // reason where unsupported, Error(kSystem) naming the device where a registration fails.
  virtual std::string dmabuf_support() const { return "the CPU copies every byte (only an RDMA NIC reads memory itself)"; }
  virtual MemRegion register_dmabuf(const void* base, size_t len, const DmaBuf& buf) {
    (void)base;
    (void)len;
    (void)buf;
    throw_no_dmabuf();
  }
  // The key the peer's one-sided writes into `region` carry when they arrive through `nic`
  // (one of this transport's NICs); 0 when that NIC cannot take them.
  virtual uint32_t remote_key(const MemRegion& region, const Nic& nic) {
    (void)region;
    (void)nic;
    return 0;
  }

 protected:
  [[noreturn]] void throw_no_dmabuf() const;
};

}  // namespace r2ccl
