// The verbs backend's registry entry (verbs_backend.h): its options from the config, and
// which NICs it serves (one scan of the RDMA ports for all of them).
#include "net/ibverbs/verbs_backend.h"

#include "net/ibverbs/rdma_ports.h"
#include "net/ibverbs/verbs_transport.h"

namespace r2ccl {

namespace {
VerbsOptions options_of(const Config& cfg) {
  VerbsOptions vo;
  vo.gid_index = cfg.ib_gid_index;
  vo.timeout = cfg.ib_timeout;
  vo.retry_count = cfg.ib_retry_count;
  vo.bootstrap_timeout_ms = cfg.connect_timeout_ms;
  return vo;
}
}  // namespace

const TransportBackend& verbs_backend() {
  static const TransportBackend b{
      "ibverbs", "ibverbs", 1,
      [](const std::vector<Nic>& nics, const Config& cfg) {
        const VerbsOptions vo = options_of(cfg);
        const std::vector<RdmaPort> ports = rdma_ports();
        std::vector<std::string> why(nics.size());
        for (size_t i = 0; i < nics.size(); i++)
          if (!verbs_serves(nics[i], vo, ports, &why[i]) && why[i].empty()) why[i] = "no ACTIVE RDMA port";
        return why;
      },
      [](const Config& cfg, size_t) { return make_verbs_transport(options_of(cfg)); }};
  return b;
}

}  // namespace r2ccl
