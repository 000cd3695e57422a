"""`python -m jax_r2ccl sim run`: a data-parallel training job on a large cluster through a NIC
failure trace, under several fault-handling policies; the throughput each loses against the
same job without failures.

So far (issue 6 is open): training workloads whose inter-server traffic is the gradient
all-reduce, and the policies crash-and-restart (NCCL's default), R2CCL's Balance and
R2CC-AllReduce, and jax_r2ccl's planner. Not yet: tensor/pipeline-parallel traffic across
servers, serving, AdapCC- and DejaVu-like policies, flapping. The assumptions are named in
WORKLOADS and POLICIES below; the all-reduce costs are the planner's own (csrc/coll/plan.cc)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from .cluster import Cluster, parse_rate
from .costs import allreduce_seconds
from .failures import capacity_segments, parse_failures


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    params: float            # trainable parameters (the gradient all-reduce moves 2 bytes each)
    compute_s: float         # forward + backward of one step on one GPU, communication excluded
    overlap: float = 0.8     # fraction of the compute the gradient all-reduce can hide behind
    grad_bytes_per_param: float = 2.0

    def step_seconds(self, comm_s: float) -> float:
        return self.compute_s + max(0.0, comm_s - self.overlap * self.compute_s)


# compute_s from 6 x params x tokens / (989 TFLOP/s x 40% MFU), 16 Ki tokens per GPU per step.
WORKLOADS = {
    "gpt-2.7b-dp": Workload("gpt-2.7b-dp", 2.7e9, 6 * 2.7e9 * 16384 / (989e12 * 0.4)),
    "gpt-13b-dp": Workload("gpt-13b-dp", 13e9, 6 * 13e9 * 16384 / (989e12 * 0.4)),
}


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    plan: str | None         # all-reduce plan while degraded; None: crash and restart
    failover_s: float = 0.0  # progress lost at each failure before traffic moves


POLICIES = {
    # The job dies on a NIC failure and restarts from its last checkpoint on healthy spares.
    "crash-restart": Policy("crash-restart", None),
    # R2CCL: striping over the survivors (Balance) or R2CC-AllReduce, after its failover.
    "r2ccl-balance": Policy("r2ccl-balance", "balance", failover_s=0.5),
    "r2ccl-r2cc": Policy("r2ccl-r2cc", "r2cc", failover_s=0.5),
    # jax_r2ccl: kernel link events fail the rails at once; the planner re-plans every call.
    "jax_r2ccl": Policy("jax_r2ccl", "auto", failover_s=0.05),
}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=1024)
    p.add_argument("--gpus-per-server", type=int, default=8)
    p.add_argument("--nics-per-server", type=int, default=8)
    p.add_argument("--nic-rate", default="400gbit")
    p.add_argument("--workload", default="gpt-2.7b-dp", choices=sorted(WORKLOADS))
    p.add_argument("--steps", type=int, default=10000, help="fault-free steps the horizon holds")
    p.add_argument("--failures", default="poisson:0.001",
                   help="poisson:RATE[:MEAN_REPAIR_S] (per NIC per hour), a trace JSON file, or none")
    p.add_argument("--policies", default="all", help=f"comma-separated, or all: {', '.join(POLICIES)}")
    p.add_argument("--checkpoint-s", type=float, default=1800.0, help="checkpoint period (crash-restart)")
    p.add_argument("--restart-s", type=float, default=600.0, help="restart time after a crash")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--plot", default=None, metavar="PNG", help="bar chart of the overheads (matplotlib)")


def simulate(cluster: Cluster, workload: Workload, failures, seconds: float, policies: list[Policy],
             checkpoint_s: float, restart_s: float) -> list[dict]:
    """Steps each policy completes in `seconds` of wall time, against the fault-free job."""
    nbytes = workload.params * workload.grad_bytes_per_param
    healthy_step = workload.step_seconds(allreduce_seconds(cluster, nbytes, plan="balance")["seconds"])
    fault_free = seconds / healthy_step
    cache: dict[tuple, float] = {}

    def step_s(plan: str, caps) -> float:
        key = (plan, tuple(round(float(c), 6) for c in caps))
        if key not in cache:
            cache[key] = workload.step_seconds(allreduce_seconds(cluster, nbytes, list(caps), plan)["seconds"])
        return cache[key]

    segments = list(capacity_segments(cluster, failures, seconds))
    n_failures = sum(1 for f in failures if f.t < seconds)
    out = []
    for pol in policies:
        steps = 0.0
        if pol.plan is None:
            # Progress since the last checkpoint is lost at a failure; nothing moves while the
            # job restarts; it then runs on healthy hardware.
            saved, last_ckpt, down_until = 0.0, 0.0, 0.0
            for f in sorted((f for f in failures if f.t < seconds), key=lambda f: f.t):
                if f.t < down_until:
                    continue
                run_s = f.t - down_until
                done = run_s / healthy_step
                kept = int((f.t - last_ckpt) // checkpoint_s) if f.t > last_ckpt else 0
                saved += min(done, kept * checkpoint_s / healthy_step)
                down_until = f.t + restart_s
                last_ckpt = down_until
            if down_until < seconds:
                saved += (seconds - down_until) / healthy_step
            steps = saved
        else:
            for start, end, caps, begins in segments:
                stall = pol.failover_s if begins else 0.0
                steps += max(0.0, end - start - stall) / step_s(pol.plan, caps)
        out.append({"policy": pol.name, "workload": workload.name, "gpus": cluster.servers * cluster.gpus_per_server,
                    "overhead": 1.0 - steps / fault_free, "failures": n_failures, "steps": steps,
                    "fault_free_steps": fault_free, "healthy_step_s": healthy_step})
    return out


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.gpus % args.gpus_per_server:
        raise SystemExit("sim run: --gpus must be a multiple of --gpus-per-server")
    cluster = Cluster(servers=args.gpus // args.gpus_per_server, gpus_per_server=args.gpus_per_server,
                      nics_per_server=args.nics_per_server, nic_bps=parse_rate(args.nic_rate))
    wl = WORKLOADS[args.workload]
    names = list(POLICIES) if args.policies == "all" else [p.strip() for p in args.policies.split(",")]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise SystemExit(f"sim run: unknown policies {unknown}; use {', '.join(POLICIES)}")
    nbytes = wl.params * wl.grad_bytes_per_param
    healthy_step = wl.step_seconds(allreduce_seconds(cluster, nbytes, plan="balance")["seconds"])
    seconds = args.steps * healthy_step
    failures = parse_failures(args.failures, cluster, seconds, args.seed)
    rows = simulate(cluster, wl, failures, seconds, [POLICIES[n] for n in names], args.checkpoint_s, args.restart_s)
    print(f"# sim run: {args.gpus} GPUs ({cluster.servers} servers x {cluster.gpus_per_server}, "
          f"{cluster.nics_per_server} x {args.nic_rate} NICs), {wl.name}, {args.steps} fault-free steps of "
          f"{healthy_step:.3f} s ({seconds / 3600:.1f} h), failures {args.failures} (seed {args.seed}): "
          f"{len([f for f in failures if f.t < seconds])} in the horizon")
    print(f"# {'policy':16} {'overhead':>9} {'steps':>10}")
    for r in rows:
        print(f"  {r['policy']:16} {r['overhead']:9.3%} {r['steps']:10.0f}")
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
            print("sim run: matplotlib is not installed (pip install 'jax_r2ccl[plot]')", file=sys.stderr)
            return 0
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar([r["policy"] for r in rows], [100 * r["overhead"] for r in rows], color="tab:blue")
        ax.set_ylabel("throughput lost (%)")
        ax.set_title(f"{wl.name} on {args.gpus} GPUs, failures {args.failures}")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0
