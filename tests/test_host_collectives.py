"""The collective algorithms (csrc/coll) over real processes and the multi-rail transport:
every op × dtype on 2 and 3 processes with 1 and 2 ranks per process, checked bit for bit
against the canonical order (local ranks first, then processes, each in rank order)."""

import pytest

from harness import run_ranks

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"]


def _cases(n_ranks):
    cases = []
    for i, dt in enumerate(DTYPES):
        op = ["sum", "prod", "min", "max"][i % 4]
        cases.append(("all_reduce", dt, "sum", 1001, 0))
        cases.append(("all_reduce", dt, op, 257, 0))
        cases.append(("reduce_scatter", dt, "sum", n_ranks * 300, 0))
        cases.append(("all_gather", dt, "sum", 123, 0))
        cases.append(("all_to_all", dt, "sum", n_ranks * 50, 0))
        cases.append(("broadcast", dt, "sum", 99, n_ranks - 1))
        cases.append(("permute", dt, "sum", 77, 0, [(r + 1 + i) % n_ranks for r in range(n_ranks)]))
    # partial: rank 0 sends nowhere, nothing arrives at rank 1 (zeros); a fixed point
    cases.append(("permute", "float32", "sum", 500, 0, [-1] + [(r + 1) % n_ranks for r in range(1, n_ranks)]))
    cases.append(("permute", "int64", "sum", 64, 0, list(range(n_ranks))))
    cases.append(("all_reduce", "bool", "max", 100, 0))
    cases.append(("all_reduce", "bool", "min", 100, 0))
    cases.append(("all_reduce", "float32", "sum", 0, 0))
    return cases


@pytest.mark.parametrize("world,local", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_every_collective_and_dtype_is_bit_exact(world, local):
    rs = run_ranks("host_collective", world, args={"cases": _cases(world * local), "local": local}, timeout=180)
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]["bad"]


@pytest.mark.parametrize("world,local", [(2, 1), (3, 2)])
def test_large_pipelined_collectives_are_bit_exact(world, local):
    n = world * local
    cases = [("all_reduce", "float32", "sum", 6_000_000, 0), ("reduce_scatter", "float32", "sum", n * 700_000, 0),
             ("all_reduce", "bfloat16", "sum", 3_000_001, 0)]
    rs = run_ranks("host_collective", world, args={"cases": cases, "local": local}, timeout=180)
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]["bad"]


@pytest.mark.parametrize("fault", ["close", "stall"])
def test_rail_fault_in_the_middle_of_an_all_reduce_is_bit_exact(fault):
    # 4 rails at 40 MB/s each: a 64 MiB all-reduce moves 32 MiB each way, ~0.2 s
    cases = [("all_reduce", "float32", "sum", 16 << 20, 0)] * 2
    rs = run_ranks("host_collective", 2, timeout=120, args={
        "cases": cases, "rate": 40e6, "fault": {"case": 0, "after_s": 0.08, "rail": 2, "fault": fault}})
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]["bad"]
    assert rs[0]["result"]["stats"]["1"][2]["failures"] >= 1


@pytest.mark.parametrize("peer", [1, 2], ids=["inside-the-group", "across-groups"])
def test_rail_fault_in_the_middle_of_a_two_level_all_reduce_is_bit_exact(peer):
    # 4 processes, R2CCL_MAX_PEERS=2: two groups of two (auto: two_level). Rank 0's rail to its
    # group's other member, or to its column's owner in the other group (the running fold and
    # the result cross there), closed 80 ms into a 16 MiB all-reduce (4 rails at 10 MB/s each
    # per peer: ~0.4 s). The call's timeout is 60 s: under ThreadSanitizer (test_sanitizers.py)
    # four instrumented processes on two cores took over 10 s for a 64 MiB one.
    cases = [("all_reduce", "float32", "sum", 4 << 20, 0)] * 2
    rs = run_ranks("host_collective", 4, timeout=240, config={"max_peers": 2, "timeout_s": 60.0}, args={
        "cases": cases, "rate": 10e6, "fault": {"case": 0, "after_s": 0.08, "rail": 1, "fault": "close", "peer": peer}})
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]["bad"]
    assert rs[0]["result"]["stats"][str(peer)][1]["failures"] >= 1


@pytest.mark.parametrize("world,local", [(2, 2), (3, 1)])
def test_a_large_permute_through_a_rail_fault_is_bit_exact(world, local):
    # jax.lax.ppermute's collective: 32 MiB per rank around the ring, a rail closed 80 ms in.
    n = world * local
    ring = [(r + local) % n for r in range(n)]      # every block crosses to the next process
    cases = [("permute", "float32", "sum", 8 << 20, 0, ring)] * 2
    rs = run_ranks("host_collective", world, timeout=120, args={
        "cases": cases, "local": local, "rate": 40e6, "fault": {"case": 0, "after_s": 0.08, "rail": 1, "fault": "close"}})
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]["bad"]
    assert rs[0]["result"]["stats"]["1"][1]["failures"] >= 1


