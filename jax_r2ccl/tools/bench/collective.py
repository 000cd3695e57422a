"""`python -m jax_r2ccl bench allreduce|allgather|reducescatter|alltoall|ppermute|raggedalltoall`:
collective bandwidth through the JAX custom calls (jax_r2ccl.psum and friends inside shard_map
under jit; ppermute: jax.lax.ppermute under the lowering swap, a ring shift by one rank;
raggedalltoall: jax.lax.ragged_all_to_all under the swap, every rank sending each peer an equal
slice, which land in sender order: all_to_all's blocks), one process per host, every element
of every iteration checked; with `--baseline jax` the same sizes through jax.lax's own
collectives (gloo on CPU) in the same run, rows side by side (raggedalltoall's baseline is
jax.lax.all_to_all of the same blocks: XLA:CPU has no ragged-all-to-all).
Table and busbw as in nccl-tests: busbw = algbw × 2(n-1)/n for all-reduce, × (n-1)/n for
the others but ppermute, whose every rank sends its whole buffer once (× 1)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .common import (Column, Dist, FaultTrigger, add_common_args, cpu_seconds, format_size, format_table, median,
                     per_gb, stall_count, write_json)

OPS = {
    "allreduce": ("psum", lambda n: 2 * (n - 1) / n),
    "allgather": ("all_gather", lambda n: (n - 1) / n),
    "reducescatter": ("psum_scatter", lambda n: (n - 1) / n),
    "alltoall": ("all_to_all", lambda n: (n - 1) / n),
    "ppermute": ("ppermute", lambda n: 1.0),
    "raggedalltoall": ("ragged_all_to_all", lambda n: (n - 1) / n),
}


def add_args(p: argparse.ArgumentParser) -> None:
    add_common_args(p, default_sizes="8B,4KiB,1MiB,16MiB,64MiB")
    p.add_argument("--baseline", choices=("jax", "none"), default="none",
                   help="also run jax.lax's own collective on the same sizes (rows side by side)")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--fault-at", type=float, default=None, metavar="S",
                   help="process 0 runs --fault-cmd this long after the largest size's timed loop starts")
    p.add_argument("--fault-cmd", default=None, metavar="CMD", help="shell command for --fault-at")
    from ... import _core   # the planner's names (csrc/coll/plan.h), not a copy
    p.add_argument("--plan", default=None, choices=tuple(_core.names()["plans"]),
                   help="all-reduce plan (sets R2CCL_PLAN; the same on every process); the JSON records the "
                        "plan each call ran with and every process's capacity")
    p.add_argument("--algo", default=None, choices=tuple(_core.names()["algos"]),
                   help="collective algorithm (sets R2CCL_ALGO; the same on every process); the table's algo "
                        "column says what each all-reduce ran")
    p.add_argument("--link-rate", type=float, default=None, metavar="BYTES_PER_S",
                   help="payload rate of one healthy NIC: adds the cost model's predicted time per row")


def _rank_pattern(count: int, rank: int, dtype) -> np.ndarray:
    # Small integers: sums over a few ranks are exact in every float type, so a wrong
    # element is a real error, and the check is exact.
    return ((np.arange(count, dtype=np.int64) * 7 + 3 * rank + 1) % 13).astype(dtype)


def _expected(op: str, count: int, n: int, dtype) -> list[np.ndarray]:
    parts = [_rank_pattern(count, r, dtype) for r in range(n)]
    if op == "allreduce":
        total = parts[0].copy()
        for p in parts[1:]:
            total = total + p
        return [total.astype(dtype)] * n
    if op == "allgather":
        return [np.concatenate(parts)] * n
    if op == "reducescatter":
        total = parts[0].copy()
        for p in parts[1:]:
            total = total + p
        k = count // n
        return [total[r * k:(r + 1) * k].astype(dtype) for r in range(n)]
    if op == "ppermute":   # a ring shift: rank j gets rank j-1's buffer
        return [parts[(j - 1) % n] for j in range(n)]
    k = count // n   # alltoall, raggedalltoall
    return [np.concatenate([parts[s][j * k:(j + 1) * k] for s in range(n)]) for j in range(n)]


def _ragged_blocks(a, jax, n):
    """jax.lax.ragged_all_to_all moving all_to_all's blocks: slice j (rows j*k..) to rank j,
    written at row (my axis index)*k there."""
    import jax.numpy as jnp
    k = a.shape[0] // n
    me = jax.lax.axis_index("x")
    idx = jnp.arange(n, dtype=jnp.int32)
    return jax.lax.ragged_all_to_all(a, jnp.zeros_like(a), idx * k, jnp.full((n,), k, jnp.int32),
                                     jnp.full((n,), me * k, jnp.int32), jnp.full((n,), k, jnp.int32), axis_name="x")


def _build(impl: str, op: str, mesh, jax, P):
    import jax_r2ccl
    n = mesh.devices.size
    if op in ("ppermute", "raggedalltoall"):
        ring = [(j, (j + 1) % n) for j in range(n)]
        if op == "ppermute":
            body = lambda a: jax.lax.ppermute(a, "x", ring)   # noqa: E731
        elif impl == "r2ccl":
            body = lambda a: _ragged_blocks(a, jax, n)   # noqa: E731
        else:   # XLA:CPU has no ragged-all-to-all: the dense all_to_all of the same blocks
            body = lambda a: jax.lax.all_to_all(a, "x", 0, 0, tiled=True)   # noqa: E731
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
        if impl != "r2ccl":
            return f
        compiled = {}

        def swapped(a):   # jax.lax's collective, compiled under the lowering swap
            if "c" not in compiled:
                with jax_r2ccl.enabled():
                    lowered = f.lower(a)
                    if "r2ccl_" not in lowered.as_text():
                        raise RuntimeError(f"bench {op}: the lowering swap left jax.lax.{OPS[op][0]} to jax "
                                           f"({jax_r2ccl.swap_fallbacks()})")
                    compiled["c"] = lowered.compile()
            return compiled["c"](a)
        return swapped
    mod = jax_r2ccl if impl == "r2ccl" else jax.lax
    name = OPS[op][0]
    fn = getattr(mod, name)
    if op == "allreduce":
        body, out_spec = (lambda a: fn(a, "x")), P()
    elif op == "allgather":
        body, out_spec = (lambda a: fn(a, "x", tiled=True)), P()
    elif op == "reducescatter":
        body, out_spec = (lambda a: fn(a, "x", scatter_dimension=0, tiled=True)), P("x")
    else:
        body, out_spec = (lambda a: fn(a, "x", 0, 0, tiled=True)), P("x")
    # check_vma off: the same program for both implementations, whatever each one's typing of
    # gathered results (the check below reads every element anyway).
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out_spec, check_vma=False))


def main(args: argparse.Namespace) -> int:
    op = args.bench
    dist = Dist(args.coordinator, args.num_processes, args.process_id, args.timeout)
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_r2ccl
    from ... import _core
    nics = args.nics.split(",") if args.nics else None
    if args.plan:
        os.environ["R2CCL_PLAN"] = args.plan
    if args.algo:
        os.environ["R2CCL_ALGO"] = args.algo
    jax_r2ccl.initialize(nics=nics)
    from ..._src import runtime
    dtype = np.dtype(args.dtype) if args.dtype != "bfloat16" else __import__("ml_dtypes").bfloat16
    devices = jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("x",))
    local_ranks = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    impls = ["r2ccl"] + (["jax"] if args.baseline == "jax" else [])
    rows, iterations, fault = [], [], None
    esize = np.dtype(dtype).itemsize
    for size in args.sizes:
        # nccl-tests' convention: size is the send buffer of reduce-scatter and all-to-all and
        # the receive buffer of all-gather (n times each rank's input).
        count = max(1, size // esize // n) if op == "allgather" else max(1, size // esize)
        if op in ("reducescatter", "alltoall", "raggedalltoall"):
            count = max(n, count - count % n)
        total = count * esize * (n if op == "allgather" else 1)
        sharding = NamedSharding(mesh, P("x"))
        local = {r: _rank_pattern(count, r, dtype) for r in local_ranks}
        x = jax.make_array_from_callback((n * count,), sharding, lambda idx: local[idx[0].start // count])
        want = _expected(op, count, n, dtype)
        fns = {impl: _build(impl, op, mesh, jax, P) for impl in impls}
        times = {impl: [] for impl in impls}
        cpu = {impl: 0.0 for impl in impls}   # this process's CPU (user + system, all threads) in timed calls
        wrong = {impl: 0 for impl in impls}

        def once(impl, it):
            c0 = cpu_seconds()
            t0 = time.perf_counter()
            out = fns[impl](x)
            out.block_until_ready()
            t1 = time.perf_counter()
            c1 = cpu_seconds()
            if it < args.warmup:
                return
            cpu[impl] += (c1[0] - c0[0]) + (c1[1] - c0[1])
            bad = 0
            for shard in out.addressable_shards:
                got = np.asarray(shard.data).reshape(-1)
                want_r = want[0] if op in ("allreduce", "allgather") else want[devices.index(shard.device)]
                bad += int(not np.array_equal(got, want_r))
            wrong[impl] += int(bad > 0)
            times[impl].append(t1 - t0)
            row = {"impl": impl, "op": op, "size_bytes": total, "iter": it - args.warmup,
                   "t_start": time.time() - (t1 - t0), "t_end": time.time(), "wrong": int(bad > 0)}
            if impl == "r2ccl" and op == "allreduce":
                lp = runtime.last_plan()
                # (The ring has no owners: no plan.)
                row.update(plan=lp["plan"] if lp["algo"] in ("direct", "two_level") else "-", algo=lp["algo"],
                           shares=lp["shares"], capacities=lp["capacities"], plan_processes=lp["processes"])
            iterations.append(row)

        faulted = size == args.sizes[-1] and args.fault_at is not None
        if faulted:
            # The fault hits r2ccl's loop only; the baseline runs after it, on healed links.
            for impl in impls:
                for it in range(args.warmup + args.iters):
                    if impl == "r2ccl" and it == args.warmup and args.process_id == 0:
                        fault = FaultTrigger(args.fault_at, cmd=args.fault_cmd)
                        fault.arm()
                    once(impl, it)
                if impl == "r2ccl" and fault:
                    fault.join(60)
        else:
            # Implementations interleaved call by call (the first one alternating), so that
            # both see the same machine: on 2 shared cores, timing drifts over seconds.
            for it in range(args.warmup + args.iters):
                for impl in (impls if it % 2 == 0 else impls[::-1]):
                    once(impl, it)
        for impl in impls:
            med = median(times[impl])
            algbw = total / med / 1e9
            row = {"impl": impl, "op": op, "size_bytes": total, "size": format_size(total),
                   "count": total // esize, "type": np.dtype(dtype).name, "redop": "sum" if op in
                   ("allreduce", "reducescatter") else "none", "iters": args.iters,
                   "time_us_median": med * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * OPS[op][1](n),
                   # CPU per GB each process moved: the bytes busbw counts, per timed call
                   "cpu_s_per_GB": per_gb((cpu[impl], 0.0), total * OPS[op][1](n) * len(times[impl])),
                   "wrong": wrong[impl]}
            last = [i for i in iterations if i["impl"] == impl and i["size_bytes"] == total and "plan" in i]
            if last:
                row.update(plan=last[-1]["plan"], algo=last[-1]["algo"], shares=last[-1]["shares"],
                           capacities=last[-1]["capacities"], plan_processes=last[-1]["plan_processes"])
                if args.link_rate and last[-1]["capacities"] and last[-1]["algo"] == "direct":
                    pred = _core.plan_predict(last[-1]["plan"], last[-1]["capacities"], float(total),
                                              float(args.link_rate))
                    row["predicted_us"] = pred["predicted_s"] * 1e6
            rows.append(row)
    # two_level: each process knows its own group's plan; process 0 puts the job's together
    # (capacities per process; shares of the vector per process, a group's over the groups)
    # and the plan of each group.
    group_plans = dist.gather("groups", [{k: r.get(k) for k in ("plan", "shares", "capacities", "plan_processes")}
                                         if r.get("algo") == "two_level" else None for r in rows])
    # every process's wrong counts matter: sum them
    totals = dist.gather("wrong", [r["wrong"] for r in rows])
    cpus = dist.gather("cpu", [r["cpu_s_per_GB"] for r in rows])
    mine = 0
    try:
        ep = runtime.current().endpoint
        mine = sum(stall_count(ep.rail_stats(p)) for p in range(args.num_processes) if p != args.process_id)
    except Exception:  # noqa: BLE001 - no endpoint (one process): nothing stalled
        pass
    stalls = dist.gather("stalls", mine)
    # Each process's NICs with a rail up at the end (the simulator's capacity of a host whose
    # algorithm exchanged none, as the ring's): a NIC down for the run counts 0.
    nics_up = None
    try:
        ep = runtime.current().endpoint
        nics_up = len({s["local_nic"] for p in range(args.num_processes) if p != args.process_id
                       for s in ep.rail_stats(p) if s["state"] == "up"})
    except Exception:  # noqa: BLE001 - no endpoint (one process)
        pass
    nics_up = dist.gather("nics_up", nics_up)
    # When each process finished each size's loop (wall clock): under the ring, process 0 has
    # the result before the processes after it on the ring do.
    loop_end = {}
    for it in iterations:
        if it["impl"] == "r2ccl":
            loop_end[str(it["size_bytes"])] = max(loop_end.get(str(it["size_bytes"]), 0.0), it["t_end"])
    loop_ends = dist.gather("loop_end", loop_end)
    if args.process_id == 0:
        for i, r in enumerate(rows):
            r["wrong"] = sum(t[i] for t in totals)
            if r.get("algo") == "two_level":
                caps, shares, plans = [0.0] * args.num_processes, [0.0] * args.num_processes, {}
                for g in (x[i] for x in group_plans):
                    groups = args.num_processes // len(g["plan_processes"])
                    for p, c, sh in zip(g["plan_processes"], g["capacities"] or [None] * len(g["plan_processes"]),
                                        g["shares"]):
                        caps[p] = c if c is not None else float(len(nics or []) or 1)
                        shares[p] = sh / groups
                    plans[g["plan_processes"][0]] = g["plan"]
                r.update(capacities=caps, shares=shares, group_plans=[plans[k] for k in sorted(plans)])
            per = [c[i] for c in cpus]
            r["cpu_s_per_GB_by_process"] = per
            r["cpu_s_per_GB"] = sum(per) / len(per) if all(v is not None for v in per) else None
        cols = [Column("impl", "impl", align="<"), Column("size", "size"), Column("count", "count"),
                Column("type", "type"), Column("redop", "redop"), Column("time(us)", "time_us_median", ".1f"),
                Column("algbw(GB/s)", "algbw_GBps", ".4f"), Column("busbw(GB/s)", "busbw_GBps", ".4f"),
                Column("cpu/GB", "cpu_s_per_GB", ".3f"), Column("#wrong", "wrong")]
        if any("plan" in r for r in rows):
            fmt_shares = lambda s: "/".join(f"{x:.2f}" for x in s)  # noqa: E731
            fmt_caps = lambda s: "/".join(f"{x:.2g}" for x in s)  # noqa: E731
            cols += [Column("algo", "algo", align="<"), Column("plan", "plan", align="<"),
                     Column("shares", "shares", fmt_shares),
                     Column("capacity", "capacities", fmt_caps)]
            if args.link_rate:
                cols.append(Column("model(us)", "predicted_us", ".1f"))
        print(f"# bench {op}: {args.num_processes} processes, {n} ranks, NICs {args.nics or 'R2CCL_NICS'}; "
              f"iters {args.iters}, warmup {args.warmup}; time = median per call on process 0; cpu/GB = "
              f"CPU seconds (user + system, every thread) per GB of busbw bytes, mean over the processes")
        print(format_table(cols, rows))
        if op == "raggedalltoall" and args.baseline == "jax":
            print("# baseline: jax.lax.all_to_all of the same blocks (XLA:CPU has no ragged-all-to-all)")
        if fault:
            print(f"# fault: {fault.summary()}")
        print(f"# stalls declared (rails failed over because their acks stopped), per process: "
              f"{' '.join(str(x) for x in stalls)}")
        if args.json:
            stats = {}
            try:
                ep = runtime.current().endpoint
                stats = {p: ep.rail_stats(p) for p in range(args.num_processes) if p != args.process_id}
            except Exception:  # noqa: BLE001
                pass
            from ...config import Config
            write_json(args.json, {"config": vars(args) | {"sizes": args.sizes,
                                                           "max_peers": Config.from_env().max_peers},
                                   "results": rows,
                                   "iterations": iterations, "loop_end_by_process": loop_ends,
                                   "rail_stats": stats, "stalls": stalls, "nics_up_by_process": nics_up,
                                   "core": getattr(_core, "__file__", "")})
    dist.barrier("done")
    jax_r2ccl.shutdown()
    dist.shutdown()
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(argparse.ArgumentParser().parse_args()))
