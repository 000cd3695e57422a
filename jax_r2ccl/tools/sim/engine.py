"""The simulation proper: a training job or a serving fleet through a failure trace under one
policy, event by event (an outage starting or ending, a checkpoint), never step by step, so a
long horizon costs what its failures cost."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .cluster import Cluster
from .failures import Failure, Outage, Sweep, check_in_cluster, expand
from .policies import Policy, job_capacities, stall_seconds
from .workloads import CollectiveLoop, Serving, Training


@dataclasses.dataclass(frozen=True)
class Restart:
    """What a job that dies costs: restarting (scheduling, loading the checkpoint, warm-up) and
    how often it saved progress; for serving, the time to notice a hung collective."""
    restart_s: float = 600.0
    checkpoint_s: float = 1800.0
    detect_s: float = 30.0         # a hung NCCL collective: InfiniBand gives up after ~30 s with NCCL defaults
    # DejaVu's code (msr-fiddle/dejavu): heartbeats every 1 s, a rank is dead after 3 missed;
    # survivors abort NCCL, sleep(rank) (up to pp - 1 s), re-initialise NCCL, a warm standby
    # copies its weights to the GPU and warms up: assumed 3 s in all, then the KV cache streams
    # back from the neighbour's replica.
    dejavu_detect_s: float = 3.0
    dejavu_restore_Bps: float = 25e9   # KV replica -> new worker (a 200 Gbit/s path)
    dejavu_restart_s: float = 3.0


def _stall(policy: Policy, sw: Sweep, started: list[int]) -> float:
    """Time without progress for the outages that just started: NICs that went down (a slow one
    moves no traffic off); the slowest to be noticed counts."""
    return max((stall_seconds(policy, sw.outages[k].silent) for k in started if sw.outages[k].factor == 0),
               default=0.0)


def _state_key(state: dict) -> tuple:
    return tuple(sorted(state.items()))


def steady_overhead(cluster: Cluster, wl: Training | Serving, policy: Policy, state: dict,
                    fused_ports: int = 1) -> float | None:
    """Throughput lost (training) or time per output token added (serving) while the NICs in
    `state` (server -> factors) stay as they are; None: the job cannot run."""
    got = job_capacities(policy, state, cluster.gpus_per_server, fused_ports)
    if got is None:
        return None
    caps, lost = got
    if isinstance(wl, Serving):
        if lost:
            return None
        full = [float(cluster.nics_per_server)] * wl.pp
        first = min(caps) - min(caps) % wl.pp if caps else 0
        deg = [caps.get(first + k, full[k]) for k in range(wl.pp)]
        return wl.tpot(cluster, deg) / wl.tpot(cluster, full) - 1.0
    if lost and not (wl.tp == 1 and wl.pp == 1):
        return None
    h, _ = wl.step(cluster, {}, policy.plan, algo=policy.algo)
    d, frac = wl.step(cluster, caps, policy.plan, lost, algo=policy.algo)
    return 1.0 - frac * h / d


def run_training(cluster: Cluster, wl: Training | CollectiveLoop, failures: list[Failure], seconds: float, policy: Policy,
                 restart: Restart, fused_ports: int = 1) -> dict:
    """Work done in `seconds` under `policy`, against the same job without failures."""
    check_in_cluster(cluster, failures)
    if policy.serving_only:
        raise ValueError(f"policy {policy.name} is for serving workloads")
    healthy_step, _ = wl.step(cluster, {}, policy.plan, algo=policy.algo)
    healthy_rate = 1.0 / healthy_step
    sw = Sweep(expand(failures, seconds, policy.holddown_s), cluster.nics_per_server)
    cache: dict[tuple, float | None] = {}
    dp = wl.tp == 1 and wl.pp == 1

    def rate_as(pol: Policy, state) -> float | None:
        got = job_capacities(pol, state, cluster.gpus_per_server, fused_ports)
        if got is None or (got[1] and not dp):
            return None
        step, frac = wl.step(cluster, got[0], pol.plan, got[1], algo=pol.algo)
        return frac / step

    def rate(state) -> float | None:
        if not state:
            return healthy_rate
        key = _state_key(state)
        if key not in cache:
            cache[key] = rate_as(policy, state)
        return cache[key]

    t = progress = saved = epoch = down_until = 0.0
    active_time = active_work = 0.0
    crashes = stalls = 0
    C = restart.checkpoint_s

    def on_start(t: float, started: list[int]) -> None:
        nonlocal progress, down_until, epoch, crashes, stalls, active_work
        if rate(sw.state()) is None:
            crashes += 1
            active_work -= progress - saved
            progress = saved
            down_until = t + restart.restart_s
            epoch = down_until
            sw.drop_active()
            sw.skip_until(down_until)
        else:
            stall = _stall(policy, sw, started)
            if stall > 0:
                stalls += 1
                down_until = max(down_until, t + stall)
            elif policy.reweigh_s > 0 and any(0 < sw.outages[k].factor for k in started):
                # until the monitor re-weighs, the slow NIC keeps an even share and the plan its
                # healthy shares: count the work that costs as time without progress
                even = rate_as(dataclasses.replace(policy, view="even", plan="balance"), sw.state())
                now = rate(sw.state())
                if even is not None and now:
                    down_until = max(down_until, t) + policy.reweigh_s * max(0.0, 1.0 - even / now)

    started = sw.advance(0.0)
    if started:
        on_start(0.0, started)
    while t < seconds:
        nxt = min(sw.next_time(), seconds)
        if nxt > t:
            state = sw.state()
            a = min(max(t, down_until), nxt)
            r = rate(state) or 0.0
            if C > 0 and nxt > epoch:
                tc = epoch + math.floor((nxt - epoch) / C) * C    # the last checkpoint in [t, nxt]
                if tc >= t:
                    saved = progress + max(0.0, tc - a) * r
            work = (nxt - a) * r
            progress += work
            if state or down_until > t:
                active_time += nxt - t
                active_work += work
        t = nxt
        if t < seconds:
            started = sw.advance(t)
            if started:
                on_start(t, started)
    fault_free = seconds * healthy_rate
    return {"policy": policy.name, "workload": wl.name, "gpus": cluster.servers * cluster.gpus_per_server,
            "overhead": 1.0 - progress / fault_free,
            "overhead_active": (1.0 - active_work / (active_time * healthy_rate)) if active_time > 0 else 0.0,
            "active_s": active_time, "failures": sum(1 for f in failures if f.t < seconds),
            "crashes": crashes, "failovers": stalls, "steps": progress, "fault_free_steps": fault_free,
            "healthy_step_s": healthy_step}


def run_serving(cluster: Cluster, wl: Serving, failures: list[Failure], seconds: float, policy: Policy,
                restart: Restart, fused_ports: int = 1, seed: int = 0) -> dict:
    """Request latency over `seconds` under `policy`, against the same requests without
    failures. Requests arrive at each instance as a Poisson process (seeded: every policy sees
    the same ones) and decode with continuous batching at the instance's time per output token.
    A request in flight when its instance stalls waits out the stall; when the instance dies,
    crash-restart re-runs it elsewhere after the hang is noticed, DejaVu resumes it from the
    replicated KV cache. Requests arriving while an instance restarts go to the others."""
    check_in_cluster(cluster, failures)
    if policy.drops_ranks:
        policy = dataclasses.replace(policy, view="crash")   # no path for a unique shard (see policies)
    pp = wl.pp
    inst = wl.instances(cluster)
    healthy_caps = [float(cluster.nics_per_server)] * pp
    tpot0 = wl.tpot(cluster, healthy_caps)
    ttft_mean = wl.ttft(cluster, healthy_caps)
    rng = np.random.default_rng(seed + 7919)
    outages = expand(failures, seconds, policy.holddown_s)
    by_inst: dict[int, list[Outage]] = {}
    for o in outages:
        by_inst.setdefault(o.server // pp, []).append(
            dataclasses.replace(o, server=o.server % pp))
    # sums over all requests and over the ones a failure met: [ttft, decode] fault-free and extra
    tot = np.zeros((2, 2))
    act = np.zeros((2, 2))
    n_req = hit = crashes = stalls = 0
    worst = 0.0
    lam = wl.arrival_rate(cluster)
    lookback = 3600.0      # no request lasts longer (answers average output_tokens x tpot0)
    for i in range(inst):
        n = int(rng.poisson(lam * seconds))
        n_req += n
        if i not in by_inst:
            tot[0] += (n * ttft_mean, n * wl.output_tokens * tpot0)   # untouched: their expected latency
            continue
        arr = np.sort(rng.uniform(0, seconds, n))
        prompt = rng.uniform(0.5, 1.5, n) * wl.prompt_tokens
        out = rng.geometric(1.0 / wl.output_tokens, n).astype(float)
        f0 = ttft_mean * prompt / wl.prompt_tokens        # time to the first token
        d0 = out * tpot0                                  # decoding
        l0 = f0 + d0
        xf, xd = np.zeros(n), np.zeros(n)
        touched = np.zeros(n, dtype=bool)

        def charge(idx, t, x):
            """x seconds more for requests idx, held up at t: in prefill or in decoding."""
            pre = t < arr[idx] + f0[idx]
            xf[idx[pre]] += x if np.isscalar(x) else x[pre]
            xd[idx[~pre]] += x if np.isscalar(x) else x[~pre]

        sw = Sweep(sorted(by_inst[i], key=lambda o: o.start), cluster.nics_per_server)
        t = 0.0
        started = sw.advance(0.0)
        while True:
            if started:
                state = sw.state()
                lo, hi = np.searchsorted(arr, t - lookback), np.searchsorted(arr, t, side="right")
                idx = lo + np.flatnonzero(t < arr[lo:hi] + l0[lo:hi])     # in flight at t
                touched[idx] = True
                if job_capacities(policy, state, cluster.gpus_per_server, fused_ports) is None:
                    crashes += 1
                    if policy.kv_restore:
                        kv = float((wl.kv_bytes_per_token * (prompt[idx] + out[idx] / 2)).sum())
                        charge(idx, t, restart.dejavu_detect_s + restart.dejavu_restart_s
                               + kv / pp / restart.dejavu_restore_Bps)
                    else:
                        charge(idx, t, restart.detect_s + (t - arr[idx]))   # noticed, then run again
                    sw.drop_active()
                    sw.skip_until(t + restart.restart_s)
                else:
                    stall = _stall(policy, sw, started)
                    if stall > 0:
                        stalls += 1
                        charge(idx, t, stall)
            nxt = min(sw.next_time(), seconds)
            state = sw.state()
            if state and nxt > t:
                got = job_capacities(policy, state, cluster.gpus_per_server, fused_ports)
                if got is not None:
                    full = float(cluster.nics_per_server)
                    caps = [got[0].get(k, full) for k in range(pp)]
                    slow_f = wl.ttft(cluster, caps) / ttft_mean - 1.0
                    slow_d = wl.tpot(cluster, caps) / tpot0 - 1.0
                    lo, hi = np.searchsorted(arr, t - lookback), np.searchsorted(arr, nxt)
                    a0, a1, a2 = arr[lo:hi], arr[lo:hi] + f0[lo:hi], arr[lo:hi] + l0[lo:hi]
                    ov_f = np.clip(np.minimum(nxt, a1) - np.maximum(t, a0), 0, None)
                    ov_d = np.clip(np.minimum(nxt, a2) - np.maximum(t, a1), 0, None)
                    touched[lo:hi] |= (ov_f + ov_d) > 0
                    xf[lo:hi] += ov_f * slow_f
                    xd[lo:hi] += ov_d * slow_d
            if nxt >= seconds:
                break
            t = nxt
            started = sw.advance(t)
        tot[0] += (f0.sum(), d0.sum())
        tot[1] += (xf.sum(), xd.sum())
        act[0] += (f0[touched].sum(), d0[touched].sum())
        act[1] += (xf[touched].sum(), xd[touched].sum())
        hit += int(touched.sum())
        worst = max(worst, float((xf + xd).max()) if n else 0.0)
    ratio = lambda x, y: float(x / y) if y else 0.0
    return {"policy": policy.name, "workload": wl.name, "gpus": cluster.servers * cluster.gpus_per_server,
            "overhead": ratio(tot[1].sum(), tot[0].sum()), "overhead_active": ratio(act[1].sum(), act[0].sum()),
            "ttft_overhead_active": ratio(act[1, 0], act[0, 0]), "tpot_overhead_active": ratio(act[1, 1], act[0, 1]),
            "worst_extra_s": worst, "requests": n_req, "requests_hit": hit,
            "failures": sum(1 for f in failures if f.t < seconds), "crashes": crashes, "failovers": stalls,
            "tpot_s": tpot0, "ttft_s": ttft_mean, "mean_latency_s": ttft_mean + wl.output_tokens * tpot0}


def time_to_finish(cluster: Cluster, wl: Training | CollectiveLoop, failures: list[Failure], steps: float,
                   policy: Policy, restart: Restart | None = None, fused_ports: int = 1) -> float:
    """Seconds the job needs for `steps` steps through the trace (bisection on the horizon)."""
    restart = restart or Restart()
    lo, hi = 0.0, steps * wl.step(cluster, {}, policy.plan, algo=policy.algo)[0]
    while run_training(cluster, wl, failures, hi, policy, restart, fused_ports)["steps"] < steps:
        lo, hi = hi, hi * 2
        if hi > 1e9:
            raise ValueError("the job never finishes under this trace and policy")
    for _ in range(60):
        mid = (lo + hi) / 2
        if run_training(cluster, wl, failures, mid, policy, restart, fused_ports)["steps"] >= steps:
            hi = mid
        else:
            lo = mid
    return hi
