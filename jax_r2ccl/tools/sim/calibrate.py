"""`python -m jax_r2ccl sim calibrate BENCH.json... --rate 500mbit`: the simulator's model of
the test bed itself (hosts, NICs, tbf rate), set against what `bench allreduce --json`
measured there. Each host's capacity (healthy NICs) comes from the JSON: the capacities the
processes exchanged for the plan when there are three or more (two_level: each group's,
gathered by the bench), else each process's NICs with a rail up at the end of the run (as
recorded since issue 38: the ring exchanges no capacity), else process 0's rails at the end
of the run (a rail that is down removes its NIC; a rail the monitor weighs w < 0.6 counts w,
as in the monitor)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

from .cluster import Cluster, parse_rate
from .costs import allreduce_seconds, busbw_GBps
from .failures import Failure


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bench_json", nargs="+", help="JSON written by `bench allreduce --json`")
    p.add_argument("--rate", required=True, help="the test bed's per-NIC rate, e.g. 500mbit")
    p.add_argument("--alpha-us", type=float, default=150.0, help="per-message latency (default 150 us)")
    p.add_argument("--max-error", type=float, default=0.10, help="exit 1 when a row is further off (default 0.10)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the rows as JSON")


def capacities_of(bench: dict, row: dict) -> list[float]:
    """Per-host capacity in healthy NICs for one result row of a bench JSON."""
    caps = row.get("capacities") or []
    world = int(bench["config"]["num_processes"])
    if len(caps) == world:
        return [float(c) for c in caps]
    up = bench.get("nics_up_by_process") or []
    if len(up) == world and all(isinstance(u, int) for u in up):   # (an algorithm that exchanged none: the ring)
        return [float(u) for u in up]
    nics = len([n for n in str(bench["config"].get("nics") or "").split(",") if n.strip()])
    stats = bench.get("rail_stats") or {}
    if world != 2 or not stats:
        return [float(nics)] * world
    rails = next(iter(stats.values()))
    cap = 0.0
    for r in rails:
        if r["state"] == "up":
            w = float(r.get("weight", 1.0))
            cap += 1.0 if w >= 0.6 else w
    return [cap, cap]   # on the two-host bed a rail is one link: both ends see the same


def calibrate(paths: list[str], rate: str, alpha_s: float) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as f:
            bench = json.load(f)
        cfg = bench["config"]
        if cfg.get("bench", "allreduce") != "allreduce" or cfg.get("fault_cmd"):
            continue     # fault runs: see replay()
        world = int(cfg["num_processes"])
        nics = len([n for n in str(cfg.get("nics") or "").split(",") if n.strip()])
        cluster = Cluster.testbed(world, nics, rate, alpha_s=alpha_s)
        for r in bench["results"]:
            if r["impl"] != "r2ccl" or r.get("op", "allreduce") != "allreduce" or r["size_bytes"] < (1 << 20):
                continue
            caps = capacities_of(bench, r)
            # Runs from before the algorithms were recorded ran direct. two_level's groups each
            # chose their plan from what was asked (R2CCL_PLAN, auto by default).
            algo = r.get("algo") or "direct"
            plan = r.get("plan") if r.get("plan") not in (None, "", "-") else "balance"
            if algo == "two_level":
                plan = cfg.get("plan") or "auto"
            pred = allreduce_seconds(cluster, r["size_bytes"], caps, plan, algo, cfg.get("max_peers"))
            measured = busbw_GBps(r["size_bytes"], r["time_us_median"] / 1e6, world)
            model = busbw_GBps(r["size_bytes"], pred["seconds"], world)
            rows.append({"file": path, "hosts": world, "nics": nics, "size": r["size"],
                         "plan": pred["plan"] if pred["algo"] == "direct" else pred["algo"],
                         "capacities": caps, "measured_busbw_GBps": measured, "model_busbw_GBps": model,
                         "error": (model - measured) / measured})
    return rows


def _fault_words(cmd: str) -> str:
    """The fault command without the test-bed program's path: 'fail 1 2; sleep 1.5; ...'."""
    for marker in ("netns.sh", "testbed.py", "testbed"):
        if marker in cmd:
            return cmd.split(marker, 1)[-1].strip()
    return cmd.strip()


def fault_trace(cmd: str, at: float, base_rate: float) -> list[Failure]:
    """The failures a bench run's --fault-cmd injected, `at` seconds into its loop: test-bed
    fail/heal/blackhole/degrade/flap commands and sleeps, one after another. A test-bed command
    is `jax-r2ccl testbed VERB ...` in any spelling (python -m jax_r2ccl testbed, the file
    testbed.py run by path), or the first test-bed script's `netns.sh VERB ...` that the
    recorded runs in tests/data/sim used."""
    t, out, open_ = at, [], {}
    for part in cmd.split(";"):
        words = shlex.split(part)
        if not words:
            continue
        if words[0] == "sleep":
            t += float(words[1])
            continue
        at_script = next((i for i, w in enumerate(words[:5])
                          if w.endswith(("netns.sh", "testbed.py")) or w == "testbed"), None)
        if at_script is None or at_script + 3 > len(words):
            raise ValueError(f"fault command not understood: {part.strip()!r}")
        verb, rest = words[at_script + 1], words[at_script + 2:]
        host, nic = int(rest[0]), int(rest[1])
        key = (host, nic)
        if verb in ("fail", "blackhole") or (verb == "degrade" and rest[2] != "base"):
            factor = 0.0 if verb != "degrade" else parse_rate(rest[2]) / base_rate
            open_[key] = (t, "down" if verb == "fail" else verb, factor)
        elif verb in ("heal",) or verb == "degrade":
            if key in open_:
                t0, kind, factor = open_.pop(key)
                out.append(Failure(t0, host, nic, kind, max(t - t0, 1e-3), factor))
        elif verb == "flap":
            down_s, count = int(rest[2]) / 1000, int(rest[3])
            out.append(Failure(t, host, nic, "flap", 2 * down_s * count, 0.0, 2 * down_s))
            t += 2 * down_s * count
        else:
            raise ValueError(f"fault command not understood: {part.strip()!r}")
    for key, (t0, kind, factor) in open_.items():
        out.append(Failure(t0, key[0], key[1], kind, 1e6, factor))
    return sorted(out, key=lambda f: f.t)


