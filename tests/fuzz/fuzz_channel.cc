// libFuzzer harness: a channel (core/channel.h) receiving whatever a peer sends on its up
// rails: data chunks, acks, heartbeats, rail-state notices, goodbyes, well formed or not,
// interleaved with the channel's own life (receives and sends posted and cancelled, rails
// failing and coming back, time passing). Frames go through decode_header and the channel's
// on_header / payload / on_frame exactly as the engine hands them over (engine_rail_io.cc).
// Properties: nothing crashes or trips ASan/UBSan; what the channel holds for messages that
// arrived before their receive never exceeds the payload bytes the peer actually sent (no
// allocation on a header's word); a channel that died stays dead.
//
// Inputs whose first byte is 1 are captured streams (capture_corpus.py): the bytes one rail
// of a real job received after its handshake, fed frame by frame to rail 0 of a channel
// with the library's default limits, time passing between frames.
//
// Built twice: fuzz_channel (every frame type) and fuzz_rail_state (R2_FUZZ_RAIL_STATE:
// mostly rail-state notices and heartbeats, with rails failing and coming back between).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/channel.h"
#include "fuzz_check.h"

using namespace r2ccl;

namespace {

constexpr int64_t kMs = 1000000;
constexpr uint64_t kMaxChunk = 512, kMaxMessage = 4096;

struct Io final : RailIo {
  std::vector<bool> kicked;
  void kick(int rail) override { kicked[static_cast<size_t>(rail)] = true; }
  void drop(int rail, bool) override { kicked[static_cast<size_t>(rail)] = false; }
  void redial(int) override {}
  void payload_moved(int) override {}
  void recv_dropped(int) override {}
};

FrameType pick_type(FuzzedDataProvider& in) {
#ifdef R2_FUZZ_RAIL_STATE
  static const FrameType kTypes[] = {FrameType::kRailState, FrameType::kRailState, FrameType::kRailState,
                                     FrameType::kHeartbeat, FrameType::kHeartbeatAck, FrameType::kData, FrameType::kAck};
  return kTypes[in.ConsumeIntegralInRange<size_t>(0, std::size(kTypes) - 1)];
#else
  return static_cast<FrameType>(in.ConsumeIntegralInRange<int>(1, 10));
#endif
}

// A header from the input: fields chosen so that most pass decode_header (the paths behind
// it are the point), now and then raw bytes.
void make_header(FuzzedDataProvider& in, uint8_t hdr[kHeaderBytes], int rails) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    in.ConsumeData(hdr, kHeaderBytes);
    return;
  }
  FrameHeader f;
  f.type = pick_type(in);
  f.flags = in.ConsumeIntegralInRange<uint8_t>(0, kKnownFlags);
  if (f.type != FrameType::kData) f.flags = 0;
  f.seq = in.ConsumeIntegralInRange<uint64_t>(0, 40);
  f.msg_id = in.ConsumeIntegralInRange<uint64_t>(0, 6);
  f.tag = in.ConsumeIntegralInRange<uint64_t>(0, 3);
  f.tag_seq = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  f.msg_len = in.ConsumeIntegralInRange<uint64_t>(0, kMaxMessage);
  f.offset = in.ConsumeIntegralInRange<uint64_t>(0, f.msg_len);
  switch (f.type) {
    case FrameType::kData:
      f.payload_len = (f.flags & kFlagAbort) ? 0
                                             : static_cast<uint32_t>(std::min<uint64_t>(
                                                   f.msg_len - f.offset, in.ConsumeIntegralInRange<uint64_t>(0, kMaxChunk)));
      break;
    case FrameType::kAck:
      f.seq = in.ConsumeIntegralInRange<uint64_t>(1, 4);
      f.payload_len = static_cast<uint32_t>(f.seq * kAckRangeBytes);
      break;
    case FrameType::kHeartbeat:
    case FrameType::kHeartbeatAck: f.payload_len = kHeartbeatBytes; break;
    case FrameType::kRailState: f.payload_len = kRailStateBytes; break;
    case FrameType::kHello: f.payload_len = kHelloBytes; break;
    case FrameType::kChallenge: f.payload_len = kChallengeBytes; break;
    case FrameType::kAuth: f.payload_len = kAuthBytes; break;
    default: f.payload_len = 0;
  }
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) f.payload_len = in.ConsumeIntegral<uint32_t>();
  encode_header(f, hdr);
  (void)rails;
}

