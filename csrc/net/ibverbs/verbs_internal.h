// The verbs backend's private declarations, shared by its files (cut by lifecycle, as NCCL's
// net_ib is): verbs_device.cc, verbs_connect.cc, verbs_link.cc, verbs_reg.cc, verbs_fail.cc.
// Only with R2CCL_HAVE_IBVERBS (needs <infiniband/verbs.h>); the project sees verbs_transport.h.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "net/ibverbs/boot_record.h"
#include "net/ibverbs/verbs_api.h"
#include "net/ibverbs/verbs_transport.h"
#include "net/tcp/stream.h"
#include "net/transport.h"

namespace r2ccl::verbs {

// ---------------------------------------------------------------- the link's own format

// Every SEND starts with this prefix: kind (u8), flags (u8), credits (u16: the data buffers
// its sender has reposted so far, mod 2^16), length (u32: on a frame's first segment, the
// frame's payload length; else 0). Little-endian.
constexpr size_t kPrefix = 8;
enum Kind : uint8_t { kData = 1, kCredit = 2 };
constexpr uint8_t kFirst = 1;   // the segment starts a frame (its header comes first)
constexpr uint8_t kOut = 2;     // the sender spent its last credit: return credits at once
// Receive buffers beyond the data credits, for credit-only messages (reposted at once, owed
// to nobody), and the most credit-only messages one side has in flight.
constexpr uint32_t kCtrlBuffers = 4;
constexpr size_t kCtrlSlotBytes = 64;
constexpr uint64_t kCtrlTag = 1ull << 32;     // wr_id of a credit-only SEND: kCtrlTag | slot
constexpr uint64_t kWriteTag = 1ull << 33;    // wr_id of a one-sided WRITE: kWriteTag | its post's cookie (low 32 bits)

static_assert(IBV_MTU_256 == kBootMtuMin && IBV_MTU_4096 == kBootMtuMax, "boot_record.h's MTU range is ibv_mtu's");

// ---------------------------------------------------------------- devices (verbs_device.cc)

// One opened device: context, protection domain, the state of its ports as the async
// events tell it, and the links to wake when they change. Shared by the transport and its
// links (a link keeps its device open).
struct Device {
  const VerbsApi* api = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  std::string name;
  ibv_device_attr attr{};
  // Empty: the device takes dma-buf registrations (GPUDirect without nvidia_peermem); else
  // why not. Probed once at open, as NCCL's net_ib does: ibv_reg_dmabuf_mr with no buffer
  // (fd -1) fails with EOPNOTSUPP or EPROTONOSUPPORT where the driver has no dma-buf support,
  // with EBADF where it has.
  std::string dmabuf_why;

  std::mutex mu;
  std::map<int, bool> port_active;          // by port number, as last seen
  std::map<int, std::string> port_why;      // why a port is down (the event or state seen)
  std::set<uint32_t> dead_qps;              // QPs an async event declared in error
  std::map<int, int> watchers;              // eventfd -> port: links to wake on a change

  // Memory registered for one-sided writes (verbs_reg.cc), by the transport's region handle.
  std::mutex mr_mu;
  std::map<uint64_t, ibv_mr*> mrs;
  bool keys_of(uint64_t handle, uint32_t* lkey, uint32_t* rkey);

  ~Device();

  // Releases a dead link's verbs resources on the device's own thread, not the caller's.
  // Destroying a QP can block in the kernel: Soft-RoCE (Debian's 6.1 kernel) took 3.1 s for
  // a QP whose port had just gone down, and the link dies on the progress thread, which
  // carries every other rail: that froze the job's surviving rails for 3 s, and the peer
  // failed them as silent. The thread starts at the first retire(); the destructor waits
  // for it. If it cannot start, the job runs here, as before.
  void retire(std::function<void()> job);

 private:
  std::mutex reap_mu;
  std::condition_variable reap_cv;
  std::deque<std::function<void()>> reap_jobs;
  bool reap_stop = false;
  std::thread reaper;

  void reap();

 public:
  bool query_active(int port, std::string* why);

