"""Collective costs for the simulator (alpha-beta, flow level, per server's NICs). The
inter-server all-reduce uses the planner's own cost model (csrc/coll/plan.cc via
jax_r2ccl._core.plan_predict), so the simulator and the planner can never disagree about what a
plan costs; ring, tree, all-to-all and point-to-point are the textbook formulas over the same
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
                      plan: str = "auto") -> dict:
    """Time of one all-reduce of `nbytes` per GPU over the whole cluster: the owner exchange
    between servers under `plan` with per-server capacities (healthy NICs; default all healthy),
    after the reduce-scatter inside each server over NVLink and before the all-gather there
    (one after the other, as jax_r2ccl runs them). Returns {"seconds", "plan", "shares",
    "inter_s", "intra_s"}."""
    caps = _caps(cluster, capacities)
    intra = intra_allreduce_seconds(cluster, nbytes)
    if cluster.servers == 1:
        return {"seconds": intra, "plan": "none", "shares": [1.0], "inter_s": 0.0, "intra_s": intra}
    p = exchange(caps, nbytes, cluster.nic_Bps, cluster.alpha_s, plan)
    return {"seconds": p["predicted_s"] + intra, "plan": p["plan"], "shares": list(p["shares"]),
            "inter_s": p["predicted_s"], "intra_s": intra}


def exchange(caps: Sequence[float], nbytes: float, nic_Bps: float, alpha_s: float, plan: str) -> dict:
    """The planner's owner all-reduce of `nbytes` per server among len(caps) servers."""
    from ... import _core
    return _core.plan_predict(plan, [float(c) for c in caps], float(nbytes), nic_Bps, alpha_s)


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
