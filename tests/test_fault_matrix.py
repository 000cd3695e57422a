"""The fault matrix on the namespace test bed: {fail, flap, black hole, degrade to a tenth,
all NICs but one, all NICs for 1 s, all NICs held down, peer SIGKILL, peer SIGSTOP,
mismatched collective} x {2, 4 hosts} x {4 KiB, 16 MiB per rank} x {psum (all_reduce),
all_gather, psum_scatter (reduce_scatter), all_to_all}.

Every cell ends bit-exact, or with an R2cclError on every surviving process within
R2CCL_TIMEOUT + SLACK_S; never a hang, a wrong answer or a crash. Faults that a job survives
run their eight cells in one job, a size at a time with its four kinds in flight at once (a
thread each), the fault landing again in each size's round; faults that end a job run
one job per size, its four kinds in flight at once (a thread each). The rows are written to build/fault-matrix.json; tests/fault_matrix_report.py
turns them into docs/faults.md's table. Needs root; skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import shlex
import sys

import pytest

from harness import ROOT, run_ranks
from jax_r2ccl.tools import testbed
from test_testbed import NICS, _why_not, hosts, tb

pytestmark = [pytest.mark.testbed, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

RATE = "200mbit"
TENTH = "20mbit"
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
SIZES = [4 << 10, 16 << 20]
CELLS = [(k, n) for n in SIZES for k in KINDS]
TIMEOUT_S = 2.0          # R2CCL_TIMEOUT of the jobs a fault ends
SURVIVE_TIMEOUT_S = 10.0  # ... and of the jobs that survive theirs (all NICs down for 1 s < 10 s)
SLACK_S = 2.0            # stated slack: detection (3 heartbeats) plus scheduling on 2 shared cores
NIC = 2                  # the NIC a single-NIC fault hits, on the last host


def _all(verb: str, host: int, nics) -> str:
    """One process that runs the test bed's `verb` on each listed NIC of `host` in turn,
    milliseconds apart (a chain of test-bed commands pays a Python start per NIC, 0.1-0.3 s
    each: "every NIC down for 1 s" was then down together for half that)."""
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('bed', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); "
            f"[getattr(m, {verb!r})({int(host)}, k) for k in {[int(k) for k in nics]!r}]")
    return shlex.join([sys.executable, "-I", "-c", code, os.path.abspath(testbed.__file__)])


def _survivable(h: int) -> dict:
    """fault -> (fault command, heal command, fault at, heal at, settle after heal)."""
    return {
        "fail": (tb("fail", h, NIC), tb("heal", h, NIC), 0.3, 1.1, 0.6),
        "flap": (tb("flap", h, NIC, 50, 6), None, 0.3, 0.9, 0.6),
        "blackhole": (tb("blackhole", h, NIC), tb("degrade", h, NIC, "base"), 0.3, 1.1, 0.6),
        "degrade": (tb("degrade", h, NIC, TENTH), tb("degrade", h, NIC, "base"), 0.3, 1.3, 0.6),
        "all_but_one": (_all("fail", h, [1, 2, 3]), _all("heal", h, [1, 2, 3]), 0.3, 1.1, 0.6),
        "all_nics_1s": (_all("fail", h, [0, 1, 2, 3]), _all("heal", h, [0, 1, 2, 3]), 0.3, 1.3, 0.8),
    }


# A fault that fails rails must show it in the victim's rail statistics (the fault landed).
FAILS_RAILS = {"fail", "flap", "blackhole", "all_but_one", "all_nics_1s"}
FATAL = ["kill", "stop", "all_nics_held"]

ROWS: list[dict] = []


@pytest.fixture(scope="module")
def bed():
    testbed.up(4, 4, RATE)
    try:
        yield
    finally:
        testbed.down()
        out = os.environ.get("R2CCL_FAULT_MATRIX_OUT", os.path.join(ROOT, "build", "fault-matrix.json"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"rate": RATE, "timeout_s": TIMEOUT_S, "survive_timeout_s": SURVIVE_TIMEOUT_S,
                       "slack_s": SLACK_S, "rows": ROWS}, f, indent=1)


def _restore(world: int):
    """Every NIC of every host up, at the base rate, no black hole: the next cell starts clean."""
    for h in range(world):
        for k in range(4):
            testbed.heal(h, k)
            testbed.degrade(h, k, "base")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fault", list(_survivable(1)))
def test_survivable_fault_every_cell_bit_exact(bed, fault, world):
    _restore(4)
    victim = world - 1
    cmd, heal, at, heal_at, settle = _survivable(victim)[fault]
    rs = run_ranks("matrix_workers:survivable", world, nics=NICS, netns=hosts(world), timeout=400,
                   config={"timeout_s": SURVIVE_TIMEOUT_S},
                   args={"cells": CELLS, "fault_cmd": cmd, "heal_cmd": heal, "fault_after_s": at,
                         "heal_after_s": heal_at, "settle_s": settle})
    _restore(4)
    res = [r["result"]["cells"] for r in rs]
    for ci, (kind, n) in enumerate(CELLS):
        rows = [res[r][ci] for r in range(world)]
        ROWS.append({"fault": fault, "hosts": world, "kind": kind, "nbytes": n, "outcome": "bit-exact",
                     "iters": rows[0]["iters"], "wrong": sum(x["wrong"] for x in rows),
                     "healthy_s": max(x["healthy_s"] for x in rows), "worst_s": max(x["worst_s"] for x in rows),
                     "after_heal_s": rows[0]["after_heal_s"], "victim_failures": rows[victim]["failures"]})
        for r, x in enumerate(rows):
            assert x["wrong"] == 0, (fault, world, kind, n, r, x)
            # No iteration waited out the timeout (a failover that did not happen would).
            assert x["worst_s"] < SURVIVE_TIMEOUT_S, (fault, world, kind, n, r, x)
        assert all(c["rc"] == 0 for c in rows[0]["cmds"]), rows[0]["cmds"]
        if fault in FAILS_RAILS:
            assert rows[victim]["failures"] >= 1, (fault, world, kind, n, rows[victim])


@pytest.mark.parametrize("world", [2, 4])
def test_mismatched_collective_is_an_error_on_every_process_then_the_next_works(bed, world):
    _restore(4)
    victim = world - 1
    rs = run_ranks("matrix_workers:mismatched", world, nics=NICS, netns=hosts(world), timeout=300,
                   config={"timeout_s": TIMEOUT_S}, args={"cells": CELLS, "victim": victim, "timeout_s": TIMEOUT_S})
    res = [r["result"]["cells"] for r in rs]
    for ci, (kind, n) in enumerate(CELLS):
        rows = [res[r][ci] for r in range(world)]
        ROWS.append({"fault": "mismatch", "hosts": world, "kind": kind, "nbytes": n,
                     "outcome": "error: " + "/".join(sorted({str(x.get("cause")) for x in rows})),
                     "fail_s": max(x["after_s"] for x in rows), "other": rows[victim]["other"]})
        for r, x in enumerate(rows):
            assert x["error"] and x["cause"] == "mismatch", (kind, n, r, x)
            assert x["after_s"] <= TIMEOUT_S + SLACK_S, (kind, n, r, x)
            assert x["then_wrong"] == 0, (kind, n, r, x)


FATAL_CAUSES = {"peer_gone", "all_rails_down", "timeout"}


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fault", FATAL)
def test_fatal_fault_is_an_error_on_every_survivor_within_the_timeout(bed, fault, world, nbytes):
    """The four kinds in flight at once (one thread each) when the fault lands: every one
    raises on every surviving process."""
    _restore(4)
    victim = world - 1
    args = {"kinds": KINDS, "nbytes": nbytes, "victim": victim, "fault_after_s": 0.3,
            "limit_s": TIMEOUT_S + SLACK_S + 10}
    if fault == "all_nics_held":
        args.update(fault="cmd", fault_cmd=_all("fail", victim, [0, 1, 2, 3]))
    else:
        args["fault"] = fault
    try:
        rs = run_ranks("matrix_workers:fatal", world, nics=NICS, netns=hosts(world), timeout=120,
                       config={"timeout_s": TIMEOUT_S}, args=args, expect_fail=True,
                       may_die={victim} if fault == "kill" else (),
                       stopped={victim} if fault == "stop" else ())
    finally:
        _restore(4)
    survivors = [r for r in range(world) if fault == "all_nics_held" or r != victim]
    if fault in ("kill", "stop"):
        assert rs[victim].get("died"), rs[victim]
    for r in survivors:
        assert rs[r]["ok"], rs[r]
    res = {r: rs[r]["result"] for r in survivors}
    for kind in KINDS:
        cells = {r: x["cells"][kind] for r, x in res.items()}
        ROWS.append({"fault": fault, "hosts": world, "kind": kind, "nbytes": nbytes,
                     "outcome": "error: " + "/".join(sorted({str(x.get("cause")) for x in cells.values()})),
                     "fail_s": max((x.get("after_s") or 0) for x in cells.values()),
                     "close_s": max(x["close_s"] for x in res.values())})
        for r, x in cells.items():
            assert x["wrong"] == 0, (kind, r, x)
            assert x["error"] and x["cause"] in FATAL_CAUSES, (kind, r, x)
            assert 0 <= x["after_s"] <= TIMEOUT_S + SLACK_S, (kind, r, x)
    for r, x in res.items():
        assert x["close_s"] < SLACK_S, (r, x["close_s"])
