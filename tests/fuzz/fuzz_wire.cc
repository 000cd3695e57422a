// libFuzzer harness: the frame header parser and the hello codec (core/wire.h), fed a
// stranger's bytes. A header the decoder accepts must obey the limits it was given and come
// back bit for bit when encoded again; a hello decodes and encodes back bit for bit.
// Build and run: tests/test_fuzz.py (or tests/fuzz/README.md).
#include <cstdlib>
#include <cstring>

#include "core/wire.h"
#include "fuzz_check.h"

using namespace r2ccl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const WireLimits lim{size > 0 && (data[0] & 1) ? 4096u : 1u << 20, 1u << 24};
  for (size_t at = 0; at + kHeaderBytes <= size; at += kHeaderBytes) {
    const uint8_t* in = data + at;
    FrameHeader h;
    if (decode_header(in, lim, &h).empty()) {
      CHECK(static_cast<uint8_t>(h.type) >= 1 && static_cast<uint8_t>(h.type) <= 10);
      if (h.type == FrameType::kData) {
        CHECK(h.payload_len <= lim.max_chunk_bytes && h.msg_len <= lim.max_message_bytes);
        CHECK(h.offset <= h.msg_len && h.payload_len <= h.msg_len - h.offset);
      } else {
        CHECK(h.payload_len <= kMaxAckRanges * kAckRangeBytes);
      }
      uint8_t again[kHeaderBytes];
      encode_header(h, again);
      CHECK(std::memcmp(again, in, kHeaderBytes) == 0);
    }
    if (size - at >= kHelloBytes) {
      uint8_t again[kHelloBytes];
      encode_hello(decode_hello(in), again);
      CHECK(std::memcmp(again, in, kHelloBytes) == 0);
    }
  }
  return 0;
}
