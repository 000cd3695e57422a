"""`python -m jax_r2ccl bench timeline`: per-rail throughput over time through a sequence of
faults, so a person can see the failover, the rebalancing and the failback. Process 0 streams
messages to process 1 back to back (every byte checked) with the health monitor on, samples
every rail's bytes, state and weight, runs each --step command at its time, and writes
PREFIX.json and PREFIX.png (the PNG needs matplotlib: pip install "jax_r2ccl[plot]")."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import numpy as np

from .common import Dist, parse_size

TAG_BASE = 7000


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT")
    p.add_argument("--num-processes", type=int, required=True, metavar="N")
    p.add_argument("--process-id", type=int, required=True, metavar="I")
    p.add_argument("--nics", default=None, help="comma-separated NICs; default R2CCL_NICS")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="how long to stream")
    p.add_argument("--message", type=parse_size, default=parse_size("8MiB"), help="message size")
    p.add_argument("--sample", type=float, default=0.02, metavar="S", help="sampling period")
    p.add_argument("--step", action="append", default=[], metavar="AT:CMD",
                   help="process 0 runs shell command CMD at AT seconds (repeatable), e.g. "
                        "'1.0:jax-r2ccl testbed fail 1 2'")
    p.add_argument("--out", default="timeline", metavar="PREFIX", help="writes PREFIX.json and PREFIX.png")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S")


def _parse_steps(steps: list[str]) -> list[tuple[float, str]]:
    out = []
    for s in steps:
        at, sep, cmd = s.partition(":")
        try:
            t = float(at)
        except ValueError:
            t = -1
        if not sep or t < 0 or not cmd.strip():
            raise SystemExit(f"bench timeline: --step {s!r} is not AT:CMD")
        out.append((t, cmd))
    return sorted(out)


def main(args: argparse.Namespace) -> int:
    if args.num_processes != 2:
        print("bench timeline: runs on exactly 2 processes", file=sys.stderr)
        return 2
    steps = _parse_steps(args.step)
    dist = Dist(args.coordinator, args.num_processes, args.process_id, args.timeout)
    from ...transport.bootstrap import connect_jax
    from ...config import Config
    from ...transport.health import HealthMonitor
    cfg = Config.from_env()
    nics = [n.strip() for n in args.nics.split(",") if n.strip()] if args.nics else cfg.nic_list()
    ep = connect_jax(nics=nics, config=cfg, prefix="bench-timeline", timeout=args.timeout)
    mon = HealthMonitor(ep) if cfg.monitor_ms > 0 else None
    rank, peer = dist.rank, 1 - dist.rank
    n = args.message
    words = np.arange(n // 8 + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    base = words.view(np.uint8)[:n]

    def message(k: int) -> np.ndarray:
        return base ^ np.uint8((k * 37 + 11) & 0xFF)

    dist.barrier("timeline/start")
    t0 = time.time()
    samples, step_log, stop = [], [], threading.Event()

    def sampler():
        while not stop.is_set():
            t = time.time() - t0
            samples.append({"t": t, "rails": [{k: s[k] for k in ("rail", "nic", "state", "weight", "tx_bytes")}
                                              for s in ep.rail_stats(peer)]})
            stop.wait(args.sample)

    def run_steps():
        for at, cmd in steps:
            if stop.wait(max(0.0, t0 + at - time.time())):
                return
            s = time.time() - t0
            p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            step_log.append({"at": at, "t0": s, "t1": time.time() - t0, "cmd": cmd, "rc": p.returncode,
                             "output": (p.stdout + p.stderr).strip()[-500:]})

    threads = []
    if rank == 0:
        threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=run_steps, daemon=True)]
        for th in threads:
            th.start()
    # Stream, two messages in flight: before each message the sender says in a 1-byte flag
    # message whether one follows, so both sides stop together.
    k, wrong = 0, 0
    flag = np.zeros(1, np.uint8)
    pending: list = []   # (request, buffer, k)

    def settle(limit):
        nonlocal wrong
        while len(pending) > limit:
            req, b, j = pending.pop(0)
            req.wait(args.timeout)
            if rank == 1:
                wrong += int(not np.array_equal(b, message(j)))
    while True:
        if rank == 0:
            flag[0] = 1 if time.time() - t0 < args.duration else 0
            ep.send(peer, flag, tag=TAG_BASE + 2 * k, timeout=args.timeout)
            if not flag[0]:
                break
            m = message(k)
            pending.append((ep.isend(peer, m, tag=TAG_BASE + 2 * k + 1), m, k))
        else:
            ep.recv(peer, flag, tag=TAG_BASE + 2 * k, timeout=args.timeout)
            if not flag[0]:
                break
            b = np.empty(n, np.uint8)
            pending.append((ep.irecv(peer, b, tag=TAG_BASE + 2 * k + 1), b, k))
        settle(1)
        k += 1
    settle(0)
    stop.set()
    for th in threads:
        th.join(timeout=30)
    events = [dict(e, rank=rank) for e in (mon.events() if mon else [])]
    wrongs = dist.gather("timeline/wrong", wrong)
    everyones = dist.gather("timeline/events", events)
    rc = 0
    if rank == 0:
        total_wrong = sum(wrongs)
        result = {"config": {k: v for k, v in vars(args).items() if not callable(v)}, "nics": nics, "messages": k, "message_bytes": n, "wrong": total_wrong,
                  "t0_unix": t0, "samples": samples, "steps": step_log,
                  "events": sorted((dict(e, t=e["time"] - t0) for evs in everyones for e in evs),
                                   key=lambda e: e["t"])}
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
        print(f"bench timeline: {k} messages of {n} bytes in {args.duration:.1f} s, {total_wrong} wrong; "
              f"{len(samples)} samples, {len(step_log)} steps, {len(events)} events -> {args.out}.json")
        for s in step_log:
            print(f"  step at {s['t0']:.3f} s: {s['cmd']} (rc {s['rc']})")
        for e in result["events"]:
            where = f"rail {e['rail']}" if e["rail"] is not None else "NIC"
            print(f"  event at {e['t']:.3f} s, host {e['rank']}: {where} {e['nic']} {e['kind']}: {e['detail']}")
        try:
            plot(result, args.out + ".png")
            print(f"bench timeline: plot -> {args.out}.png")
        except ImportError:
            print("bench timeline: matplotlib is not installed (pip install 'jax_r2ccl[plot]'); JSON only",
                  file=sys.stderr)
        rc = 1 if total_wrong else 0
    if mon:
        mon.close()
    dist.barrier("timeline/end")
    ep.close()
    dist.shutdown()
    return rc


def rates(result: dict, window_s: float = 0.1) -> tuple[list[float], dict[int, list[float]]]:
    """Per rail MB/s over sliding windows of about window_s (time = the window's midpoint):
    bytes leave in bursts of chunks, so single samples swing between 0 and line rate."""
    s = result["samples"]
    step = max(1, int(round(window_s / max(1e-3, result["config"].get("sample", 0.02)))))
    ts, per = [], {}
    for a, b in zip(s, s[step:]):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        ts.append((a["t"] + b["t"]) / 2)
        for ra, rb in zip(a["rails"], b["rails"]):
            per.setdefault(ra["rail"], []).append((rb["tx_bytes"] - ra["tx_bytes"]) / dt / 1e6)
    return ts, per


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ts, per = rates(result)
    nic_of = {r["rail"]: r["nic"] for r in result["samples"][0]["rails"]} if result["samples"] else {}
    fig, (ax, axw) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    total = np.sum([per[r] for r in per], axis=0) if per else []
    for r in sorted(per):
        ax.plot(ts, per[r], lw=1.2, label=f"rail {r} ({nic_of.get(r, '?')})")
    if len(total):
        ax.plot(ts, total, lw=1.6, color="black", label="sum")
    for s in result["steps"]:
        for a in (ax, axw):
            a.axvline(s["t0"], color="red", ls="--", lw=0.8)
        ax.annotate(s["cmd"].split("/")[-1][:40], (s["t0"], ax.get_ylim()[1] * 0.97), rotation=90, va="top",
                    ha="right", fontsize=7, color="red")
    for e in result["events"]:
        if e["kind"] in ("link_down", "rail_failed", "degraded"):
            ax.plot([e["t"]], [0], marker="v", color="darkred", ms=6)
        elif e["kind"] in ("rail_recovered", "restored", "nic_readmitted"):
            ax.plot([e["t"]], [0], marker="^", color="green", ms=6)
    ax.set_ylabel("sent (MB/s, 100 ms windows)")
    ax.set_title(f"jax_r2ccl rails over time: {result['messages']} x {result['message_bytes'] >> 20} MiB, "
                 f"{result['wrong']} wrong (markers: failures/degradation v, recoveries ^)")
    ax.legend(loc="lower left", fontsize=8, ncol=5)
    ax.grid(alpha=0.3)
    for r in sorted(per):
        w = [next((x["weight"] for x in s["rails"] if x["rail"] == r), 0) if
             next((x["state"] for x in s["rails"] if x["rail"] == r), "down") == "up" else 0
             for s in result["samples"]]
        axw.step([s["t"] for s in result["samples"]], w, where="post", lw=1.2, label=f"rail {r}")
    axw.set_ylabel("weight (0: down)")
    axw.set_xlabel("time (s)")
    axw.set_ylim(-0.05, 1.1)
    axw.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
