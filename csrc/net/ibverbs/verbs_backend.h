// The verbs backend as the registry sees it (net/registry.h): the NICs with an ACTIVE RDMA
// port, served by RC queue pairs (verbs_transport.h); published as "ibverbs:IP:PORT".
#pragma once
#include "net/registry.h"

namespace r2ccl {

const TransportBackend& verbs_backend();

}  // namespace r2ccl