  // Takes every async event waiting on the device's fd (nonblocking) into the port and QP
  // state, waking the links concerned. Any thread; cheap when nothing waits.
  void pump();

  // "" while the port is usable; else why not.
  std::string port_down(int port);
  bool qp_dead(uint32_t qpn);
  void watch(int fd, int port);
  void unwatch(int fd);
};

// Where a link's NIC is served: a device, a port and a GID index.
struct PortRef {
  std::shared_ptr<Device> dev;
  int port = 0;
  int gid_index = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  bool roce = true;
  uint32_t max_msg = 0;   // the port's largest message (a one-sided write's limit)
};

// The registry of devices: one opened Device per RDMA device, one PortRef per NIC.
// What a caller's registered memory allows (Devices::register_region): WRITEs from it (local
// access) and into it (remote write, through the keys its receives advertise).
inline constexpr int kRegionAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

// Device::dmabuf_why for the device `name` through one of its protection domains
// (verbs_device.cc).
std::string probe_dmabuf(const VerbsApi& api, ibv_pd* pd, const std::string& name);

class Devices {
 public:
  explicit Devices(const VerbsApi* api) : api_(api) {}

  // The device, port and GID serving `nic`; throws Error(kSystem) naming the NIC. The sysfs
  // map is read once per NIC and kept: a NIC's rails are re-dialled every R2CCL_REPROBE_MS
  // while its port is down, and a scan of the GID tables costs tens of ms under emulation.
  // Whether the port is up comes from the port events and ibv_query_port, not from the map.
  PortRef port_for(const Nic& nic, const VerbsOptions& opt);
  // Every device opened so far (one per RDMA device serving a NIC the transport listened on).
  std::vector<std::shared_ptr<Device>> all();

  // Registration (verbs_reg.cc). A caller's memory registered for one-sided writes with every
  // device open now and every one opened later (a NIC's device opens at its first rail, which
  // may come after the memory was registered), under `handle` (the transport's number for
  // it): local read for WRITEs from it, remote write for WRITEs into it. Throws Error(kSystem)
  // naming the device (what was registered is undone). On a device opened later a refusal
  // is logged, and that device's NIC carries the region's chunks in frames.
  // `buf`: the region is a dma-buf's (ibv_reg_dmabuf_mr at the region's address; the list
  // keeps a dup of its fd for devices opened later). Throws Error(kInvalidArgument) with the
  // reason where an open device takes no dma-buf.
  void register_region(const void* base, size_t len, uint64_t handle, const DmaBuf* buf = nullptr);
  void deregister_region(uint64_t handle);
  // Transport::dmabuf_support over the devices open now.
  std::string dmabuf_support();

 private:
  std::shared_ptr<Device> open(const std::string& name);
  std::shared_ptr<Device> open_locked(const std::string& name);
  void deregister_locked(uint64_t handle);
  std::string dmabuf_why_locked() const;

  const VerbsApi* api_;
  std::mutex mu_;
  struct Region {
    const void* base;
    size_t len;
    int fd = -1;            // a dma-buf's (our dup; closed at deregistration), or -1
    uint64_t offset = 0;
  };
  // Registers `r` on `d` (ibv_reg_mr or ibv_reg_dmabuf_mr); null with errno set on failure.
  ibv_mr* reg_on(Device& d, const Region& r);
  std::map<uint64_t, Region> regions_;   // registered, by handle: for devices opened later
  std::map<std::string, std::shared_ptr<Device>> open_;
  std::map<std::string, PortRef> by_nic_;   // by the NIC's IPv4 address
};

// ---------------------------------------------------------------- the link

// One RC queue pair and its bounce buffers behind the FrameLink seam. Its members are defined
// by lifecycle stage: set-up in verbs_connect.cc, the bounce buffers' registration in
// verbs_reg.cc, the data path in verbs_link.cc, failure and teardown in verbs_fail.cc.
class VerbsLink final : public FrameLink {
 public:
  // ---- control path: set-up (verbs_connect.cc)

