"""bench/nccl_smoke.py - the NCCL plugin under NCCL itself, on one GPU made to look like two hosts
(bench/nccl_check.sh runs it; the R2CCL paper's headline experiment, on one GPU).

Two JAX processes share the one GPU. Each gets its own NCCL_HOSTID, so NCCL takes them for two
hosts and moves their collectives over the network transport (NCCL_P2P_DISABLE=1 and
NCCL_SHM_DISABLE=1 too, and, if NCCL still refuses, NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE=1).
The step is a plain `jit` over an array sharded across the two processes, with no shard_map and
no jax_r2ccl function in it: a sum over the sharded axis, a reshard and a gather, which XLA's
partitioner turns into NCCL all-reduce, all-to-all / collective-permute and all-gather. Every
result is checked against numpy, bit for bit (integers: exact in any order).

--transport r2ccl: jax_r2ccl.initialize(nccl=True) before the backends (NCCL_NET_PLUGIN, NCCL_NET),
    two rails (R2CCL_NICS=127.0.0.1,127.0.0.2), and, mid-loop, rail 1 of every plugin connection of
    process 0 closed and healed again (R2CCL_TEST_FAULT_FILE): the loop must stay exact and on.
--transport socket: NCCL's own socket transport (NCCL_NET=Socket) on the same loopback.
--cut-address A: instead of the plugin's fault hook, `iptables` drops traffic between A and A
    mid-loop (root only): one address going away, for both transports alike; ours must stay
    exact and on, NCCL's socket transport fails, and the time it took is reported.

Prints NCCL's INFO lines that name the network it uses, one line per phase (healthy, faulted,
healed) with the median step time, and ends with "nccl_smoke: PASS ..." or "nccl_smoke: FAIL ...".
--platform cpu (the dry run): the same program and checks on JAX's CPU backend (no NCCL; XLA's
CPU collectives), so everything but NCCL itself is exercised where no GPU is."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def child(a) -> int:
    """One process of the pair."""
    rank = a.process_id
    env_note = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "R2CCL_"))}
    import jax
    jax.config.update("jax_platforms", a.platform)
    if a.platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=a.coordinator, num_processes=2, process_id=rank)
    import jax_r2ccl
    if a.transport == "r2ccl" and a.platform == "cuda":
        jax_r2ccl.initialize(nccl=True)   # before the backends: NCCL reads its environment at its first communicator
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    devices = jax.devices()
    assert len(devices) == 2, f"expected one device per process, got {devices}"
    mesh = jax.make_mesh((2,), ("x",), devices=devices)
    n = a.elements
    rows = np.arange(2 * n, dtype=np.int32).reshape(2, n) * 7 + 3
    sharded = NamedSharding(mesh, P("x", None))
    cols = NamedSharding(mesh, P(None, "x"))
    replicated = NamedSharding(mesh, P())

    def make(step):
        local = rows[rank:rank + 1] + step
        return jax.make_array_from_single_device_arrays((2, n), sharded, [jax.device_put(local, jax.local_devices()[0])])

    total = jax.jit(lambda x: x.sum(axis=0), out_shardings=replicated)       # all-reduce
    reshard = jax.jit(lambda x: x * 2, out_shardings=cols)                   # all-to-all
    gather = jax.jit(lambda x: x + 1, out_shardings=replicated)              # all-gather

    def check(step, s, r, g):
        want_sum = (rows + step).sum(axis=0)
        got_sum = np.asarray(s.addressable_shards[0].data)
        assert np.array_equal(got_sum, want_sum), f"step {step}: the sum differs"
        half = n // 2
        got_cols = np.asarray(r.addressable_shards[0].data)
        assert np.array_equal(got_cols, ((rows + step) * 2)[:, rank * half:(rank + 1) * half]), f"step {step}: the reshard differs"
        assert np.array_equal(np.asarray(g.addressable_shards[0].data), rows + step + 1), f"step {step}: the gather differs"

    fault_file = os.environ.get("R2CCL_TEST_FAULT_FILE")
    cut_at, heal_at = a.steps // 3, 2 * a.steps // 3
    times, phases = [], []
    t_err = None
    for step in range(a.steps):
        if rank == 0 and step in (cut_at, heal_at):
            what = "close 1" if step == cut_at else "heal 1"
            if a.cut_address:
                verb = "-I" if step == cut_at else "-D"
                cmd = ["iptables", verb, "INPUT", "-s", a.cut_address, "-d", a.cut_address, "-j", "DROP"]
                subprocess.run(cmd, check=True, timeout=10)
                what = " ".join(cmd)
            elif fault_file and a.transport == "r2ccl":
                with open(fault_file + ".tmp", "w") as f:
                    f.write(what + "\n")
                os.replace(fault_file + ".tmp", fault_file)
            print(f"[process 0] step {step}: {what}", flush=True)
        x = make(step)
        t0 = time.perf_counter()
        try:
            s, r, g = total(x), reshard(x), gather(x)
            jax.block_until_ready((s, r, g))
        except Exception as e:  # noqa: BLE001 - the socket transport's failure is a result
            t_err = time.perf_counter() - t0
            print(f"[process {rank}] step {step}: FAILED after {t_err:.1f} s: {str(e)[:400]}", flush=True)
            break
        times.append(time.perf_counter() - t0)
        phases.append("healthy" if step < cut_at else "faulted" if step < heal_at else "healed")
        check(step, s, r, g)
    summary = {"rank": rank, "transport": a.transport, "steps_done": len(times), "steps": a.steps,
               "failed_after_s": t_err, "env": env_note}
    for ph in ("healthy", "faulted", "healed"):
        ts = [t for t, p in zip(times, phases) if p == ph][1:]   # (the first of each phase compiles or reconnects)
        summary[ph] = statistics.median(ts) if ts else None
    print("RESULT " + json.dumps(summary), flush=True)
    if a.transport == "r2ccl" and a.platform == "cuda":
        jax_r2ccl.shutdown()
    return 0 if t_err is None else 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--transport", default="r2ccl", choices=("r2ccl", "socket"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--elements", type=int, default=1 << 22, help="int32 per row (16 MiB rows by default)")
    ap.add_argument("--port", type=int, default=29800)
    ap.add_argument("--cut-address", default="", help="drop traffic between this address and itself mid-loop (root)")
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--logs", default=".")
    ap.add_argument("--process-id", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.process_id >= 0:
        return child(a)

    coordinator = f"127.0.0.3:{a.port}"   # off 127.0.0.1, which --cut-address may cut
    procs, logs = [], []
    for rank in range(2):
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                   NCCL_HOSTID=f"r2ccl-smoke-host-{rank}", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1",
                   NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", XLA_PYTHON_CLIENT_MEM_FRACTION="0.2",
                   R2CCL_TEST_FAULT_FILE=os.path.join(a.logs, f"nccl_fault.{rank}"))
        if os.environ.get("R2CCL_NCCL_MULTI_RANK") == "1":
            env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
        if a.transport == "socket":
            env.update(NCCL_NET="Socket", NCCL_SOCKET_IFNAME="lo")
        else:
            env.setdefault("R2CCL_NICS", "127.0.0.1,127.0.0.2")
        log = os.path.join(a.logs, f"nccl_{a.transport}.{rank}.log")
        logs.append(log)
        cmd = [sys.executable, os.path.abspath(__file__), "--platform", a.platform, "--transport", a.transport,
               "--steps", str(a.steps), "--elements", str(a.elements), "--cut-address", a.cut_address,
               "--process-id", str(rank), "--coordinator", coordinator]
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT))
    deadline = time.monotonic() + a.timeout
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs.append("killed at the timeout")
    if a.cut_address:   # never leave the rule behind
        subprocess.run(["iptables", "-D", "INPUT", "-s", a.cut_address, "-d", a.cut_address, "-j", "DROP"],
                       capture_output=True, timeout=10)
    texts = [open(log, errors="replace").read() for log in logs]
    nets = sorted({m for t in texts for m in re.findall(r"NCCL INFO (?:NET/|Using network )[^\n]{0,160}", t)})
    for line in nets[:12]:
        print(f"  {line}")
    results = []
    for t in texts:
        m = re.findall(r"^RESULT (.*)$", t, re.M)
        results.append(json.loads(m[-1]) if m else None)
    for rank, (rc, res, t) in enumerate(zip(rcs, results, texts)):
        if res is None:
            tail = "\n".join(t.splitlines()[-15:])
            print(f"  process {rank}: exit {rc}, no result; its log ends:\n{tail}")
            continue
        fmt = lambda v: f"{v * 1e3:.1f} ms" if v else "-"   # noqa: E731
        print(f"  process {rank} ({res['transport']}): {res['steps_done']}/{res['steps']} steps; median step "
              f"healthy {fmt(res['healthy'])}, faulted {fmt(res['faulted'])}, healed {fmt(res['healed'])}"
              + (f"; FAILED after {res['failed_after_s']:.1f} s" if res["failed_after_s"] is not None else ""))
    ok = all(r is not None and r["steps_done"] == r["steps"] for r in results) and all(rc == 0 for rc in rcs)
    used_plugin = any("r2ccl" in line for line in nets)
    if a.platform == "cuda" and a.transport == "r2ccl" and not used_plugin:
        ok = False
        print("  NCCL's log does not say it used the r2ccl network")
    verdict = "PASS" if ok else ("FAIL" if a.transport == "r2ccl" or not a.cut_address else "NCCL FAILED (expected)")
    print(f"nccl_smoke: {verdict} ({a.transport} on {a.platform}, {a.steps} steps, rows of {a.elements} int32)")
    return 0 if ok or verdict.startswith("NCCL FAILED") else 1


if __name__ == "__main__":
    sys.exit(main())
