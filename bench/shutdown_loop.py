#!/usr/bin/env python3
"""examples/train_step.py as its docstring says (2 processes on one machine, loopback rails
R2CCL_NICS=127.0.0.1,127.0.0.2), RUNS times in a row, as a new user would run it: every
run must end with rc 0 on both processes, without a rail "silent" line, a heap-corruption
report or a kill at the per-run limit; no run may take more than 3x the median.

Prints one table row per interpreter: the installed jax_r2ccl (this Python), and optionally a
baseline build in another venv (--baseline-python), run in the same process tree on the same
machine under the same load. --busy N keeps N busy-loop processes running meanwhile (the
failures at exit showed most under load: 2 cores shared with a test suite). Per-run times go
to --csv.

    python bench/shutdown_loop.py --runs 200 [--busy 1] [--baseline-python OLD/bin/python --baseline-runs 30]
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_step.py")
SILENT = re.compile(r"silent for")
CORRUPT = re.compile(r"corrupted|double free|free\(\)|AddressSanitizer|Fatal Python error")


def free_port() -> int:
    """Below the ephemeral range, as the tests pick it (the baseline's venv may lack the helper)."""
    try:
        from jax_r2ccl.tools.launch import coordinator_port
    except ImportError:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    return coordinator_port()


def one_run(python: str, limit_s: float, logdir: str, tag: str) -> dict:
    port = free_port()
    env = dict(os.environ, R2CCL_NICS="127.0.0.1,127.0.0.2")
    env.pop("PYTHONPATH", None)   # the interpreter's own installed jax_r2ccl
    logs = [os.path.join(logdir, f"{tag}.p{r}.log") for r in range(2)]
    procs = []
    t0 = time.monotonic()
    for r in range(2):
        with open(logs[r], "w") as f:
            procs.append(subprocess.Popen([python, EXAMPLE, "--coordinator", f"127.0.0.1:{port}",
                                           "--num-processes", "2", "--process-id", str(r)],
                                          stdout=f, stderr=subprocess.STDOUT, env=env, cwd=logdir,
                                          start_new_session=True))
    killed = False
    for p in procs:
        left = limit_s - (time.monotonic() - t0)
        try:
            p.wait(timeout=max(0.1, left))
        except subprocess.TimeoutExpired:
            killed = True
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            for q in procs:
                q.wait()
            break
    wall = time.monotonic() - t0
    text = [open(p).read() for p in logs]
    return {"wall": wall, "rc": [p.returncode for p in procs], "killed": killed,
            "silent": sum(len(SILENT.findall(t)) for t in text),
            "corrupt": sum(len(CORRUPT.findall(t)) for t in text)}


def series(name: str, python: str, runs: int, limit_s: float, logdir: str, csv) -> dict:
    rows = []
    for i in range(runs):
        r = one_run(python, limit_s, logdir, f"{name}-{i}")
        rows.append(r)
        if csv:
            csv.write(f"{name},{i},{r['wall']:.3f},{r['rc'][0]},{r['rc'][1]},{int(r['killed'])},{r['silent']},"
                      f"{r['corrupt']}\n")
            csv.flush()
        ok = r["rc"] == [0, 0] and not r["killed"] and r["silent"] == 0 and r["corrupt"] == 0
        if not ok:
            print(f"  {name} run {i}: rc {r['rc']}, killed {r['killed']}, silent lines {r['silent']}, "
                  f"corruption reports {r['corrupt']}, {r['wall']:.1f} s (logs kept: {logdir}/{name}-{i}.p*.log)",
                  flush=True)
    walls = [r["wall"] for r in rows]
    med = statistics.median(walls)
    return {"name": name, "runs": runs,
            "clean": sum(r["rc"] == [0, 0] and not r["killed"] and r["silent"] == 0 and r["corrupt"] == 0
                         for r in rows),
            "rc_nonzero": sum(r["rc"] != [0, 0] and not r["killed"] for r in rows),
            "killed": sum(r["killed"] for r in rows),
            "silent_runs": sum(r["silent"] > 0 for r in rows),
            "corrupt_runs": sum(r["corrupt"] > 0 for r in rows),
            "median": med, "p90": sorted(walls)[int(0.9 * (len(walls) - 1))], "max": max(walls),
            "over_3x": sum(w > 3 * med for w in walls)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--python", default=sys.executable, help="interpreter with the jax_r2ccl under test")
    ap.add_argument("--baseline-python", help="interpreter of a venv with the baseline build")
    ap.add_argument("--baseline-runs", type=int, default=30)
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes running meanwhile")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds before a run is killed")
    ap.add_argument("--csv", help="per-run rows: series,run,wall_s,rc0,rc1,killed,silent_lines,corruption_lines")
    a = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="r2ccl-shutdown-loop-")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(a.busy)]
    csv = open(a.csv, "w") if a.csv else None
    if csv:
        csv.write("series,run,wall_s,rc0,rc1,killed,silent_lines,corruption_lines\n")
    results = []
    try:
        if a.baseline_python:
            results.append(series("baseline", a.baseline_python, a.baseline_runs, a.limit, logdir, csv))
        results.append(series("this build", a.python, a.runs, a.limit, logdir, csv))
    finally:
        for p in busy:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if csv:
            csv.close()
    print(f"\nexamples/train_step.py, 2 processes, loopback rails, {a.busy} busy-loop process(es) beside, "
          f"{a.limit:.0f} s per-run limit")
    print(f"{'series':>11} {'runs':>5} {'clean':>6} {'rc!=0':>6} {'killed':>7} {'silent':>7} {'corrupt':>8} "
          f"{'median s':>9} {'p90 s':>7} {'max s':>7} {'>3x med':>8}")
    for r in results:
        print(f"{r['name']:>11} {r['runs']:>5} {r['clean']:>6} {r['rc_nonzero']:>6} {r['killed']:>7} "
              f"{r['silent_runs']:>7} {r['corrupt_runs']:>8} {r['median']:>9.2f} {r['p90']:>7.2f} {r['max']:>7.2f} "
              f"{r['over_3x']:>8}")
    mine = results[-1]
    ok = mine["clean"] == mine["runs"] and mine["over_3x"] == 0
    print("PASS" if ok else "FAIL", "(this build: every run clean and none over 3x the median)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
