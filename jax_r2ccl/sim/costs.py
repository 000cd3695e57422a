"""Collective costs for the simulator. The inter-server all-reduce uses the planner's own cost
model (csrc/coll/plan.cc via jax_r2ccl._core.plan_predict), so the simulator and the planner
can never disagree about what a plan costs."""

from __future__ import annotations

from typing import Sequence

from .cluster import Cluster


def allreduce_seconds(cluster: Cluster, nbytes: float, capacities: Sequence[float] | None = None,
                      plan: str = "auto") -> dict:
    """Time of one all-reduce of `nbytes` per GPU: reduce inside each server over NVLink, the
    owner exchange between servers under `plan` with per-server capacities (healthy NICs;
    default all healthy), then the broadcast inside each server. Returns {"seconds", "plan",
    "shares", "inter_s", "intra_s"}."""
    from .. import _core
    caps = [float(cluster.nics_per_server)] * cluster.servers if capacities is None else [float(c) for c in capacities]
    if len(caps) != cluster.servers:
        raise ValueError(f"{len(caps)} capacities for {cluster.servers} servers")
    g = cluster.gpus_per_server
    # Intra-server reduce-scatter + all-gather over NVLink (ring inside the server).
    intra = 0.0 if g == 1 else 2 * (g - 1) / g * nbytes / cluster.nvlink_Bps
    if cluster.servers == 1:
        return {"seconds": intra, "plan": "none", "shares": [1.0], "inter_s": 0.0, "intra_s": intra}
    p = _core.plan_predict(plan, caps, float(nbytes), cluster.nic_Bps, cluster.alpha_s)
    return {"seconds": p["predicted_s"] + intra, "plan": p["plan"], "shares": list(p["shares"]),
            "inter_s": p["predicted_s"], "intra_s": intra}


def busbw_GBps(nbytes: float, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: size/time x 2(n-1)/n, in GB/s."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9
