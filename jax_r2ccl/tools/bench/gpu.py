"""`python -m jax_r2ccl bench gpu`: the GPU check's table, measured in one run (one process
per rank, all on this machine's GPU(s), rails over loopback). Rows, each beside its
baseline:
  * staging D2H / H2D through the copy engine and the pinned pool, in R2CCL_STAGING_CHUNK_BYTES
    steps, beside one plain cudaMemcpyAsync of the same bytes to pinned memory;
  * the reduction kernel (float32 and bfloat16 sum) beside a device-to-device copy, as bytes
    of device memory touched per second;
  * the FFI overhead of an 8-byte psum: a jitted jax_r2ccl.psum on the GPU minus the
    transport's own round trip (the same all-reduce through the host-level API);
  * 64 MiB psum busbw on the GPU beside the same on CPU (--cpu-json: the collective bench's
    JSON from a CPU run of the same processes, made just before by bench/gpu_check.sh).
Every collective's result is checked. --device-rows off skips the rows that need CUDA
(the dry run on a machine without a GPU)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .common import Column, Dist, add_common_args, format_size, format_table, median, write_json


def _size(text: str) -> int:
    from .common import parse_size
    return parse_size(text)


def add_args(p: argparse.ArgumentParser) -> None:
    add_common_args(p, default_sizes="64MiB")
    p.add_argument("--platform", default="cuda", choices=("cuda", "cpu"),
                   help="JAX platform of the collective rows (cpu: the dry run)")
    p.add_argument("--device-rows", default="on", choices=("on", "off"),
                   help="the copy-engine and kernel rows (need CUDA)")
    p.add_argument("--cpu-json", default=None, metavar="PATH",
                   help="`bench allreduce --json` of a CPU run: its busbw goes beside the GPU's")
    p.add_argument("--small-iters", type=int, default=300, help="calls timed for the 8-byte overhead row")
    p.add_argument("--device-bytes", type=_size, default=None, metavar="SIZE",
                   help="bytes of the copy-engine and kernel rows (default: the largest --sizes; the GPU check "
                        "uses 1GiB, where launch and sync costs are noise)")


def kernel_cases(count: int = 4099, seed: int = 0):
    """(dtype, op, a, b, host result bytes) for every dtype x op of the host kernels, the
    operands mixing random values with the special ones (subnormals, signed zeros, NaN, inf,
    the largest and smallest normals) the element operations treat specially."""
    import ml_dtypes
    from ... import _core
    names = _core.names()
    rng = np.random.default_rng(seed)
    out = []
    for dtype in names["dtypes"]:
        dt = np.dtype(getattr(ml_dtypes, dtype)) if dtype == "bfloat16" else np.dtype(dtype)
        for op in names["reduce_ops"]:
            if dt == np.bool_:
                a = rng.integers(0, 2, count).astype(np.bool_)
                b = rng.integers(0, 2, count).astype(np.bool_)
            elif dt.kind in "iu":
                a = rng.integers(0, 256, count * dt.itemsize, dtype=np.uint8).view(dt)
                b = rng.integers(0, 256, count * dt.itemsize, dtype=np.uint8).view(dt)
            else:
                f = np.finfo(np.float32 if dt.itemsize == 2 and dtype == "bfloat16" else dt)
                special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, float(f.tiny), -float(f.tiny),
                                    float(f.tiny) / 4, -float(f.tiny) / 8, float(f.max), float(f.smallest_subnormal)],
                                   dtype=np.float64)
                vals = np.concatenate([np.repeat(special, 30), rng.standard_normal(count) * 1e3,
                                       rng.standard_normal(count) * float(f.tiny) * 4])
                a = rng.permutation(vals)[:count].astype(dt)
                b = rng.permutation(vals)[:count].astype(dt)
            want = _core.host_reduce(dtype, op, a.view(np.uint8), b.view(np.uint8))
            out.append((dtype, op, a, b, want))
    return out


def _psum_fn(jax, P, mesh):
    import jax_r2ccl
    return jax.jit(jax.shard_map(lambda v: jax_r2ccl.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                 check_vma=False))


def main(args: argparse.Namespace) -> int:
    os.environ["JAX_PLATFORMS"] = args.platform
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{max(0.05, 0.8 / args.num_processes):.2f}")
    dist = Dist(args.coordinator, args.num_processes, args.process_id, args.timeout)
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_r2ccl
    from ... import _core
    from ...config import Config
    from ...transport.host_collectives import HostCollectives
    nics = args.nics.split(",") if args.nics else None
    jax_r2ccl.initialize(nics=nics)
    from ..._src import runtime
    cfg = Config.from_env()
    rows, wrong = [], 0

    if args.device_rows == "on" and args.process_id == 0:
        for r in _core.cuda_bench(args.device_bytes or max(args.sizes), args.iters, 0, cfg.staging_chunk_bytes):
            rows.append({"what": r["what"], "size": format_size(r["bytes"]), "ours": r["GBps"],
                         "baseline": r["baseline"], "base": r["baseline_GBps"], "unit": "GB/s",
                         "ratio": r["GBps"] / r["baseline_GBps"] if r["baseline_GBps"] else None})

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    n = len(devices)
    mesh = Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    local = [d for d in devices if d.process_index == jax.process_index()]
    f = _psum_fn(jax, P, mesh)

    def array(count, value_of_rank):
        return jax.make_array_from_callback(
            (n * count,), sharding, lambda idx: np.full(count, value_of_rank((idx[0].start or 0) // count), np.float32))

    # 8-byte psum through JAX, and the transport's own round trip of the same all-reduce
    x8 = array(2, lambda r: r + 1.0)
    want8 = n * (n + 1) / 2
    ts = []
    for i in range(args.small_iters + 20):
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(x8))
        ts.append(time.perf_counter() - t0)
        if i == 0:
            wrong += int(any(float(np.asarray(s.data)[0]) != want8 for s in out.addressable_shards))
    t_call = median(ts[20:])
    dist.barrier("transport-rtt")
    hc = HostCollectives(runtime.current().endpoint)
    proc_of = [d.process_index for d in devices]
    my = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    ins = [np.full(2, i + 1.0, np.float32) for i in my]
    ts = []
    for i in range(args.small_iters + 20):
        t0 = time.perf_counter()
        res = hc.run("all_reduce", ins, process_of_rank=proc_of, my_ranks=my)
        ts.append(time.perf_counter() - t0)
        if i == 0:
            wrong += int(any(float(r[0]) != want8 for r in res))
    t_rtt = median(ts[20:])
    rows.append({"what": "psum 8 B: FFI overhead", "size": "8 B", "ours": (t_call - t_rtt) * 1e6,
                 "baseline": "transport round trip", "base": t_rtt * 1e6, "unit": "us",
                 "note": f"call {t_call * 1e6:.1f} us on {args.platform}"})

    # large psum busbw
    for size in args.sizes:
        count = max(1, size // 4)
        x = array(count, lambda r: float(r % 13))
        want = float(sum(r % 13 for r in range(n)))
        ts = []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            out = jax.block_until_ready(f(x))
            if i >= args.warmup:
                ts.append(time.perf_counter() - t0)
            if i == 0:
                wrong += int(any(not np.all(np.asarray(s.data) == want) for s in out.addressable_shards))
        med = median(ts)
        busbw = count * 4 / med / 1e9 * 2 * (n - 1) / n
        row = {"what": f"psum busbw ({args.platform})", "size": format_size(count * 4), "ours": busbw,
               "baseline": "same on CPU", "base": None, "unit": "GB/s"}
        if args.cpu_json and os.path.exists(args.cpu_json):
            with open(args.cpu_json) as fh:
                cpu = [r for r in json.load(fh)["results"] if r["size_bytes"] == count * 4 and r["impl"] == "r2ccl"]
            if cpu:
                row["base"] = cpu[0]["busbw_GBps"]
                row["ratio"] = busbw / cpu[0]["busbw_GBps"]
        rows.append(row)

    totals = dist.gather("wrong", wrong)
    if args.process_id == 0:
        wrong_all = sum(totals)
        cols = [Column("what", "what", align="<"), Column("size", "size"), Column("ours", "ours", ".2f"),
                Column("baseline", "baseline", align="<"), Column("base", "base", ".2f"),
                Column("ours/base", "ratio", ".3f"), Column("unit", "unit", align="<")]
        print(f"# bench gpu: {args.num_processes} processes, {n} ranks on {args.platform}, NICs "
              f"{args.nics or 'R2CCL_NICS'}; iters {args.iters}; staging step {format_size(cfg.staging_chunk_bytes)}; "
              f"#wrong {wrong_all}")
        print(format_table(cols, rows))
        if args.json:
            write_json(args.json, {"config": vars(args) | {"sizes": args.sizes}, "results": rows, "wrong": wrong_all})
    dist.barrier("done")
    jax_r2ccl.shutdown()
    dist.shutdown()
    return 1 if sum(totals or [wrong]) else 0


if __name__ == "__main__":
    sys.exit(main(argparse.ArgumentParser().parse_args()))