@pytest.mark.parametrize("what", ["perm", "bad_perm"])
def test_a_permute_the_processes_disagree_on_or_that_is_impossible_fails_everywhere(what):
    rs = run_ranks("host_mismatch", 3, timeout=60, args={"what": what})
    for r in rs:
        res = r["result"]
        assert res["error"] and "permute" in res["error"], res
        if what == "perm":
            assert res["cause"] == "mismatch", res
        else:
            assert res["cause"] == "invalid_argument" and "sends to rank 0 twice" in res["error"], res
        assert res["after"] == [6] * 10, res


@pytest.mark.parametrize("what", ["size", "dtype", "op"])
def test_processes_that_disagree_get_a_clear_error_and_go_on(what):
    rs = run_ranks("host_mismatch", 2, timeout=60, args={"what": what})
    for r in rs:
        res = r["result"]
        assert res["error"] and res["cause"] == "mismatch", res
        assert "all_reduce" in res["error"], res
        if what != "size":
            assert "float32" in res["error"] and ("int32" in res["error"] or "max" in res["error"]), res
        assert res["after"] == [3] * 10, res


def _ragged_cases():
    # (dtype, input rows, row shape, slices per peer, most rows per slice)
    return [("float32", 40, (3,), 1, 9), ("bfloat16", 33, (), 2, 7), ("int64", 20, (2, 2), 3, 4),
            ("bool", 16, (5,), 1, 6), ("uint8", 64, (7,), 1, 0), ("float64", 50, (1,), 2, 1)]


@pytest.mark.parametrize("world,local", [(1, 3), (2, 1), (2, 2), (3, 1)])
def test_ragged_all_to_all_is_bit_exact(world, local):
    # jax.lax.ragged_all_to_all's collective: slices of every size (zero included), several per
    # peer, input slices overlapping, outputs keeping their own rows where nothing lands.
    rs = run_ranks("host_ragged", world, args={"cases": _ragged_cases(), "local": local}, timeout=120)
    for r in rs:
        res = r["result"]
        assert res["bad"] == [] and res["errors"] == [], res


def test_a_large_ragged_all_to_all_through_a_rail_fault_is_bit_exact():
    # about 24 MiB per rank in 1 KiB rows, a rail closed 80 ms in (4 rails at 40 MB/s).
    cases = [("float32", 24 << 10, (256,), 2, 12 << 10)] * 2
    rs = run_ranks("host_ragged", 2, timeout=120, args={
        "cases": cases, "rate": 40e6, "fault": {"case": 0, "after_s": 0.08, "rail": 1, "fault": "close"}})
    for r in rs:
        assert r["result"]["bad"] == [] and r["result"]["errors"] == [], r["result"]
    assert rs[0]["result"]["stats"]["1"][1]["failures"] >= 1


@pytest.mark.parametrize("what", ["negative", "past_input", "past_output", "expects_more", "overlap"])
def test_a_ragged_all_to_all_with_bad_slices_fails_with_the_cause_and_the_next_call_works(what):
    # A rank whose own slices are impossible: every process fails naming it and why. Two ranks
    # that disagree on a slice's size: both name it. A receiver two slices overlap in: it names
    # them. No hang, and the processes go on.
    rank = {"overlap": 2}.get(what, 1)
    rs = run_ranks("host_ragged", 3, timeout=90, args={"cases": [("float32", 30, (2,), 1, 8)],
                                                         "break_": {"rank": rank, "what": what}})
    errs = [r["result"]["errors"] for r in rs]
    for p, r in enumerate(rs):
        assert r["result"]["bad"] == [] and r["result"]["after"] == [6] * 10, r["result"]
    if what in ("negative", "past_input", "past_output"):
        for e in errs:
            assert len(e) == 1 and e[0]["cause"] == "invalid_argument" and f"rank {rank}: slice" in e[0]["error"], errs
    elif what == "expects_more":
        for p in (0, 1):
            assert len(errs[p]) == 1 and errs[p][0]["cause"] == "mismatch", errs
            assert "rank 0 sends" in errs[p][0]["error"] and "which expects" in errs[p][0]["error"], errs
    else:
        assert len(errs[2]) == 1 and errs[2][0]["cause"] == "invalid_argument", errs
        assert "of rank 2's output are written by rank" in errs[2][0]["error"], errs
