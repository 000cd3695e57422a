"""Point-to-point transfer over every NIC of two hosts, as a user would write it.

Run one process per host (the usual jax.distributed start):
    R2CCL_NICS=eth1,eth2,eth3,eth4 python examples/p2p_transfer.py HOST0:5000 2 0   # on host 0
    R2CCL_NICS=eth1,eth2,eth3,eth4 python examples/p2p_transfer.py HOST0:5000 2 1   # on host 1
Rank 0 sends 256 MiB to rank 1 ten times; pull a cable meanwhile: nothing is lost."""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jax_r2ccl.transport import bootstrap  # noqa: E402


def main():
    coordinator, n, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=n, process_id=rank)
    ep = bootstrap.connect_jax()
    data = np.random.default_rng(0).integers(0, 256, 256 << 20, dtype=np.uint8)
    for i in range(10):
        t0 = time.monotonic()
        if rank == 0:
            ep.send(1, data, tag=i)
        elif rank == 1:
            out = np.empty_like(data)
            ep.recv(0, out, tag=i)
            ok = np.array_equal(out, data)
            print(f"transfer {i}: {data.nbytes / (time.monotonic() - t0) / 1e6:.0f} MB/s, "
                  f"{'bit-exact' if ok else 'MISMATCH'}", flush=True)
    peer = 1 - rank if rank < 2 else 0
    for s in ep.rail_stats(peer):
        print(f"rail {s['rail']} {s['nic']}: {s['state']}, {s['tx_bytes'] + s['rx_bytes']} bytes, "
              f"{s['failures']} failures")
    ep.close()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
