"""Fault-handling policies for the simulator: what each does when NICs of a server fail or
slow down, expressed as the server's effective capacity (in healthy-NIC units) for the planner's
cost functions, or None when the job cannot go on.

How each moves traffic (rail-optimized servers: GPU i drives NIC i, NCCL runs one channel per
rail, and a collective is as slow as its slowest channel):

- crash-restart: NCCL's default. A NIC that goes down ends the job (timeout, abort); it restarts
  from its last checkpoint on spare hardware. A slow NIC slows its rail, and with it the whole
  collective.
- nccl-failover: NCCL 2.29+ port failover, which works only for fused NICs (several ports
  merged into one device, `--fused-ports`): the survivors of the device carry its rail. A NIC
  that is not fused, or a device with no port left, ends the job as above.
- hot-repair: R2CCL's failover without re-planning: the failed rail's traffic moves to one
  backup NIC (through a neighbour GPU, PXN), which then carries two rails.
- adapcc: AdapCC-like subset communication: the GPUs behind a failed NIC leave the data-parallel
  group (their work is lost until the NIC is repaired), the others go on. It has no path for a
  rank that holds a unique shard (tensor/pipeline parallel): there a NIC failure ends the job,
  as the paper's Megatron figure shows (0 tokens/s for TP+PP).
- r2ccl-balance / r2ccl-r2cc: R2CCL stripes over the surviving NICs evenly (it reacts to NICs
  that fail, not to NICs that slow down: a slow NIC gets an even share and paces the rest),
  then runs the Balance or R2CC-AllReduce plan.
- jax_r2ccl: rails failed on the kernel's link event, stripes weighted by measured bandwidth
  (the health monitor), flaps held down, and the planner's fastest plan on every call.
- dejavu (serving only): the instance is restarted and resumes from its replicated KV cache.

Each policy's timing constants are named in POLICIES with where they come from."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    view: str                 # how a server's NIC factors become its capacity, see capacity()
    plan: str = "balance"     # all-reduce plan (the planner's names) while degraded
    # The all-reduce between servers (the planner's algorithm names). Every system but
    # jax_r2ccl is costed with the owner exchange, as before the algorithms (R2CCL's plans are
    # shares of it); jax_r2ccl runs what its planner picks (auto: two_level past R2CCL_MAX_PEERS).
    algo: str = "direct"
    failover_s: float = 0.0   # time without progress when a NIC it survives goes down
    blackhole_s: float | None = None   # the same for a black hole (no link event); None: failover_s
    holddown_s: float | None = None   # flap hold-down (jax_r2ccl's monitor); None: none
    drops_ranks: bool = False  # adapcc: a failed NIC's GPUs leave the data-parallel group
    serving_only: bool = False
    kv_restore: bool = False   # dejavu: a dead instance's requests resume from replicated KV
    max_failed_devices: int | None = None   # nccl-failover: one failed device per communicator
    reweigh_s: float = 0.0    # weighted view: a slow NIC keeps its full share this long (the monitor's samples)
    doc: str = ""


POLICIES = {
    "crash-restart": Policy("crash-restart", "crash", doc="NCCL default: abort, restart from checkpoint"),
    # NCCL 2.29.7 NCCL_IB_RESILIENCY_PORT_FAILOVER: inside a fused (merged) NIC only, one failed
    # device per communicator, after the IB transport gives up: NCCL_IB_TIMEOUT=20 (4.3 s) x
    # NCCL_IB_RETRY_CNT=7 retries, about 30 s.
    "nccl-failover": Policy("nccl-failover", "fused", failover_s=30.0, max_failed_devices=1,
                            doc="NCCL 2.29.7+ port failover: fused NICs only, one failed device, ~30 s of IB retries"),
    # AdapCC's code (JoeyYoung/adapcc): a worker that has not checked in for 10 s is left out of
    # the step; each context rebuild ends in a 3 s sleep. Only all-reduce/reduce/broadcast.
    "adapcc": Policy("adapcc", "subset", failover_s=13.0, drops_ranks=True,
                     doc="AdapCC-like subset: ranks behind a failed NIC leave (10 s check-in timeout + 3 s "
                         "rebuild); no P2P"),
    "hot-repair": Policy("hot-repair", "relay", failover_s=0.05,
                         doc="R2CCL migration only: one backup NIC carries the failed rail"),
    "r2ccl-balance": Policy("r2ccl-balance", "even", "balance", failover_s=0.05,
                            doc="R2CCL Balance: even stripes over the survivors"),
    "r2ccl-r2cc": Policy("r2ccl-r2cc", "even", "r2cc", failover_s=0.05,
                         doc="R2CCL R2CC-AllReduce over the survivors"),
    # the monitor acts on three agreeing bandwidth samples, each smoothed over ~200 ms (issue 4)
    "jax_r2ccl": Policy("jax_r2ccl", "weighted", "auto", algo="auto", failover_s=0.005, holddown_s=0.1,
                        blackhole_s=0.25, reweigh_s=0.6,
                        doc="jax_r2ccl: link events (5 ms), black holes on the stall timer (R2CCL_STALL_MS 250), "
                            "weighted stripes, hold-down, planner"),
    # The same with R2CCL_MAX_PEERS at least the servers: the owner exchange and its plans at any
    # size (every host connects to every other).
    "jax_r2ccl-direct": Policy("jax_r2ccl-direct", "weighted", "auto", algo="direct", failover_s=0.005,
                               holddown_s=0.1, blackhole_s=0.25, reweigh_s=0.6,
                               doc="jax_r2ccl with R2CCL_ALGO=direct: the owner exchange and its degraded plans "
                                   "at any size (a connection to every host)"),
    # The same with R2CCL_ALGO=ring: the chain, two peers per host and no degraded plan.
    "jax_r2ccl-chain": Policy("jax_r2ccl-chain", "weighted", "auto", algo="ring", failover_s=0.005,
                              holddown_s=0.1, blackhole_s=0.25, reweigh_s=0.6,
                              doc="jax_r2ccl with R2CCL_ALGO=ring: the chain in canonical order (two peers per "
                                  "host, no degraded plan)"),
    "dejavu": Policy("dejavu", "crash", serving_only=True, kv_restore=True,
                     doc="DejaVu-like serving: restart the instance, restore the replicated KV cache"),
}


def capacity(policy: Policy, factors: tuple[float, ...], fused_ports: int = 1) -> float | None:
    """A server's effective capacity in healthy-NIC units under `policy`, from its NICs'
    factors (1 healthy, 0 down, else the fraction of the rate left); None: the job cannot go on
    (for adapcc: see alive_gpus, the capacity here is the survivors' rails)."""
    f = np.asarray(factors, dtype=float)
    n = len(f)
    alive = f > 0
    if not alive.any():
        return None
    v = policy.view
    if v == "weighted":
        # the monitor's weights follow measured bandwidth (minimum weight 0.02: a probe trickle)
        return float(np.sum(f[alive]))
    if v == "even":
        return float(alive.sum() * f[alive].min())
    if v in ("crash", "subset"):
        if v == "crash" and not alive.all():
            return None
        # one channel per rail: the slowest rail paces the collective; a subset drops dead rails
        return float(alive.sum() * f[alive].min())
    if v == "relay":
        # each dead rail's traffic moves to the next live NIC; the most loaded NIC paces
        load = np.where(alive, 1.0, 0.0)
        for i in np.flatnonzero(~alive):
            j = next((i + d) % n for d in range(1, n) if alive[(i + d) % n])
            load[j] += 1.0
        return float(n * np.min(f[alive] / load[alive]))
    if v == "fused":
        k = max(1, int(fused_ports))
        if n % k:
            raise ValueError(f"{n} NICs per server do not split into fused devices of {k} ports")
        groups = f.reshape(n // k, k).sum(axis=1)
        if (groups == 0).any() or (k == 1 and not alive.all()):
            return None
        return float(n * groups.min() / k)
    raise ValueError(f"unknown policy view {v!r}")


def job_capacities(policy: Policy, state: dict, gpus_per_server: int,
                   fused_ports: int = 1) -> tuple[dict, int] | None:
    """(server -> effective capacity, GPUs an adapcc-like subset dropped) for the servers in
    `state` (server -> NIC factors), or None when the job cannot go on."""
    caps, lost = {}, 0
    for s, f in state.items():
        c = capacity(policy, f, fused_ports)
        if c is None:
            return None
        caps[s] = c
        if policy.drops_ranks:
            lost += gpus_per_server - alive_gpus(f, gpus_per_server)
    if policy.max_failed_devices is not None:
        k = max(1, int(fused_ports))
        failed = sum(1 for f in state.values() for g in range(0, len(f), k) if min(f[g:g + k]) == 0)
        if failed > policy.max_failed_devices:
            return None
    return caps, lost


def alive_gpus(factors: tuple[float, ...], gpus_per_server: int) -> int:
    """GPUs of a server an adapcc-like subset keeps: those whose rail's NIC is up (rail-optimized:
    GPU i uses NIC i mod NICs)."""
    n = len(factors)
    return sum(1 for g in range(gpus_per_server) if factors[g % n] > 0)


def stall_seconds(policy: Policy, silent: bool) -> float:
    """Time without progress when a NIC the policy survives goes down (silent: a black hole)."""
    return policy.blackhole_s if silent and policy.blackhole_s is not None else policy.failover_s
