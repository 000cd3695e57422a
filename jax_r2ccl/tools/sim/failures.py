"""NIC failure traces for the simulator: generated (independent Poisson processes per NIC,
seeded) or read from a JSON file. A failure is a NIC going down, black-holing (link up, nothing
gets through: only a timeout notices), degrading to a fraction of its rate, or flapping (down
for half of every `period`) for a while; several may overlap, on one NIC
or many. `expand` turns a trace into plain down/degrade intervals the way a policy sees them
(a flap is one outage, longer by the hold-down where the policy has one)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from .cluster import Cluster

KINDS = ("down", "degrade", "flap", "blackhole")


@dataclasses.dataclass(frozen=True)
class Failure:
    t: float              # seconds from the start
    server: int
    nic: int
    kind: str = "down"    # "down" (the kernel reports it), "blackhole" (drops everything, link
                          # up: no event), "degrade" (keeps `factor` of its rate), or "flap"
    duration: float = 600.0
    factor: float = 0.0
    period: float = 0.1   # flap: down for period/2, up for period/2, through `duration`

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"failure kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if not (self.t >= 0 and self.duration > 0 and 0 <= self.factor < 1 and self.period > 0):
            raise ValueError(f"bad failure {self}: need t >= 0, duration > 0, 0 <= factor < 1, period > 0")
        if self.kind == "degrade" and self.factor == 0:
            raise ValueError(f"bad failure {self}: a degrade keeps a factor in (0, 1) of the NIC's rate")


def poisson(cluster: Cluster, per_nic_per_hour: float, seconds: float, seed: int = 0,
            mean_repair_s: float = 600.0, degrade_fraction: float = 0.0, degrade_factor: float = 0.1,
            flap_fraction: float = 0.0, flap_period_s: float = 0.1,
            blackhole_fraction: float = 0.0) -> list[Failure]:
    """Failures of every NIC as independent Poisson processes of `per_nic_per_hour`; each lasts
    an exponential time of mean `mean_repair_s`; fractions of them are degradations (to
    `degrade_factor` of the rate), flaps (of period `flap_period_s`) and black holes, the rest
    go down."""
    if per_nic_per_hour < 0 or seconds <= 0 or mean_repair_s <= 0:
        raise ValueError("the rate must be >= 0, the horizon and the repair time > 0")
    fractions = (degrade_fraction, flap_fraction, blackhole_fraction)
    if not (min(fractions) >= 0 and sum(fractions) <= 1):
        raise ValueError("degrade, flap and black-hole fractions must be >= 0 and add up to at most 1")
    edges = np.cumsum(fractions)
    rng = np.random.default_rng(seed)
    nics = cluster.servers * cluster.nics_per_server
    n = rng.poisson(per_nic_per_hour * nics * seconds / 3600.0)
    t = np.sort(rng.uniform(0, seconds, n))
    which = rng.integers(0, nics, n)
    dur = rng.exponential(mean_repair_s, n) + 1e-3
    u = rng.uniform(0, 1, n)
    out = []
    for i in range(n):
        kind = ("degrade", "flap", "blackhole", "down")[int(np.searchsorted(edges, u[i], side="right"))]
        out.append(Failure(float(t[i]), int(which[i] // cluster.nics_per_server),
                           int(which[i] % cluster.nics_per_server), kind, float(dur[i]),
                           degrade_factor if kind == "degrade" else 0.0, flap_period_s))
    return out


def load_trace(path: str) -> list[Failure]:
    """A JSON list of {"t", "server", "nic", "kind", "duration", "factor", "period"} (all but t,
    server and nic optional)."""
    with open(path) as f:
        items = json.load(f)
    if not isinstance(items, list):
        raise ValueError(f"{path}: a failure trace is a JSON list of objects")
    out = []
    for k, item in enumerate(items):
        try:
            out.append(Failure(**item))
        except TypeError as e:
            raise ValueError(f"{path}: failure {k}: {e}") from None
    return sorted(out, key=lambda x: x.t)


# Published rates, per NIC per hour (one NIC per GPU, as in the paper's servers):
PRESETS = {
    # Llama 3 405B (arXiv 2407.21783, table 5): of 419 unexpected interruptions in 54 days on
    # 16,384 H100s, 35 were network switch/cable and 7 NIC: 42 / (16384 x 54 x 24 h).
    "llama3": 42 / (16384 * 54 * 24),
    # "Revisiting Reliability in Large-Scale ML Research Clusters" (arXiv 2410.21680): 6.50
    # failures per 1000 node-days on RSC-1, all causes, as if every one were a NIC's (an upper
    # bound: the paper's per-cause split is not used here).
    "rsc1": 6.50 / 1000 / 24 / 8,
}


def parse_failures(spec: str, cluster: Cluster, seconds: float, seed: int, **poisson_kw) -> list[Failure]:
    """'poisson:RATE[:MEAN_REPAIR_S]' (failures per NIC per hour), a preset ('llama3', 'rsc1',
    optionally ':xK' to scale the rate K times, e.g. 'llama3:x100'), 'none', or a trace file."""
    if spec == "none":
        return []
    name, _, scale = spec.partition(":")
    if name in PRESETS:
        k = 1.0
        if scale:
            if not scale.startswith("x"):
                raise ValueError(f"--failures {spec!r}: scale a preset as {name}:x10")
            k = float(scale[1:])
        return poisson(cluster, PRESETS[name] * k, seconds, seed, **poisson_kw)
    if spec.startswith("poisson:"):
        parts = spec.split(":")[1:]
        try:
            rate = float(parts[0])
            repair = float(parts[1]) if len(parts) > 1 else 600.0
        except (ValueError, IndexError):
            raise ValueError(f"--failures {spec!r}: use poisson:RATE[:MEAN_REPAIR_S], a trace file, or none") from None
        return poisson(cluster, rate, seconds, seed, repair, **poisson_kw)
    import os
    if not os.path.exists(spec):
        raise ValueError(f"--failures {spec!r}: not poisson:RATE, a preset ({', '.join(PRESETS)}), none, "
                         f"or an existing trace file")
    return load_trace(spec)


def check_in_cluster(cluster: Cluster, failures: list[Failure]) -> None:
    for f in failures:
        if not (0 <= f.server < cluster.servers and 0 <= f.nic < cluster.nics_per_server):
            raise ValueError(f"failure on server {f.server} NIC {f.nic} outside the cluster "
                             f"({cluster.servers} servers x {cluster.nics_per_server} NICs)")


@dataclasses.dataclass(frozen=True)
class Outage:
    """One plain interval of a NIC at `factor` of its rate (0: down)."""
    start: float
    end: float
    server: int
    nic: int
    factor: float
    source: int        # index of the Failure it came from
    silent: bool = False   # a black hole: no link event, only a timeout notices


def expand(failures: list[Failure], seconds: float, holddown_s: float | None = None) -> list[Outage]:
    """Plain outages before `seconds`, sorted by start. A flap is one outage from its first drop
    to its last rise: every policy here stops using a NIC when it first drops and takes it back
    only once it stays up (generous to the policies without a monitor, which in practice may
    re-admit it at every rise and pay a failover each time, or never). With a hold-down
    (jax_r2ccl's monitor: a NIC that failed stays out for the hold-down, doubled per failure in
    the last 10 s up to 16x) the outage lasts that much longer."""
    out = []
    for k, f in enumerate(failures):
        if f.t >= seconds:
            continue
        if f.kind != "flap":
            out.append(Outage(f.t, f.t + f.duration, f.server, f.nic, f.factor, k, f.kind == "blackhole"))
        else:
            tail = 0.0
            if holddown_s is not None:
                flaps_in_10s = max(1, int(min(f.duration, 10.0) / f.period))
                tail = holddown_s * min(16, 2 ** min(flaps_in_10s - 1, 4))
            out.append(Outage(f.t, f.t + f.duration + tail, f.server, f.nic, 0.0, k))
    out.sort(key=lambda o: o.start)
    return out


class Sweep:
    """The NIC state over time from plain outages, event by event. state maps each server with
    a NIC below full rate to its NICs' factors (a NIC under several outages keeps the worst);
    healthy servers are absent. `drop_active` and `skip_until` let a policy that restarts the
    job on spare hardware forget what it left behind."""

    def __init__(self, outages: list[Outage], nics_per_server: int):
        import heapq
        self._heapq = heapq
        self.outages = outages
        self.n = nics_per_server
        self.events = []   # (time, order, index): ends (0) sort before starts (1) at one time
        for k, o in enumerate(outages):
            self.events.append((o.start, 1, k))
            self.events.append((o.end, 0, k))
        heapq.heapify(self.events)
        self.active: dict[tuple[int, int], dict[int, float]] = {}
        self.rows: dict[int, list[float]] = {}
        self.gone: set[int] = set()

    def next_time(self) -> float:
        return self.events[0][0] if self.events else float("inf")

    def _apply(self, order: int, k: int) -> None:
        o = self.outages[k]
        fs = self.active.setdefault((o.server, o.nic), {})
        if order:
            fs[k] = o.factor
        else:
            fs.pop(k, None)
        row = self.rows.setdefault(o.server, [1.0] * self.n)
        row[o.nic] = min(fs.values()) if fs else 1.0
        if not fs:
            del self.active[(o.server, o.nic)]
        if all(v == 1.0 for v in row):
            del self.rows[o.server]

    def advance(self, t: float) -> list[int]:
        """Applies every event at or before t; returns the outages that started."""
        started = []
        while self.events and self.events[0][0] <= t:
            _, order, k = self._heapq.heappop(self.events)
            if k in self.gone:
                continue
            self._apply(order, k)
            if order:
                started.append(k)
        return started

    def state(self) -> dict[int, tuple[float, ...]]:
        return {s: tuple(r) for s, r in self.rows.items()}

    def drop_active(self) -> None:
        """Forgets every outage in force (the job left that hardware)."""
        for fs in self.active.values():
            self.gone.update(fs)
        self.active.clear()
        self.rows.clear()

    def skip_until(self, t: float) -> None:
        """Forgets the outages that start before t (they hit hardware the job is not on)."""
        while self.events and self.events[0][0] < t:
            _, order, k = self._heapq.heappop(self.events)
            if order and k not in self.gone:
                self.gone.add(k)
            elif not order and k not in self.gone:
                self._apply(order, k)


def nic_segments(outages: list[Outage], seconds: float, nics_per_server: int):
    """(start, end, state, started) over [0, seconds): piecewise-constant NIC states (see
    Sweep.state) and the outages that start each segment."""
    sw = Sweep(outages, nics_per_server)
    t = 0.0
    started = sw.advance(0.0)
    while t < seconds:
        nxt = min(sw.next_time(), seconds)
        if nxt > t:
            yield t, nxt, sw.state(), started
        t = nxt
        started = sw.advance(t) if t < seconds else []


def capacity_segments(cluster: Cluster, failures: list[Failure], seconds: float):
    """The piecewise-constant capacities over [0, seconds) as (start, end, caps, begins):
    caps[server] in healthy NICs (a copy; a degraded NIC counts its factor, a NIC hit by several
    failures at once the worst), begins = a failure (not only a repair) starts the segment.
    An event sweep: memory O(servers x NICs)."""
    check_in_cluster(cluster, failures)
    full = np.full(cluster.servers, float(cluster.nics_per_server))
    for start, end, state, started in nic_segments(expand(failures, seconds), seconds, cluster.nics_per_server):
        caps = full.copy()
        for server, factors in state.items():
            caps[server] = float(np.sum(factors))
        yield start, end, caps, bool(started)
