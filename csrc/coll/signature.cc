#include "coll/signature.h"

#include <cmath>
#include <cstring>

#include "coll/collectives.h"

namespace r2ccl::coll {

Sig make_signature(Kind kind, DType dtype, ReduceOp op, PlanKind plan, AlgoKind algo, uint64_t count, int root,
                   const std::vector<int>& process_of_rank, uint64_t tag, const std::vector<int>& perm,
                   const std::vector<uint64_t>& shape) {
  uint64_t group_hash = 0xCBF29CE484222325ull;
  for (int p : process_of_rank) group_hash = (group_hash ^ static_cast<uint64_t>(p)) * 0x100000001B3ull;
  for (int d : perm) group_hash = (group_hash ^ static_cast<uint64_t>(static_cast<int64_t>(d) + 2)) * 0x100000001B3ull;
  for (uint64_t v : shape) group_hash = (group_hash ^ (v + 0x5A)) * 0x100000001B3ull;
  const uint64_t pl = kind == Kind::kAllReduce ? static_cast<uint64_t>(plan) : 0;
  return {static_cast<uint64_t>(kind) | static_cast<uint64_t>(dtype) << 8 | static_cast<uint64_t>(op) << 16 | pl << 24 |
              static_cast<uint64_t>(algo) << 32,
          count, static_cast<uint64_t>(root), group_hash, kSigMagic, tag};
}

std::string describe_signature(const Sig& s) {
  const uint64_t k = s[0] & 0xff, d = (s[0] >> 8) & 0xff, o = (s[0] >> 16) & 0xff, p = (s[0] >> 24) & 0xff,
                 a = (s[0] >> 32) & 0xff;
  if (k >= std::size(kKindNames) || d >= std::size(kDTypeNames) || o >= std::size(kReduceOpNames) ||
      p >= std::size(kPlanNames) || a >= std::size(kAlgoNames) || (s[0] >> 40) != 0)
    return "an unknown collective";
  const auto kind = static_cast<Kind>(k);
  return std::string(kKindNames[k]) + " of " + std::to_string(s[1]) + " " + dtype_name(static_cast<DType>(d)) + " (" +
         reduce_op_name(static_cast<ReduceOp>(o)) + ", root " + std::to_string(static_cast<int64_t>(s[2])) +
         (kind == Kind::kAllReduce ? std::string(", plan ") + plan_name(static_cast<PlanKind>(p)) : std::string()) +
         ", algorithm " + algo_name(static_cast<AlgoKind>(a)) + ")";
}

void encode_signature(const Sig& s, uint8_t out[kSigBytes]) { std::memcpy(out, s.data(), kSigBytes); }

Sig decode_signature(const uint8_t in[kSigBytes]) {
  Sig s;
  std::memcpy(s.data(), in, kSigBytes);
  return s;
}

double decode_capacity(const uint8_t in[sizeof(double)]) {
  double c;
  std::memcpy(&c, in, sizeof(double));
  return std::isfinite(c) && c > 0 ? c : 0.0;
}

}  // namespace r2ccl::coll
