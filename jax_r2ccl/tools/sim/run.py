"""`python -m jax_r2ccl sim [run] --gpus 1024 --workload gpt-13b-tp-pp --failures SPEC
--policies all`: a training job or a serving fleet on a large cluster through a NIC failure
trace, under each fault-handling policy; the throughput (training) or request latency (serving)
each loses against the same job without failures, as a table, JSON and a PNG.

overhead: over the whole horizon. active: over the time some failure is in force (training) or
over the requests that met one (serving): what "overhead under an active failure" means in the
R2CCL paper. The workloads are in workloads.py, the policies and their timing constants in
policies.py, the restart costs in engine.Restart: every number there is an assumption or a
published figure, named where it is set."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .cluster import Cluster, parse_rate
from .engine import Restart, run_serving, run_training
from .failures import PRESETS, parse_failures
from .policies import POLICIES
from .workloads import WORKLOADS, Serving


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=1024)
    p.add_argument("--gpus-per-server", type=int, default=8)
    p.add_argument("--nics-per-server", type=int, default=8)
    p.add_argument("--nic-rate", default="400gbit")
    p.add_argument("--fused-ports", type=int, default=1,
                   help="NIC ports fused into one device (nccl-failover needs 2 or more; default 1)")
    p.add_argument("--workload", default="gpt-2.7b-dp", choices=sorted(WORKLOADS))
    p.add_argument("--steps", type=int, default=10000, help="training: fault-free steps the horizon holds")
    p.add_argument("--hours", type=float, default=None, help="the horizon (default: --steps for training, 3 h serving)")
    p.add_argument("--failures", default="poisson:0.001",
                   help=f"poisson:RATE[:MEAN_REPAIR_S] (per NIC per hour), a preset ({', '.join(PRESETS)}, "
                        f"scaled as llama3:x100), a trace JSON file, or none")
    p.add_argument("--degrade-fraction", type=float, default=0.0, help="share of failures that slow a NIC to 1/10")
    p.add_argument("--flap-fraction", type=float, default=0.0, help="share of failures that flap (100 ms period)")
    p.add_argument("--blackhole-fraction", type=float, default=0.0,
                   help="share of failures that black-hole (link up, nothing gets through: no link event)")
    p.add_argument("--policies", default="all", help=f"comma-separated, or all: {', '.join(POLICIES)}")
    p.add_argument("--checkpoint-s", type=float, default=1800.0, help="checkpoint period (crash-restart)")
    p.add_argument("--restart-s", type=float, default=600.0, help="restart time after a crash")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--plot", default=None, metavar="PNG", help="bar chart of the overheads (matplotlib)")
    p.add_argument("--list", action="store_true", help="print the workloads and policies with what each assumes")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


class Progress:
    """A one-line bar on stderr."""

    def __init__(self, total: int, enabled: bool, width: int = 30):
        self.total, self.enabled, self.width, self.done = max(1, total), enabled, width, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            k = self.width * self.done // self.total
            sys.stderr.write(f"\r[{'#' * k}{'.' * (self.width - k)}] {self.done}/{self.total} {label:24}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def footprint(cluster: Cluster, wl) -> dict | None:
    """What one host holds for the training job's gradient all-reduce between servers (the
    algorithm the library picks, its peers, connections and memory: costs.host_footprint),
    or None when there is none (one server, serving)."""
    import dataclasses
    from .costs import host_footprint
    if isinstance(wl, Serving):
        return None
    nbytes = getattr(wl, "nbytes", None)
    servers = cluster.servers
    if nbytes is None:
        nbytes = wl.params / wl.pp * wl.grad_bytes if wl.pp > 1 or wl.tp > 1 else wl.params * wl.grad_bytes
        servers = cluster.servers // wl.pp
    if servers < 2:
        return None
    fp = host_footprint(dataclasses.replace(cluster, servers=servers), float(nbytes))
    return {**fp, "servers": servers, "bytes": float(nbytes)}


def cluster_of(args: argparse.Namespace) -> Cluster:
    if args.gpus <= 0 or args.gpus % args.gpus_per_server:
        raise ValueError(f"--gpus {args.gpus} must be a positive multiple of --gpus-per-server {args.gpus_per_server}")
    return Cluster(servers=args.gpus // args.gpus_per_server, gpus_per_server=args.gpus_per_server,
                   nics_per_server=args.nics_per_server, nic_bps=parse_rate(args.nic_rate))


def simulate(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    cluster = cluster_of(args)
    wl = WORKLOADS[args.workload]
    wl.check(cluster)
    serving = isinstance(wl, Serving)
    names = list(POLICIES) if args.policies == "all" else [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; use {', '.join(POLICIES)}")
    if args.policies == "all" and not serving:
        names = [n for n in names if not POLICIES[n].serving_only]
    bad = [n for n in names if POLICIES[n].serving_only and not serving]
    if bad:
        raise ValueError(f"policies {bad} apply to serving workloads only")
    restart = Restart(restart_s=args.restart_s, checkpoint_s=args.checkpoint_s)
    if args.hours is not None:
        if args.hours <= 0:
            raise ValueError("--hours must be > 0")
        seconds = args.hours * 3600
    elif serving:
        seconds = 3 * 3600.0
    else:
        seconds = args.steps * wl.step(cluster, {}, "balance")[0]
    failures = parse_failures(args.failures, cluster, seconds, args.seed, degrade_fraction=args.degrade_fraction,
                              flap_fraction=args.flap_fraction, blackhole_fraction=args.blackhole_fraction)
    bar = Progress(len(names), sys.stderr.isatty() if args.progress is None else args.progress)
    rows = []
    for n in names:
        if serving:
            rows.append(run_serving(cluster, wl, failures, seconds, POLICIES[n], restart, args.fused_ports, args.seed))
        else:
            rows.append(run_training(cluster, wl, failures, seconds, POLICIES[n], restart, args.fused_ports))
        bar.step(n)
    info = {"cluster": cluster, "workload": wl, "seconds": seconds,
            "failures_in_horizon": sum(1 for f in failures if f.t < seconds)}
    return info, rows


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.list:
        print("# workloads")
        for w in WORKLOADS.values():
            print(f"  {w.name:16} {w.kind:9} {w.doc}")
        print("# policies")
        for p in POLICIES.values():
            print(f"  {p.name:16} {'serving' if p.serving_only else 'all':9} {p.doc}")
        return 0
    try:
        info, rows = simulate(args)
    except ValueError as e:
        print(f"sim: {e}", file=sys.stderr)
        return 2
    cluster, wl = info["cluster"], info["workload"]
    serving = isinstance(wl, Serving)
    print(f"# sim: {args.gpus} GPUs ({cluster.servers} servers x {cluster.gpus_per_server}, "
          f"{cluster.nics_per_server} x {args.nic_rate} NICs), {wl.name} ({wl.doc}), {info['seconds'] / 3600:.2f} h, "
          f"failures {args.failures} (seed {args.seed}): {info['failures_in_horizon']} in the horizon")
    if serving:
        r0 = rows[0] if rows else {}
        print(f"# {r0.get('requests', 0):,} requests, {r0.get('mean_latency_s', 0):.2f} s each on average "
              f"({1e3 * r0.get('tpot_s', 0):.2f} ms per output token)")
        print(f"# latency overhead: mean over all requests; active: over the requests a failure met, and")
        print(f"# their time to first token and time per output token")
        print(f"# {'policy':14} {'overhead':>9} {'active':>9} {'TTFT':>9} {'TPOT':>9} {'hit':>8} {'worst(s)':>9} "
              f"{'crashes':>7}")
        for r in rows:
            print(f"  {r['policy']:14} {r['overhead']:9.4%} {r['overhead_active']:9.3%} "
                  f"{r['ttft_overhead_active']:9.3%} {r['tpot_overhead_active']:9.3%} {r['requests_hit']:8d} "
                  f"{r['worst_extra_s']:9.3f} {r['crashes']:7d}")
    else:
        fp = footprint(cluster, wl)
        if fp:
            print(f"# jax_r2ccl's gradient all-reduce among {fp['servers']} servers ({fp['bytes'] / 2**30:.2f} GiB per "
                  f"server): algorithm {fp['algo']}, {fp['peers']} peers and {fp['connections']} connections per host; "
                  f"memory per host: socket buffers {fp['socket_buffer_bytes'] / 2**20:.0f} MiB, receive buffers "
                  f"{fp['buffer_bytes'] / 2**20:.0f} MiB")
        print(f"# throughput overhead: over the horizon; active: while a failure is in force")
        print(f"# {'policy':14} {'overhead':>9} {'active':>9} {'crashes':>7} {'failovers':>9} {'steps':>10}")
        for r in rows:
            print(f"  {r['policy']:14} {r['overhead']:9.3%} {r['overhead_active']:9.3%} {r['crashes']:7d} "
                  f"{r['failovers']:9d} {r['steps']:10.0f}")
    print(f"# simulated in {time.monotonic() - t0:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not callable(v)}, "results": rows}, f,
                      indent=1)
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("sim: matplotlib is not installed (pip install 'jax_r2ccl[plot]'); no plot", file=sys.stderr)
            return 0
        fig, ax = plt.subplots(figsize=(8, 3.6))
        names = [r["policy"] for r in rows]
        ax.bar([i - 0.2 for i in range(len(rows))], [100 * r["overhead"] for r in rows], 0.4, label="over the horizon")
        ax.bar([i + 0.2 for i in range(len(rows))], [100 * r["overhead_active"] for r in rows], 0.4,
               label="while a failure is in force" if not serving else "requests a failure met")
        ax.set_xticks(range(len(rows)), names, rotation=20)
        ax.set_yscale("symlog", linthresh=0.1)
        top = max([100 * max(r["overhead"], r["overhead_active"]) for r in rows] + [1.0])
        ax.set_ylim(0, top * 3)
        ax.set_ylabel(("latency" if serving else "throughput") + " overhead (%)")
        ax.set_title(f"{wl.name} on {args.gpus} GPUs, failures {args.failures}", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0
