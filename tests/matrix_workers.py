"""Workers of the fault matrix (tests/test_fault_matrix.py), run on every rank by
tests/harness.py as "matrix_workers:<name>".

Each cell is one collective kind at one size, run in a loop through the executor that the
JAX custom calls reach (HostCollectives, with the health monitor feeding the planner as in
jax_r2ccl's runtime) while a fault lands; every output is compared bit for bit with the
canonical-order reference. Times that cross processes are wall-clock (time.time()): the
test bed's hosts are namespaces of one machine and share its clock."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np

from jax_r2ccl.errors import R2cclError
from workers import _rank_input, barrier, host_reference

DTYPE = "float32"
MAX_ITERS = 20000         # per cell, whatever the clock says


def _setup(ep):
    from jax_r2ccl.transport.health import HealthMonitor
    from jax_r2ccl.transport.host_collectives import HostCollectives
    mon = HealthMonitor(ep)
    hc = HostCollectives(ep, name="matrix")
    hc.set_capacity(mon)
    return hc, mon


def _teardown(hc, mon):
    hc.set_capacity(None)
    mon.close()
    hc.close()


def _case(kind, nbytes, rank, world, seed):
    """This rank's input and the output every rank must see, for `nbytes` of input per rank."""
    count = nbytes // np.dtype(DTYPE).itemsize
    pr = list(range(world))
    ins = [_rank_input(kind, DTYPE, count, r, seed=seed) for r in pr]
    return ins[rank], host_reference(kind, "sum", ins, pr)[rank].tobytes()


def _agreed_time(hc, world, rank, lead_s=0.2) -> float:
    """A wall-clock instant every process agrees on, `lead_s` after the latest of them got here."""
    t = hc.run("all_reduce", [np.array([time.time()], np.float64)], process_of_rank=list(range(world)),
               my_ranks=[rank], op="max")
    return float(t[0][0]) + lead_s


def _failures(ep, rank, world) -> int:
    return sum(s["failures"] for p in range(world) if p != rank for s in ep.rail_stats(p))


