"""`python -m jax_r2ccl sim calibrate BENCH.json... --rate 500mbit`: the simulator's model of
the test bed itself (hosts, NICs, tbf rate), set against what `bench allreduce --json`
measured there. Each host's capacity (healthy NICs) comes from the JSON: the capacities the
processes exchanged for the plan when there are three or more, else process 0's rails at the
end of the run (a rail that is down removes its NIC; a rail the monitor weighs w < 0.6
counts w, as in the monitor)."""

from __future__ import annotations

import argparse
import json
import sys

from .cluster import Cluster
from .costs import allreduce_seconds, busbw_GBps


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
        if cfg.get("bench", "allreduce") != "allreduce":
            continue
        world = int(cfg["num_processes"])
        nics = len([n for n in str(cfg.get("nics") or "").split(",") if n.strip()])
        cluster = Cluster.testbed(world, nics, rate, alpha_s=alpha_s)
        for r in bench["results"]:
            if r["impl"] != "r2ccl" or r.get("op", "allreduce") != "allreduce" or r["size_bytes"] < (1 << 20):
                continue
            caps = capacities_of(bench, r)
            pred = allreduce_seconds(cluster, r["size_bytes"], caps, r.get("plan") or "balance")
            measured = busbw_GBps(r["size_bytes"], r["time_us_median"] / 1e6, world)
            model = busbw_GBps(r["size_bytes"], pred["seconds"], world)
            rows.append({"file": path, "hosts": world, "nics": nics, "size": r["size"], "plan": pred["plan"],
                         "capacities": caps, "measured_busbw_GBps": measured, "model_busbw_GBps": model,
                         "error": (model - measured) / measured})
    return rows


def main(args: argparse.Namespace) -> int:
    rows = calibrate(args.bench_json, args.rate, args.alpha_us * 1e-6)
    if not rows:
        print("sim calibrate: no all-reduce rows of 1 MiB or more in the given files", file=sys.stderr)
        return 2
    print(f"# sim calibrate: the test bed at {args.rate} per NIC; busbw in GB/s; error = model vs measured")
    print(f"# {'file':44} {'hosts':>5} {'size':>6} {'plan':8} {'capacity':12} {'measured':>9} {'model':>9} {'error':>7}")
    for r in rows:
        cap = "/".join(f"{c:.2g}" for c in r["capacities"])
        name = r["file"] if len(r["file"]) <= 44 else "…" + r["file"][-43:]
        print(f"  {name:44} {r['hosts']:>5} {r['size']:>6} {r['plan']:8} {cap:12} {r['measured_busbw_GBps']:9.4f} "
              f"{r['model_busbw_GBps']:9.4f} {r['error']:+7.1%}")
    worst = max(abs(r["error"]) for r in rows)
    print(f"# worst error {worst:.1%} (limit {args.max_error:.0%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rate": args.rate, "rows": rows}, f, indent=1)
    return 0 if worst <= args.max_error else 1