// A control payload: for rail-state notices and acks, mostly values near the channel's own
// (rail indices, small sequence ranges), else raw bytes.
std::vector<uint8_t> make_payload(FuzzedDataProvider& in, const FrameHeader& h, int rails) {
  std::vector<uint8_t> p(h.payload_len);
  if (h.type == FrameType::kRailState && in.ConsumeBool()) {
    store_le32(p.data(), in.ConsumeIntegralInRange<uint32_t>(0, static_cast<uint32_t>(rails)));
    store_le32(p.data() + 4, in.ConsumeIntegralInRange<uint32_t>(0, 2));
    return p;
  }
  if (h.type == FrameType::kAck && in.ConsumeBool()) {
    for (size_t i = 0; i + kAckRangeBytes <= p.size(); i += kAckRangeBytes) {
      const uint64_t a = in.ConsumeIntegralInRange<uint64_t>(0, 40);
      store_le64(p.data() + i, a);
      store_le64(p.data() + i + 8, a + in.ConsumeIntegralInRange<uint64_t>(0, 8));
    }
    return p;
  }
  std::vector<uint8_t> b = in.ConsumeBytes<uint8_t>(p.size());
  std::copy(b.begin(), b.end(), p.begin());
  return p;
}

void captured_stream(const uint8_t* p, const uint8_t* end) {
  ChannelSettings set;   // the defaults
  set.crc = true;
  const WireLimits lim{8u << 20, 1u << 30};
  struct : RailIo {
    void kick(int) override {}
    void drop(int, bool) override {}
    void redial(int) override {}
    void payload_moved(int) override {}
    void recv_dropped(int) override {}
  } io;
  int64_t now = 1000 * kMs;
  ChannelCore core(1, "rank 1", {"rail 0", "rail 1"}, {{0, 0}, {1, 1}}, set, &io, now);
  core.rail_up(0, now);
  core.rail_up(1, now);
  Rail& rl = *core.ch.rails[0];
  uint64_t fed = 0;
  for (int frames = 0; frames < 256 && rl.state == RailState::kUp; frames++) {
    if (end - p < static_cast<ptrdiff_t>(kHeaderBytes)) break;
    std::memcpy(rl.rx.hdr, p, kHeaderBytes);
    p += kHeaderBytes;
    rl.rx.hdr_got = kHeaderBytes;
    std::string bad = decode_header(rl.rx.hdr, lim, &rl.rx.h);
    if (!bad.empty()) {
      core.fail_rail(0, FailReason::kProtocol, "protocol error: " + bad, now);
      break;
    }
    if (!core.on_header(0, now)) break;
    RxFrame& rx = rl.rx;
    if (rx.in_payload) {
      const size_t n = rx.h.payload_len;
      if (static_cast<size_t>(end - p) < n) break;   // the capture ends inside this frame
      if (n > 0 && !rx.scratch) {
        if (rx.grow) {
          rx.grow->resize(n);
          std::memcpy(rx.grow->data(), p, n);
        } else if (rx.dest) {
          std::memcpy(rx.dest, p, n);
        }
      }
      p += n;
      fed += n;
      rx.got = n;
      core.on_frame(0, now);
      if (rl.state == RailState::kUp) rl.rx.reset();
    }
    CHECK(core.staged_bytes() <= fed);
    now += kMs;
    if (frames % 8 == 7) core.tick(now, {kMs, kMs});
  }
  core.kill(Cause::kClosed, "the harness is done");
}

}  // namespace

