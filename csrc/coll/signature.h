// A collective's signature: what one process believes the call is (kind, dtype, op, plan,
// algorithm, count, root, group) and which instance it is. Every process sends its own to its peers
// before (or in front of) the data, and a difference fails the call on every process with
// both versions named. The bytes come from the network: decoding takes any 48 bytes, and
// describing an unknown value says so. Knows nothing of sockets, rails or JAX.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "coll/plan.h"
#include "coll/reduce.h"

namespace r2ccl::coll {

enum class Kind : int;

// Words: 0 kind | dtype << 8 | op << 16 | plan << 24 | algorithm << 32; 1 count; 2 root; 3 group hash (the
// compared part); 4 kSigMagic; 5 the collective's tag (which instance: an announcement a
// peer left in staging names the collective it is in).
using Sig = std::array<uint64_t, 6>;
inline constexpr uint64_t kSigBytes = 48;
inline constexpr uint64_t kSigMagic = 0x5347495343435232ull;   // "2RCCSIGS"
// A signature message: the signature, then a capacity (a double: the sender's bandwidth in
// healthy-NIC units, read by a planned all-reduce).
inline constexpr uint64_t kSigMessageBytes = kSigBytes + sizeof(double);

// `perm` (permute's destinations) and `shape` (ragged_all_to_all's output size, row and slice
// counts) are folded into the group hash.
Sig make_signature(Kind kind, DType dtype, ReduceOp op, PlanKind plan, AlgoKind algo, uint64_t count, int root,
                   const std::vector<int>& process_of_rank, uint64_t tag, const std::vector<int>& perm = {},
                   const std::vector<uint64_t>& shape = {});
// The same call (words 0-3 equal); words 4 and 5 say which instance, not what it is.
inline bool same_call(const Sig& a, const Sig& b) { return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]; }
// An announcement: a signature message (magic in word 4), of collective `tag`.
inline bool is_announcement(const Sig& s) { return s[4] == kSigMagic; }
// "all_reduce of 1024 float32 (sum, root 0, plan balance, algorithm ring)", or "an unknown collective".
std::string describe_signature(const Sig& s);

void encode_signature(const Sig& s, uint8_t out[kSigBytes]);
Sig decode_signature(const uint8_t in[kSigBytes]);
// A peer's capacity as a planned all-reduce may use it: a finite value >= 0 (anything else,
// a NaN, an infinity or a negative number, counts as no capacity).
double decode_capacity(const uint8_t in[sizeof(double)]);

}  // namespace r2ccl::coll
