// The job's identity (core/identity.h): ranks, the dialling rule and the job secret.
#include "core/identity.h"

#include "core/digest.h"
#include "core/wire.h"

namespace r2ccl {

uint64_t JobIdentity::job_id_of(const std::string& secret) {
  auto id = sha256(secret.data(), secret.size());
  return load_le64(id.data());
}

std::string JobIdentity::check_peer(int peer) const {
  if (peer < 0 || peer >= world_ || peer == rank_)
    return "peer rank " + std::to_string(peer) + " is invalid for rank " + std::to_string(rank_) + " of " +
           std::to_string(world_);
  return {};
}

std::string JobIdentity::accept_hello(const HelloIds& h, int* peer, const std::string** key, int* add_with_nics) {
  *add_with_nics = 0;   // a rank not added yet is parked: bootstrap adds every peer
  if (h.domain != job_id_) return "hello from another job (job id mismatch)";
  if (h.to != static_cast<uint32_t>(rank_)) return "hello meant for rank " + std::to_string(h.to);
  // The higher rank dials the lower: a hello from a rank at or below ours is not the protocol.
  if (h.from >= static_cast<uint32_t>(world_) || h.from <= static_cast<uint32_t>(rank_))
    return "hello from invalid rank " + std::to_string(h.from);
  *peer = static_cast<int>(h.from);
  *key = &secret_;
  return {};
}

}  // namespace r2ccl