def replay(paths: list[str], rate: str, alpha_s: float) -> list[dict]:
    """The fault runs (bench JSON with a --fault-cmd): the loop's measured wall time against the
    simulator's, which replays the same faults at the same moments under jax_r2ccl's policy."""
    from .engine import time_to_finish
    from .policies import POLICIES
    from .workloads import CollectiveLoop
    rows = []
    for path in paths:
        with open(path) as f:
            bench = json.load(f)
        cfg = bench["config"]
        if not cfg.get("fault_cmd") or cfg.get("fault_at") is None or cfg.get("bench", "allreduce") != "allreduce":
            continue
        its = [i for i in bench.get("iterations", []) if i["impl"] == "r2ccl" and i.get("op", "allreduce") == "allreduce"]
        if not its:
            continue
        size = max(i["size_bytes"] for i in its)
        loop = [i for i in its if i["size_bytes"] == size]
        # The loop ends when its last process finishes (under the ring, process 0 is early);
        # files from before the ends were gathered have process 0's only.
        ends = [e.get(str(size)) for e in bench.get("loop_end_by_process") or [] if e and e.get(str(size))]
        measured = max(ends + [loop[-1]["t_end"]]) - loop[0]["t_start"]
        world = int(cfg["num_processes"])
        nics = len([n for n in str(cfg.get("nics") or "").split(",") if n.strip()])
        cluster = Cluster.testbed(world, nics, rate, alpha_s=alpha_s)
        trace = fault_trace(cfg["fault_cmd"], float(cfg["fault_at"]), cluster.nic_bps)
        policy = POLICIES["jax_r2ccl"]
        plan = cfg.get("plan") or "balance"
        policy = dataclasses.replace(policy, plan=plan)
        algo = next((i["algo"] for i in loop if i.get("algo")), "direct")
        policy = dataclasses.replace(policy, algo=algo)
        if algo == "two_level":
            policy = dataclasses.replace(policy, plan=cfg.get("plan") or "auto")
        wl = CollectiveLoop(float(size), algo=algo, max_peers=cfg.get("max_peers"))
        model = time_to_finish(cluster, wl, trace, len(loop), policy)
        healthy = len(loop) * wl.step(cluster, {}, policy.plan)[0]
        rows.append({"file": path, "hosts": world, "size": size, "iters": len(loop),
                     "fault": _fault_words(cfg["fault_cmd"]), "measured_s": measured,
                     "model_s": model, "model_healthy_s": healthy, "error": (model - measured) / measured})
    return rows


def main(args: argparse.Namespace) -> int:
    rows = calibrate(args.bench_json, args.rate, args.alpha_us * 1e-6)
    faults = replay(args.bench_json, args.rate, args.alpha_us * 1e-6)
    if not rows and not faults:
        print("sim calibrate: no all-reduce rows of 1 MiB or more in the given files", file=sys.stderr)
        return 2
    worst = 0.0
    if rows:
        print(f"# sim calibrate: the test bed at {args.rate} per NIC; busbw in GB/s; error = model vs measured")
        print(f"# {'file':44} {'hosts':>5} {'size':>6} {'plan':8} {'capacity':12} {'measured':>9} {'model':>9} "
              f"{'error':>7}")
        for r in rows:
            cap = "/".join(f"{c:.2g}" for c in r["capacities"])
            print(f"  {_short(r['file']):44} {r['hosts']:>5} {r['size']:>6} {r['plan']:8} {cap:12} "
                  f"{r['measured_busbw_GBps']:9.4f} {r['model_busbw_GBps']:9.4f} {r['error']:+7.1%}")
        worst = max(abs(r["error"]) for r in rows)
    if faults:
        print(f"# fault runs replayed (jax_r2ccl's policy, the same faults at the same moments): the loop's wall "
              f"time in s")
        print(f"# {'file':44} {'fault':28} {'iters':>5} {'measured':>9} {'model':>9} {'error':>7} {'no-fault model':>14}")
        for r in faults:
            print(f"  {_short(r['file']):44} {r['fault'][:28]:28} {r['iters']:5d} {r['measured_s']:9.3f} "
                  f"{r['model_s']:9.3f} {r['error']:+7.1%} {r['model_healthy_s']:14.3f}")
        worst = max([worst] + [abs(r["error"]) for r in faults])
    print(f"# worst error {worst:.1%} (limit {args.max_error:.0%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rate": args.rate, "rows": rows, "fault_runs": faults}, f, indent=1)
    return 0 if worst <= args.max_error else 1


def _short(name: str) -> str:
    return name if len(name) <= 44 else "…" + name[-43:]
