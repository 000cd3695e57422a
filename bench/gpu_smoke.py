"""bench/gpu_smoke.py - the GPU check's two-process JAX smoke (bench/gpu_check.sh runs it).

Runs tests/jax_workers.py:gpu_smoke in --processes processes on --platform (cuda, or cpu for
the dry run) with R2CCL_DEBUG=INFO: an 8-byte psum, a psum of several staging chunks, an
all_gather and a psum_scatter, each checked bit for bit. Prints one line per collective,
keeps each process's log in --logs, then compares the calls the processes logged (one INFO
line per call: run id, op id, group, rank). The run id is XLA's launch id, derived from the
optimized program: processes whose programs were compiled differently (autotuning picked
other kernels) log different run ids for the same op, and their collectives never meet.
Exit status 0 only when every collective was exact and the run ids agree."""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

CALL = re.compile(r"call: run ([0-9a-f]+) op ([0-9a-f]+) comm (\d+) group (-?\d+) rank (-?\d+) (\w+) (\d+) "
                  r"elements on (\w+)")
FIX = ("their programs were compiled differently (on a GPU: autotuning chose other kernels). Make them agree with "
       "jax.config.update('jax_share_binary_between_hosts', True) (process 0 compiles, the others load its "
       "binary) or XLA_FLAGS=--xla_gpu_autotune_level=0 (no autotuning)")


def calls(output: str) -> list[tuple[str, str, int, int]]:
    """(run id, op id, group, rank) of every call a process logged, in order."""
    return [(m.group(1), m.group(2), int(m.group(4)), int(m.group(5))) for m in CALL.finditer(output)]


def compare(per_process: list[list[tuple[str, str, int, int]]]) -> tuple[bool, str]:
    """Whether every op ran under the same run ids, the same number of times, in every process."""
    if not all(per_process):
        return False, "a process logged no call (R2CCL_DEBUG=INFO not in effect, or no collective ran)"
    runs = []
    for cs in per_process:
        by_op = collections.defaultdict(list)
        for run, op, _, _ in cs:
            if run not in by_op[op]:
                by_op[op].append(run)
        runs.append(dict(by_op))
    for p, r in enumerate(runs[1:], 1):
        if r != runs[0]:
            ops = sorted(set(r) | set(runs[0]))
            diff = next(op for op in ops if r.get(op) != runs[0].get(op))
            return False, (f"run ids differ: op {diff} ran under run {runs[0].get(diff)} in process 0 and "
                           f"{r.get(diff)} in process {p}: " + FIX)
    n_runs = len({run for cs in per_process for run, *_ in cs})
    return True, (f"run ids agree: {sum(len(c) for c in per_process)} calls logged by {len(per_process)} processes "
                  f"under {n_runs} run ids")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--logs", default=".", help="folder for each process's log")
    a = ap.parse_args()
    os.environ["R2CCL_DEBUG"] = "INFO"
    from jax_rank_main import run_jax_ranks
    from harness import RankFailed
    local = 1
    try:
        rs = run_jax_ranks("gpu_smoke", a.processes, local=local, platform=a.platform, timeout=a.timeout,
                           expect_fail=True)
    except RankFailed as e:
        print(f"FAIL: the smoke did not finish: {str(e)[:3000]}")
        return 1
    ok = True
    for i, r in enumerate(rs):
        with open(os.path.join(a.logs, f"smoke-process{i}.log"), "w") as f:
            f.write(r.get("output", ""))
        if not r["ok"]:
            print(f"FAIL: process {i}: {r['error'][:2000]}")
            ok = False
    if not ok:
        return 1
    res0 = rs[0]["result"]
    for name in res0["ran"]:
        wrong = [b for r in rs for b in r["result"]["bad"] if b["case"] == name]
        times = ", ".join(f"{r['result']['seconds'][name] * 1e3:.2f} ms" for r in rs)
        print(f"  {name}: {'WRONG on ranks ' + str([b['rank'] for b in wrong]) if wrong else 'exact'} ({times})")
        ok &= not wrong
    agree, why = compare([calls(r.get("output", "")) for r in rs])
    print(f"  {why}")
    return 0 if ok and agree else 1


if __name__ == "__main__":
    sys.exit(main())