def _wait_rails_up(ep, rank, world, limit_s=20.0) -> float:
    """Until every rail to every peer is up again (a flapping link is held down for a while
    after it settles), bounded; returns how long it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if all(s["state"] == "up" for p in range(world) if p != rank for s in ep.rail_stats(p)):
            break
        time.sleep(0.02)
    return time.monotonic() - t0


def _shell(cmd: str, log: list, what: str):
    t0 = time.time()
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
    log.append({"what": what, "t0": t0, "t1": time.time(), "rc": r.returncode, "err": r.stderr[-500:]})


def _at(when: float, fn):
    def run():
        time.sleep(max(0.0, when - time.time()))
        fn()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def survivable(ep, rank, world, cells, fault_cmd, heal_cmd, fault_after_s, heal_after_s, settle_s,
               warmup=2, prime_cmd=None):
    """The cells (kind, nbytes) of one size run together, a round: each kind loops on its own
    thread (calls named by key, so the kinds are in flight at once and the fault lands in every
    one), while rank 0 runs `fault_cmd` at fault_after_s and `heal_cmd` at heal_after_s from the
    round's agreed start; each loop runs until settle_s after the heal. Returns per cell:
    iterations, wrong outputs, the healthy median (the kinds alone, before the round), the
    longest iteration and when it ran, and the rail failures this process saw in the round.
    "{cell}" in a command is the round's index (a file name per round, say). prime_cmd: run
    once by rank 0 before the rounds, untimed, so that the fault command's first run is as
    quick as the rest (in an emulated guest, tc's first netem qdisc took 2.2 s: its binary and
    module read over 9p, and the hole began just before its heal)."""
    hc, mon = _setup(ep)
    if prime_cmd and rank == 0:
        _shell(prime_cmd, [], "prime")
    rows = []
    pr = list(range(world))
    try:
        for ri, nbytes in enumerate(dict.fromkeys(n for _, n in cells)):
            kinds = [k for k, n in cells if n == nbytes]
            cases = {k: _case(k, nbytes, rank, world, seed=10 * ri + i) for i, k in enumerate(kinds)}
            waited = _wait_rails_up(ep, rank, world)
            barrier(ep, rank, world)
            wrong = {k: 0 for k in kinds}
            errors = []

            # One iteration: the cell's collective, then the 4-byte all-reduce that says whether
            # to go on. Either may be the one the fault catches, so the two are timed together
            # (what a training step of two collectives would pay).
            def loop(k, phase, steps, n, end):
                mine, ref = cases[k]
                try:
                    for i in range(n):
                        t0 = time.time()
                        out = hc.run(k, [mine], process_of_rank=pr, my_ranks=[rank], key=f"{ri}/{phase}/{k}/{i}")
                        wrong[k] += int(out[0].tobytes() != ref)
                        flag = np.array([1 if (rank == 0 and time.time() < end) else 0], np.int32)
                        go = hc.run("all_reduce", [flag], process_of_rank=pr, my_ranks=[rank], op="max",
                                    key=f"{ri}/{phase}/{k}/go/{i}")[0][0]
                        steps[k].append((t0, time.time()))
                        if not go:
                            return
                except BaseException as e:  # noqa: BLE001 - raised again on the rank's thread
                    errors.append(e)

            def together(phase, n, end):
                steps = {k: [] for k in kinds}
                threads = [threading.Thread(target=loop, args=(k, phase, steps, n, end)) for k in kinds]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if errors:
                    raise errors[0]
                return steps
            # Healthy: the kinds in flight together, as they will be under the fault.
            healthy = together("warm", warmup, float("inf"))
            f0 = _failures(ep, rank, world)
            start = _agreed_time(hc, world, rank)
            t_fault, t_heal = start + fault_after_s, start + heal_after_s
            end = t_heal + settle_s
            log, timers = [], []
            if rank == 0:
                fc, hc_ = fault_cmd.replace("{cell}", str(ri)), (heal_cmd or "").replace("{cell}", str(ri))
                timers.append(_at(t_fault, lambda: _shell(fc, log, "fault")))
                if hc_:
                    timers.append(_at(t_heal, lambda: _shell(hc_, log, "heal")))
            time.sleep(max(0.0, start - time.time()))
            steps = together("fault", MAX_ITERS, end)
            for t in timers:
                t.join(timeout=90)
            failures = _failures(ep, rank, world) - f0
            for k in kinds:
                worst = max(steps[k], key=lambda s: s[1] - s[0])
                after_heal = [b - a for a, b in steps[k] if a >= t_heal + settle_s / 2]
                rows.append({"kind": k, "nbytes": nbytes, "iters": len(steps[k]) + warmup, "wrong": wrong[k],
                             "healthy_s": float(np.median([b - a for a, b in healthy[k]])),
                             "worst_s": worst[1] - worst[0],
                             "worst_at_s": worst[0] - t_fault,
                             "after_heal_s": float(np.median(after_heal)) if after_heal else None,
                             "failures": failures, "cmds": log, "waited_up_s": waited,
                             "slow": [(round(a - t_fault, 3), round(b - a, 3)) for a, b in steps[k] if b - a > 0.05][:20]})
    finally:
        barrier(ep, rank, world)
        _teardown(hc, mon)
    return {"cells": rows}


def fatal(ep, rank, world, kinds, nbytes, fault, victim, fault_after_s, fault_cmd=None, limit_s=30.0):
    """The cells of one size whose fault ends the job, together: each kind loops on its own
    thread (calls named by key, so the four are in flight at once) until it raises. `fault`:
    kill / stop (the victim sends itself SIGKILL / SIGSTOP), cmd (rank 0 runs fault_cmd).
    Returns per kind the iterations before the fault (all checked) and the error: its cause,
    peer and sentence, and how long after the fault it was raised."""
    hc, mon = _setup(ep)
    pr = list(range(world))
    cases = {k: _case(k, nbytes, rank, world, seed=7 + i) for i, k in enumerate(kinds)}
    res = {k: {"iters": 0, "wrong": 0, "error": None} for k in kinds}
    for k, (mine, ref) in cases.items():
        out = hc.run(k, [mine], process_of_rank=pr, my_ranks=[rank])
        res[k]["wrong"] += int(out[0].tobytes() != ref)
    t_fault = _agreed_time(hc, world, rank) + fault_after_s
    log = []
    if rank == victim and fault in ("kill", "stop"):
        sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
        _at(t_fault, lambda: os.kill(os.getpid(), sig))
    if rank == 0 and fault == "cmd":
        _at(t_fault, lambda: _shell(fault_cmd, log, "fault"))

    def loop(k):
        mine, ref = cases[k]
        r = res[k]
        while r["iters"] < MAX_ITERS and time.time() < t_fault + limit_s:
            try:
                out = hc.run(k, [mine], process_of_rank=pr, my_ranks=[rank], key=f"{k}/{r['iters']}")
            except R2cclError as e:
                r.update(error=str(e), cause=e.cause, peer=e.peer, after_s=time.time() - t_fault)
                return
            r["iters"] += 1
            r["wrong"] += int(out[0].tobytes() != ref)
    threads = [threading.Thread(target=loop, args=(k,)) for k in kinds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # No closing barrier: the job is over (a peer is dead, stopped or cut off). Closing the
    # executor must itself return promptly.
    t0 = time.monotonic()
    _teardown(hc, mon)
    return {"cells": res, "close_s": time.monotonic() - t0, "cmds": log}


def mismatched(ep, rank, world, cells, victim, timeout_s):
    """For each cell: every process but `victim` runs the cell's collective, the victim runs
    another kind with the same input. Every process must raise (cause mismatch) within
    timeout_s; then the same collective on every process must work, bit-exact."""
    hc, mon = _setup(ep)
    kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    rows = []
    try:
        for ci, (kind, nbytes) in enumerate(cells):
            mine, ref = _case(kind, nbytes, rank, world, seed=ci)
            pr = list(range(world))
            mykind = kinds[(kinds.index(kind) + 1) % len(kinds)] if rank == victim else kind
            t0 = time.time()
            row = {"kind": kind, "nbytes": nbytes, "other": mykind, "error": None}
            try:
                hc.run(mykind, [mine], process_of_rank=pr, my_ranks=[rank], timeout=timeout_s)
            except R2cclError as e:
                row.update(error=str(e), cause=e.cause, peer=e.peer)
            row["after_s"] = time.time() - t0
            out = hc.run(kind, [mine], process_of_rank=pr, my_ranks=[rank])
            row["then_wrong"] = int(out[0].tobytes() != ref)
            rows.append(row)
    finally:
        barrier(ep, rank, world)
        _teardown(hc, mon)
    return {"cells": rows}
