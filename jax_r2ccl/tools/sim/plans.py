"""`python -m jax_r2ccl sim plans --gpus 1024 --x 0.25,0.5`: the all-reduce plans at scale,
one server at a fraction 1 - X of its NICs, every plan's time against healthy, from the
planner's own cost model (the same function the running library plans with)."""

from __future__ import annotations

import argparse
import json

from ... import _core
from .cluster import Cluster, parse_rate
from .costs import allreduce_seconds

# The planner's own plans (csrc/coll/plan.h), auto last: it picks among the others.
PLANS = tuple(p for p in _core.names()["plans"] if p != "auto") + ("auto",)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=1024, help="GPUs in all (default 1024)")
    p.add_argument("--gpus-per-server", type=int, default=8)
    p.add_argument("--nics-per-server", type=int, default=8)
    p.add_argument("--nic-rate", default="400gbit", help="per NIC (default 400gbit)")
    p.add_argument("--size", type=float, default=1 << 30, help="bytes per all-reduce (default 1 GiB)")
    p.add_argument("--x", default="0.25,0.5", help="fractions of one server's NICs lost")
    p.add_argument("--json", default=None, metavar="PATH")


def table(cluster: Cluster, nbytes: float, xs: list[float]) -> list[dict]:
    h = allreduce_seconds(cluster, nbytes, plan="balance", algo="direct")
    healthy, healthy_net = h["seconds"], h["inter_s"]
    rows = []
    n = cluster.nics_per_server
    for x in xs:
        caps = [float(n)] * (cluster.servers - 1) + [n * (1 - x)]
        for plan in PLANS:
            r = allreduce_seconds(cluster, nbytes, caps, plan, "direct")
            rows.append({"x": x, "plan": plan, "ran": r["plan"], "seconds": r["seconds"],
                         "vs_healthy": r["seconds"] / healthy, "net_vs_healthy": r["inter_s"] / healthy_net,
                         "slow_share": r["shares"][-1], "servers": cluster.servers})
    return rows


def main(args: argparse.Namespace) -> int:
    if args.gpus % args.gpus_per_server:
        raise SystemExit("sim plans: --gpus must be a multiple of --gpus-per-server")
    cluster = Cluster(servers=args.gpus // args.gpus_per_server, gpus_per_server=args.gpus_per_server,
                      nics_per_server=args.nics_per_server, nic_bps=parse_rate(args.nic_rate))
    xs = [float(v) for v in args.x.split(",") if v.strip()]
    rows = table(cluster, args.size, xs)
    print(f"# sim plans: {args.gpus} GPUs = {cluster.servers} servers x {cluster.gpus_per_server} GPUs, "
          f"{cluster.nics_per_server} x {args.nic_rate} NICs; all-reduce of {args.size / 2**20:.0f} MiB; "
          f"one server at 1 - X of its NICs")
    print("# time: NVLink inside the servers, then the owner exchange between them; net: the exchange alone")
    print(f"# {'X':>5} {'plan':9} {'ran':9} {'time(ms)':>10} {'vs healthy':>11} {'net vs healthy':>15} "
          f"{'slow server owns':>17}")
    for r in rows:
        print(f"  {r['x']:5.2f} {r['plan']:9} {r['ran']:9} {r['seconds'] * 1e3:10.3f} {r['vs_healthy']:11.4f} "
              f"{r['net_vs_healthy']:15.4f} {r['slow_share']:17.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not callable(v)}, "results": rows}, f,
                      indent=1)
    return 0