  // A connector (its bootstrap socket is connecting) or an accepted link (its socket is
  // connected and the connector's record is in `peer`, already checked).
  VerbsLink(PortRef at, const VerbsOptions& opt, size_t header_bytes, std::unique_ptr<tcp::StreamSocket> boot,
            bool connector);
  // The accepting side: our record for the connector (our QP moved to RTS against theirs).
  bool accept_record(const BootRecord& peer, BootRecord* ours);
  void set_up() { phase_ = Phase::kUp; }
  ConnectState finish_connect() override;
  size_t max_write_bytes() const override { return at_.max_msg; }
  void trust_peer() override;

  // ---- control path: failure and teardown (verbs_fail.cc)
  ~VerbsLink() override;
  const LinkFailure& failure() const override { return failure_; }
  void shutdown() override;
  std::string describe() const override { return desc_; }

  // ---- data path (verbs_link.cc)
  int wait_fd() const override { return epfd_; }
  bool needs_writable_watch() const override { return false; }
  size_t send_slots() const override { return kSendSlots; }
  void post_send(const SendPost& p) override;
  LinkCompletion poll_send(size_t budget) override;
  size_t head_sent() const override { return posts_.empty() ? 0 : posts_.front().off; }
  bool send_blocked() const override { return false; }
  bool move_payload(uint64_t cookie, const void* payload) override;
  LinkCompletion poll_recv() override;
  void accept_header(size_t payload_len) override;
  void post_recv(void* dst, size_t len, const MemRegion*) override;
  bool drop_recv() override;
  CopiedBytes copied() const override { return copied_; }

 private:
  enum class Phase { kSetup, kConnecting, kAwaitRecord, kUp };
  enum class Rx { kHeader, kAwaitAccept, kAwaitPost, kPiece };
  static constexpr size_t kSendSlots = 4;
  static constexpr uint8_t kReady = 'R';
  struct Post {
    uint8_t hdr[kMaxLinkHeaderBytes];
    const uint8_t* payload = nullptr;
    size_t len = 0;   // payload bytes the frame carries (0 for a write: its payload goes by WRITE)
    size_t off = 0;   // header and payload bytes segmented
    uint64_t cookie = 0;
    // A one-sided write (SendPost::write): `wlen` bytes from `payload` (lkey) to the peer's
    // raddr (rkey), posted before the header; the post is kSent once the WRITE completed.
    size_t wlen = 0;
    uint64_t raddr = 0;
    uint32_t rkey = 0, lkey = 0;
    bool write_posted = false, write_done = true;
  };
  struct Seg {
    uint32_t buf = 0;        // receive buffer index
    uint32_t len = 0;        // bytes after the prefix
    uint8_t flags = 0;
    uint32_t frame_len = 0;  // kFirst: the frame's payload length
  };

  uint8_t* buf(uint32_t i) const { return mem_ + size_t{i} * buf_bytes_; }   // send: [0, n_send_), receive after
  uint8_t* ctrl_slot(uint32_t i) const { return mem_ + size_t{n_send_ + n_recv_} * buf_bytes_ + i * kCtrlSlotBytes; }

  // ---- set-up (verbs_connect.cc)
  void watch(int fd, uint32_t events);
  void epoll_ctl_mod(int fd, uint32_t events);
  // CQs on one completion channel, the RC QP in INIT, the bounce buffers registered and every
  // receive posted (so the peer may SEND the moment our record reaches it).
  bool make_qp();
  BootRecord my_record() const;
  // RTR against the peer's record, then RTS.
  bool connect_qp(const BootRecord& peer);

  // ---- registration (verbs_reg.cc)
  // The bounce buffers (send, receive, then the credit-only slots) allocated and registered.
  bool register_buffers();

  // ---- data path (verbs_link.cc)
  bool post_receive(uint32_t b);
  bool post_send_wr(uint64_t wr_id, uint8_t* addr, size_t len);
  bool post_write_wr(Post& p);
  void write_prefix(uint8_t* p, Kind kind, uint8_t flags, uint32_t len) const;
  // Segments the posts in order while credits, bounce buffers and `budget` last.
  size_t pump_data(size_t budget);
  // A credit-only message when half the credits are owed, or any are and the peer ran out.
  void return_credits();
  void repost(const Seg& s);
  void release_cur();
  bool rx_deliverable() const;
  // The eventfd in our epoll set is readable exactly while a poll would hand something out.
  void update_ready();
  // Async events, completions, and the bootstrap socket, into the link's state.
  void progress();
  void drain(ibv_cq* cq);
  void absorb(const ibv_wc& wc);

