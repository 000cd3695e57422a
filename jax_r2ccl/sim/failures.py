"""NIC failure traces for the simulator: generated (Poisson per NIC, seeded) or read from a
JSON file, and turned into each server's capacity over time (healthy NICs; a degraded NIC
counts the fraction it keeps)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from .cluster import Cluster

KINDS = ("down", "degrade")


@dataclasses.dataclass(frozen=True)
class Failure:
    t: float              # seconds from the start
    server: int
    nic: int
    kind: str = "down"    # "down" (factor 0) or "degrade" (keeps `factor` of its rate)
    duration: float = 600.0
    factor: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"failure kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if not (self.t >= 0 and self.duration > 0 and 0 <= self.factor < 1):
            raise ValueError(f"bad failure {self}")


def poisson(cluster: Cluster, per_nic_per_hour: float, seconds: float, seed: int = 0,
            mean_repair_s: float = 600.0, degrade_fraction: float = 0.0, degrade_factor: float = 0.1) -> list[Failure]:
    """Failures of every NIC as independent Poisson processes of `per_nic_per_hour`; each lasts
    an exponential time of mean `mean_repair_s`; a fraction of them are degradations."""
    if per_nic_per_hour < 0 or seconds <= 0:
        raise ValueError("rate must be >= 0 and the horizon > 0")
    rng = np.random.default_rng(seed)
    nics = cluster.servers * cluster.nics_per_server
    n = rng.poisson(per_nic_per_hour * nics * seconds / 3600.0)
    t = np.sort(rng.uniform(0, seconds, n))
    which = rng.integers(0, nics, n)
    dur = rng.exponential(mean_repair_s, n) + 1e-3
    deg = rng.uniform(0, 1, n) < degrade_fraction
    return [Failure(float(t[i]), int(which[i] // cluster.nics_per_server), int(which[i] % cluster.nics_per_server),
                    "degrade" if deg[i] else "down", float(dur[i]), degrade_factor if deg[i] else 0.0)
            for i in range(n)]


def load_trace(path: str) -> list[Failure]:
    """A JSON list of {"t", "server", "nic", "kind", "duration", "factor"} (kind, duration and
    factor optional)."""
    with open(path) as f:
        items = json.load(f)
    return sorted((Failure(**item) for item in items), key=lambda x: x.t)


def parse_failures(spec: str, cluster: Cluster, seconds: float, seed: int) -> list[Failure]:
    """'poisson:RATE[:MEAN_REPAIR_S]' (failures per NIC per hour), 'none', or a trace file."""
    if spec == "none":
        return []
    if spec.startswith("poisson:"):
        parts = spec.split(":")[1:]
        rate = float(parts[0])
        repair = float(parts[1]) if len(parts) > 1 else 600.0
        return poisson(cluster, rate, seconds, seed, repair)
    return load_trace(spec)


def capacity_segments(cluster: Cluster, failures: list[Failure], seconds: float):
    """Yields the piecewise-constant capacities over [0, seconds) as (start, end, caps, begins):
    caps[server] in healthy NICs (a copy), begins = a failure (not only a repair) starts the
    segment. A NIC hit by several failures at once keeps the worst factor. A sweep over the
    events: memory stays O(servers x NICs) however long the trace."""
    import heapq
    for f in failures:
        if not (0 <= f.server < cluster.servers and 0 <= f.nic < cluster.nics_per_server):
            raise ValueError(f"failure on server {f.server} NIC {f.nic} outside the cluster")
    events = []   # (time, order, +1 start / -1 end, failure index); ends sort before starts
    for k, f in enumerate(failures):
        if f.t < seconds:
            events.append((f.t, 1, +1, k))
            events.append((f.t + f.duration, 0, -1, k))
    heapq.heapify(events)
    active: dict[tuple[int, int], dict[int, float]] = {}
    nic_factor = np.ones((cluster.servers, cluster.nics_per_server))
    caps = nic_factor.sum(axis=1)
    t, begins = 0.0, False
    while events and events[0][0] <= 0.0:
        _, _, sign, k = heapq.heappop(events)
        f = failures[k]
        active.setdefault((f.server, f.nic), {})[k] = f.factor
        begins = True
    def refresh(server, nic):
        fs = active.get((server, nic))
        nic_factor[server, nic] = min(fs.values()) if fs else 1.0
        caps[server] = nic_factor[server].sum()
    for key in list(active):
        refresh(*key)
    while t < seconds:
        nxt = min(events[0][0], seconds) if events else seconds
        if nxt > t:
            yield t, nxt, caps.copy(), begins
        t, begins = nxt, False
        while events and events[0][0] <= t and t < seconds:
            _, _, sign, k = heapq.heappop(events)
            f = failures[k]
            fs = active.setdefault((f.server, f.nic), {})
            if sign > 0:
                fs[k] = f.factor
                begins = True
            else:
                fs.pop(k, None)
            refresh(f.server, f.nic)