// The channel logs every rail it fails (a warning): thousands a second here. Errors only.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log_set_level(static_cast<int>(LogLevel::kError));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 1) return captured_stream(data + 1, data + size), 0;
  FuzzedDataProvider in(data, size);
  const int rails = in.ConsumeIntegralInRange<int>(1, 4);
  ChannelSettings set;
  set.crc = in.ConsumeBool();
  set.stall_ns = 200 * kMs;
  set.heartbeat_ns = 100 * kMs;
  set.timeout_ns = 2000 * kMs;
  set.pace.min_chunk = 64;
  set.pace.max_chunk = kMaxChunk;
  set.pace.min_window = 128;
  set.pace.max_window = 4096;
  set.eager_bytes = in.ConsumeBool() ? 256 : 0;
  set.lazy_ack_bytes = 64;
  set.read_pass_bytes = 1024;
  const WireLimits lim{kMaxChunk, kMaxMessage};
  std::vector<std::pair<int, int>> pairs;
  std::vector<std::string> names;
  for (int r = 0; r < rails; r++) pairs.push_back({r, r}), names.push_back("rail " + std::to_string(r));
  Io io;
  io.kicked.assign(static_cast<size_t>(rails), false);
  int64_t now = 1000 * kMs;
  ChannelCore core(1, "rank 1", names, pairs, set, &io, now);
  for (int r = 0; r < rails; r++) core.rail_up(r, now);

  std::vector<std::vector<uint8_t>> buffers;
  std::vector<std::shared_ptr<Request>> reqs;
  uint64_t payload_fed = 0;
  const std::vector<int64_t> drains(static_cast<size_t>(rails), 5 * kMs);

  auto flush = [&] {
    // The transport writes every kicked rail's frames (bounded: the channel may queue more).
    for (int pass = 0; pass < 64; pass++) {
      bool any = false;
      for (int r = 0; r < rails; r++) {
        if (!io.kicked[static_cast<size_t>(r)]) continue;
        io.kicked[static_cast<size_t>(r)] = false;
        Rail& rl = *core.ch.rails[static_cast<size_t>(r)];
        if (rl.state == RailState::kUp && rl.cur.active) {
          core.frame_written(r, now);
          any = true;
          if (rl.cur.active) io.kicked[static_cast<size_t>(r)] = true;
        }
      }
      if (!any) break;
    }
  };

  for (int step = 0; step < 256 && in.remaining_bytes() > 0; step++) {
    const bool was_dead = core.ch.dead;
    const int r = in.ConsumeIntegralInRange<int>(0, rails - 1);
    Rail& rl = *core.ch.rails[static_cast<size_t>(r)];
    switch (in.ConsumeIntegralInRange<int>(0, 11)) {
      default: {   // a frame from the peer on rail r
        if (rl.state != RailState::kUp) break;
        make_header(in, rl.rx.hdr, rails);
        rl.rx.hdr_got = kHeaderBytes;
        std::string bad = decode_header(rl.rx.hdr, lim, &rl.rx.h);
        if (!bad.empty()) {
          core.fail_rail(r, FailReason::kProtocol, "protocol error: " + bad, now);
          break;
        }
        if (!core.on_header(r, now)) break;
        RxFrame& rx = rl.rx;
        if (!rx.in_payload) break;   // on_header took the whole frame (no payload to read)
        const std::vector<uint8_t> p = make_payload(in, rx.h, rails);
        payload_fed += p.size();
        if (!p.empty() && !rx.scratch) {
          if (rx.grow) {
            rx.grow->resize(p.size());
            std::memcpy(rx.grow->data(), p.data(), p.size());
          } else if (rx.dest) {
            std::memcpy(rx.dest, p.data(), p.size());
          }
        }
        rx.got = p.size();
        core.on_frame(r, now);
        if (rl.state == RailState::kUp) rl.rx.reset();
        if (rl.state == RailState::kUp && in.ConsumeBool()) core.rx_pass_end(r, now, in.ConsumeBool());
        break;
      }
      case 0: {   // a receive posted
        const uint64_t n = in.ConsumeIntegralInRange<uint64_t>(0, kMaxMessage);
        buffers.emplace_back(n);
        auto q = std::make_shared<Request>(Request::kRecv, 1, in.ConsumeIntegralInRange<uint64_t>(0, 3),
                                           buffers.back().data(), n);
        reqs.push_back(q);
        core.submit(q, now);
        break;
      }
      case 1: {   // a send posted
        const uint64_t n = in.ConsumeIntegralInRange<uint64_t>(0, kMaxMessage);
        buffers.emplace_back(n, static_cast<uint8_t>(step));
        auto q = std::make_shared<Request>(Request::kSend, 1, in.ConsumeIntegralInRange<uint64_t>(0, 3),
                                           buffers.back().data(), n);
        reqs.push_back(q);
        core.submit(q, now);
        break;
      }
      case 2:   // a request cancelled
        if (!reqs.empty()) {
          auto& q = reqs[in.ConsumeIntegralInRange<size_t>(0, reqs.size() - 1)];
          if (!q->finished()) core.cancel(q, Cause::kTimeout, "cancelled by the harness", now);
        }
        break;
      case 3:   // time passes
        now += in.ConsumeIntegralInRange<int64_t>(0, 400) * kMs;
        core.tick(now, drains);
        break;
      case 4:   // the rail fails (its NIC, the peer's end, a reset)
        core.fail_rail(r, static_cast<FailReason>(in.ConsumeIntegralInRange<int>(0, 9)), "harness", now);
        break;
      case 5:   // the rail comes back (a new connection)
        if (rl.state != RailState::kUp && !core.ch.dead) core.rail_up(r, now);
        break;
      case 6:
        core.send_rail_state(r, in.ConsumeBool(), now);
        break;
      case 7:
        core.set_weight(r, in.ConsumeFloatingPointInRange<double>(0.0, 1.0), now);
        break;
      case 8:
        core.request_acks(now);
        break;
    }
    core.pump(now);
    flush();
    if (was_dead) CHECK(core.ch.dead);
    CHECK(core.staged_bytes() <= payload_fed);
  }
  if (in.ConsumeBool()) core.goodbye();
  flush();
  core.kill(Cause::kClosed, "the harness is done");
  for (auto& q : reqs) CHECK(q->finished());
  return 0;
}
