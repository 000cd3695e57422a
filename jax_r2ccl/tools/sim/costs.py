"""Collective costs for the simulator (alpha-beta, flow level, per server's NICs). The
inter-server all-reduce uses the planner's own choice of algorithm and its cost model
(csrc/coll/plan.cc via jax_r2ccl._core.algo_predict), so the simulator and the planner can never
disagree about what an algorithm or a plan costs; ring, tree, all-to-all and point-to-point are the textbook formulas over the same
capacities (healthy-NIC units per server)."""

from __future__ import annotations

import math
from typing import Sequence

from .cluster import Cluster


def _caps(cluster: Cluster, capacities: Sequence[float] | None) -> list[float]:
    caps = [float(cluster.nics_per_server)] * cluster.servers if capacities is None else [float(c) for c in capacities]
    if len(caps) != cluster.servers:
        raise ValueError(f"{len(caps)} capacities for {cluster.servers} servers")
    return caps


def intra_allreduce_seconds(cluster: Cluster, nbytes: float) -> float:
    """Reduce-scatter + all-gather inside one server over NVLink (ring of its GPUs)."""
    g = cluster.gpus_per_server
    return 0.0 if g == 1 else 2 * (g - 1) / g * nbytes / cluster.nvlink_Bps


def allreduce_seconds(cluster: Cluster, nbytes: float, capacities: Sequence[float] | None = None,
                      plan: str = "auto", algo: str = "auto", max_peers: int | None = None) -> dict:
    """Time of one all-reduce of `nbytes` per GPU over the whole cluster: the algorithm the
    library picks between servers (R2CCL_ALGO `algo`, R2CCL_MAX_PEERS `max_peers`: the owner
    exchange under `plan`, the ring or doubling) with per-server capacities (healthy NICs;
    default all healthy), after the reduce-scatter inside each server over NVLink and before
    the all-gather there (one after the other, as jax_r2ccl runs them). Returns {"seconds",
    "algo", "plan", "shares", "peers", "buffer_bytes", "inter_s", "intra_s"}."""
    caps = _caps(cluster, capacities)
    intra = intra_allreduce_seconds(cluster, nbytes)
    if cluster.servers == 1:
        return {"seconds": intra, "algo": "none", "plan": "none", "shares": [1.0], "peers": 0, "buffer_bytes": 0.0,
                "inter_s": 0.0, "intra_s": intra}
    p = exchange(caps, nbytes, cluster.nic_Bps, cluster.alpha_s, plan, algo, max_peers)
    return {"seconds": p["predicted_s"] + intra, "algo": p["algo"], "plan": p["plan"], "shares": list(p["shares"]),
            "peers": p["peers"], "buffer_bytes": p["buffer_bytes"], "inter_s": p["predicted_s"], "intra_s": intra}


def exchange(caps: Sequence[float], nbytes: float, nic_Bps: float, alpha_s: float, plan: str, algo: str = "auto",
             max_peers: int | None = None) -> dict:
    """The library's all-reduce of `nbytes` per server among len(caps) servers: the algorithm
    it picks (the planner's C++ code: _core.algo_predict) and that algorithm's cost model."""
    from ... import _core
    kw = {} if max_peers is None else {"max_peers": int(max_peers)}
    return _core.algo_predict(algo, plan, [float(c) for c in caps], float(nbytes), nic_Bps, alpha_s, **kw)


def host_footprint(cluster: Cluster, nbytes: float, algo: str = "auto", max_peers: int | None = None,
                   conns_per_nic: int | None = None, socket_buffer_bytes: int | None = None) -> dict:
    """Per server (one process), for an all-reduce of `nbytes` per GPU: the algorithm, its
    peers, the connections they take (one per NIC pair per peer, R2CCL_CONNS_PER_NIC each: the
    library connects only to the peers its collectives use) and the memory that grows with
    them: the kernel's socket buffers (send + receive, R2CCL_SOCKET_BUFFER_BYTES each) and the
    collective's receive buffers. Defaults are the library's (one source: _core.config_defaults)."""
    from ... import _core
    d = _core.config_defaults()
    conns = int(d["conns_per_nic"] if conns_per_nic is None else conns_per_nic)
    sock = int(d["socket_buffer_bytes"] if socket_buffer_bytes is None else socket_buffer_bytes)
    p = allreduce_seconds(cluster, nbytes, None, "auto", algo, max_peers)
    connections = p["peers"] * cluster.nics_per_server * conns
    return {"algo": p["algo"], "peers": p["peers"], "connections": connections,
            "socket_buffer_bytes": 2 * sock * connections, "buffer_bytes": p["buffer_bytes"]}


def ring_allreduce_seconds(caps: Sequence[float], nbytes: float, nic_Bps: float, alpha_s: float) -> float:
    """Ring all-reduce among servers: 2(P-1) steps of nbytes/P, paced by the slowest server."""
    p = len(caps)
    return 0.0 if p < 2 else 2 * (p - 1) * (alpha_s + nbytes / p / (min(caps) * nic_Bps))


def tree_allreduce_seconds(caps: Sequence[float], nbytes: float, nic_Bps: float, alpha_s: float,
                           chunks: int = 64) -> float:
    """NCCL's double binary tree: each tree carries half the data and a server is inner in at
    most one, so it moves about nbytes each way in the reduce and again in the broadcast,
    pipelined in `chunks` over log2(P) levels, paced by the slowest server: the ring's
    bandwidth with logarithmic instead of linear latency."""
    p = len(caps)
    if p < 2:
        return 0.0
    depth = math.ceil(math.log2(p))
    per_chunk = alpha_s + nbytes / chunks / (min(caps) * nic_Bps)
    return 2 * (depth + chunks - 1) * per_chunk


def alltoall_seconds(caps: Sequence[float], nbytes: float, nic_Bps: float, alpha_s: float) -> float:
    """Every server sends nbytes/P to each other: the busiest server's share over its NICs."""
    p = len(caps)
    return 0.0 if p < 2 else alpha_s + nbytes * (p - 1) / p / (min(caps) * nic_Bps)


def p2p_seconds(cap_from: float, cap_to: float, nbytes: float, nic_Bps: float, alpha_s: float) -> float:
    """One message between two servers, striped over the NICs both ends have."""
    return alpha_s + nbytes / (min(cap_from, cap_to) * nic_Bps)


def busbw_GBps(nbytes: float, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: size/time x 2(n-1)/n, in GB/s."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9
