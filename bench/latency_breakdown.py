#!/usr/bin/env python3
"""Where a small p2p round trip's time goes, step by step, on loopback rails.

Two processes (this one and a child) do what `bench p2p` times on its receiver: post the
receive of a 4 KiB message, send "go", wait for the data. The sender waits for "go" and sends
the data. Prints the receiver's median time of each step, for the caller's path (the default
R2CCL_POLL_US) and for the progress thread alone (R2CCL_POLL_US=0), RUNS times each in turn.

    python bench/latency_breakdown.py [--rails 4] [--iters 1000] [--runs 3] [--size 4096]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def rank_main(rank: int, rdv: str, rails: int, iters: int, size: int) -> None:
    from jax_r2ccl.transport.endpoint import Endpoint
    nics = [f"127.0.0.{i + 1}" for i in range(rails)]
    ep = Endpoint(rank, 2, nics=nics, secret=b"latency-breakdown-secret")
    mine, theirs = os.path.join(rdv, f"a{rank}"), os.path.join(rdv, f"a{1 - rank}")
    with open(mine + ".tmp", "w") as f:
        json.dump(ep.addresses, f)
    os.rename(mine + ".tmp", mine)
    deadline = time.monotonic() + 30
    while not os.path.exists(theirs):
        if time.monotonic() > deadline:
            raise SystemExit("the other process never published its addresses")
        time.sleep(0.01)
    with open(theirs) as f:
        ep.add_peer(1 - rank, json.load(f))
    ep.wait_ready(timeout=30)
    peer, buf, empty = 1 - rank, np.zeros(size, np.uint8), np.empty(0, np.uint8)
    pc, steps = time.perf_counter, []
    for i in range(iters + 100):
        if rank == 0:       # the sender
            ep.send(peer, empty, 2, timeout=30)            # ready
            ep.recv(peer, empty, 3, timeout=30)            # go
            ep.isend(peer, buf, 1).wait(30)
        else:               # the receiver, timed
            ep.recv(peer, empty, 2, timeout=30)
            t0 = pc()
            r = ep.irecv(peer, buf, 1)
            t1 = pc()
            g = ep.isend(peer, empty, 3)
            t2 = pc()
            r.wait(30)
            t3 = pc()
            g.wait(30)
            t4 = pc()
            if i >= 100:
                steps.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
    if rank == 1:
        med = np.median(np.array(steps) * 1e6, axis=0)
        print(json.dumps([round(float(x), 1) for x in med]), flush=True)
    time.sleep(0.3)
    ep.close()


def one_run(args, poll_us: str | None) -> list[float]:
    env = dict(os.environ)
    if poll_us is not None:
        env["R2CCL_POLL_US"] = poll_us
    with tempfile.TemporaryDirectory() as rdv:
        cmd = [sys.executable, __file__, "--rank", "", "--rdv", rdv, "--rails", str(args.rails),
               "--iters", str(args.iters), "--size", str(args.size)]
        cmd[3] = "0"
        sender = subprocess.Popen(cmd, env=env)
        cmd[3] = "1"
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        sender.wait(timeout=60)
        if out.returncode != 0 or sender.returncode != 0:
            raise SystemExit(f"a process failed:\n{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rails", type=int, default=4)
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rdv", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return rank_main(int(args.rank), args.rdv, args.rails, args.iters, args.size)
    print(f"# {args.size} B over {args.rails} loopback rails, {args.iters} iterations, receiver's medians (us)")
    print(f"# {'path':<14} {'post recv':>9} {'post go':>8} {'wait data':>9} {'wait go':>8} {'total':>8}")
    for _ in range(args.runs):
        for name, poll in (("caller's path", None), ("thread only", "0")):
            m = one_run(args, poll)
            print(f"  {name:<14} {m[0]:>9.1f} {m[1]:>8.1f} {m[2]:>9.1f} {m[3]:>8.1f} {m[4]:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
