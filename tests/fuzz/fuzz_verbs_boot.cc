// libFuzzer harness: the verbs link's setup record (net/ibverbs/boot_record.h), read before
// the peer has proven anything. An accepted record's every field is within the bounds a
// later step sizes buffers by, and it encodes back to the same bytes (reserved bytes aside).
#include <cstdlib>
#include <cstring>

#include "net/ibverbs/boot_record.h"
#include "fuzz_check.h"

using namespace r2ccl::verbs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kBootBytes) return 0;
  BootRecord r;
  if (!decode_boot(data, &r).empty()) return 0;
  CHECK(r.mtu >= kBootMtuMin && r.mtu <= kBootMtuMax);
  CHECK(r.credits >= 1 && r.credits <= kBootMaxCredits);
  CHECK(r.capacity >= r.header_bytes && r.capacity <= kBootMaxCapacity);
  uint8_t again[kBootBytes];
  encode_boot(r, again);
  uint8_t in[kBootBytes];
  std::memcpy(in, data, kBootBytes);
  for (size_t i : {6, 7, 18, 19}) in[i] = 0;   // reserved
  std::memset(in + 56, 0, 8);
  CHECK(std::memcmp(again, in, kBootBytes) == 0);
  return 0;
}