  // ---- failure (verbs_fail.cc)
  // The port down or the QP put in error, as the device's async events said.
  void check_device();
  // EOF (the peer is gone) or stray bytes on the bootstrap socket of a link that is up.
  void check_bootstrap();
  // A failed work completion: IBV_WC_RETRY_EXC_ERR is kTimedOut, the rest kIo.
  void fail_wc(const ibv_wc& wc);
  bool sys_fail(const std::string& what, int e = 0);
  bool failed() const { return failure_.error != LinkError::kNone; }
  void fail(LinkError e, int err, std::string detail);
  void misuse(const char* what) { fail(LinkError::kIo, 0, std::string("transport misuse: ") + what); }
  static LinkCompletion failed_completion(size_t moved = 0) {
    LinkCompletion c;
    c.kind = LinkCompletion::kFailed;
    c.moved = moved;
    return c;
  }

  // ---- control-path state: the link's identity and its set-up
  PortRef at_;
  const VerbsApi* api_;
  VerbsOptions opt_;
  size_t hb_;
  std::unique_ptr<tcp::StreamSocket> boot_;
  bool connector_;
  std::string desc_;
  LinkFailure failure_;
  Phase phase_ = Phase::kSetup;
  int64_t deadline_ns_ = 0;
  uint8_t boot_in_[kBootBytes] = {};
  size_t boot_got_ = 0;
  bool closing_ = false;   // the bootstrap socket ended: what arrived is still handed out

  // ---- verbs resources (made at set-up, released by the destructor on the device's thread)
  int epfd_ = -1, ready_fd_ = -1;
  bool ready_set_ = false;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq *scq_ = nullptr, *rcq_ = nullptr;
  unsigned scq_events_ = 0, rcq_events_ = 0;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  uint8_t* mem_ = nullptr;
  uint32_t psn_ = 0;
  uint32_t capacity_ = 0, seg_capacity_ = 0;
  size_t buf_bytes_ = 0;
  uint32_t n_send_ = 0, n_recv_ = 0;

  // ---- data-path state
  // send
  std::deque<Post> posts_;
  std::vector<uint32_t> free_send_, free_ctrl_;
  std::deque<uint64_t> inflight_;   // wr_ids of the SENDs in flight, in post order
  uint32_t credits_ = 0, peer_credits_ = 0;
  uint16_t peer_cum_ = 0;            // the peer's reposted count, as last seen
  // receive
  std::deque<Seg> arrived_;
  Seg cur_;
  bool have_cur_ = false;
  size_t cur_off_ = 0;
  Rx rs_ = Rx::kHeader;
  size_t frame_left_ = 0;
  uint8_t* piece_dst_ = nullptr;
  size_t piece_len_ = 0, piece_got_ = 0;
  uint16_t reposted_ = 0, returned_ = 0;   // data buffers reposted; the count our last SEND carried
  bool peer_out_ = false;
  CopiedBytes copied_;   // payload bytes through the bounce buffers (copied())
};

// ---------------------------------------------------------------- set-up (verbs_connect.cc)

// A listener on `nic`'s address for links at `at`: it runs the setup exchange of each dialler
// and hands out the links that finished it.
std::unique_ptr<FrameListener> listen_verbs(PortRef at, const Nic& nic, int port, const LinkOptions& lopt,
                                            const VerbsOptions& vopt);
// A link at `at` dialled from `local` to `remote`; its setup runs in finish_connect.
std::unique_ptr<FrameLink> connect_verbs(PortRef at, const Nic& local, const NetAddr& remote,
                                         const LinkOptions& lopt, const VerbsOptions& vopt);

}  // namespace r2ccl::verbs
