// libFuzzer harness: the signature and plan messages (coll/signature.h, coll/plan.h). A
// peer's signature (48 bytes) is described and compared; its capacities (doubles, any bits)
// feed the plan every process computes: the shares must be finite, non-negative and sum to
// one, and the owners' segments must tile [0, n) in order, whatever a peer sent.
// Inputs whose first byte is 1 start with a captured signature message (capture_corpus.py:
// the signature and the sender's capacity, as a peer sent them); the rest as below.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "coll/plan.h"
#include "coll/signature.h"
#include "fuzz_check.h"

using namespace r2ccl::coll;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool captured = size >= 1 + kSigMessageBytes && data[0] == 1;
  const uint8_t* message = data + 1;
  FuzzedDataProvider in(captured ? data + 1 + kSigMessageBytes : data, captured ? size - 1 - kSigMessageBytes : size);
  uint8_t sig_bytes[kSigBytes] = {};
  if (captured) std::memcpy(sig_bytes, message, kSigBytes);
  else in.ConsumeData(sig_bytes, kSigBytes);
  const Sig s = decode_signature(sig_bytes);
  const std::string d = describe_signature(s);
  CHECK(!d.empty() && d.size() < 200);
  CHECK(same_call(s, s));
  uint8_t again[kSigBytes];
  encode_signature(s, again);
  CHECK(std::memcmp(again, sig_bytes, kSigBytes) == 0);

  const size_t P = in.ConsumeIntegralInRange<size_t>(1, 16);
  std::vector<double> caps;
  for (size_t i = 0; i < P; i++) {
    uint8_t b[sizeof(double)] = {};
    if (captured && i == 0) std::memcpy(b, message + kSigBytes, sizeof b);
    else in.ConsumeData(b, sizeof b);
    const double c = decode_capacity(b);
    CHECK(std::isfinite(c) && c >= 0);
    caps.push_back(c);
  }
  const uint64_t n = in.ConsumeIntegral<uint64_t>() >> in.ConsumeIntegralInRange<int>(0, 63);
  const double bytes = static_cast<double>(n) * 4;
  const auto want = static_cast<PlanKind>(in.ConsumeIntegralInRange<int>(0, static_cast<int>(PlanKind::kOptimal)));
  PlanChoice pc = choose_plan(want, caps, bytes, 1.0, in.ConsumeProbability<double>() * 1e-3);
  CHECK(pc.kind != PlanKind::kAuto && pc.shares.size() == P);
  double sum = 0;
  for (double x : pc.shares) {
    CHECK(std::isfinite(x) && x >= 0);
    sum += x;
  }
  CHECK(std::fabs(sum - 1.0) < 1e-6);
  const std::vector<uint64_t> b = share_boundaries(pc.shares, n);
  CHECK(b.size() == P + 1 && b[0] == 0 && b[P] == n);
  for (size_t i = 0; i < P; i++) CHECK(b[i] <= b[i + 1]);
  for (int k = 0; k <= static_cast<int>(PlanKind::kOptimal); k++) {
    std::vector<double> sh = plan_shares(static_cast<PlanKind>(k), caps);
    CHECK(sh.size() == P);
    for (double x : sh) CHECK(std::isfinite(x) && x >= 0);
  }
  return 0;
}
