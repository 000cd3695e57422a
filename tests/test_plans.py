"""Degraded-mode all-reduce plans: every plan gives the same bits (the canonical order does
not depend on who owns what), the plan is the same on every process, and the planner's
shares follow the capacities it is given. On loopback with capacities set by hand; the
test bed runs them with real NIC failures (bench/testbed_plans.sh)."""

import pytest

from harness import LOOPBACK4, run_ranks

CASES = [("float32", "sum", 1_000_003), ("bfloat16", "sum", 300_001), ("float64", "max", 200_000),
         ("int32", "sum", 123_457)]


@pytest.mark.parametrize("world,local,caps", [(4, 1, [4, 4, 4, 2]), (3, 2, [4, 1, 3])])
def test_every_plan_gives_the_same_bits_and_every_process_the_same_plan(world, local, caps):
    res = run_ranks("plans_bit_exact", world, nics=LOOPBACK4[:2], timeout=180,
                    args={"capacities": caps, "cases": CASES, "local": local})
    rows = [r["result"] for r in res]
    for per_process in rows:
        assert all(x["exact"] for x in per_process), [x for x in per_process if not x["exact"]]
    for i in range(len(rows[0])):
        same = {(p[i]["ran"], tuple(p[i]["shares"]), tuple(p[i]["capacities"])) for p in rows}
        assert len(same) == 1, same                      # one plan, agreed everywhere
        assert rows[0][i]["capacities"] == [float(c) for c in caps]
    for case in {tuple(x["case"]) for x in rows[0]}:
        digests = {x["digest"] for x in rows[0] if tuple(x["case"]) == case}
        assert len(digests) == 1, (case, digests)        # every plan: the same bytes
    by_plan = {x["plan"]: x for x in rows[0] if x["case"] == list(CASES[0])}
    assert len({tuple(x["shares"]) for x in by_plan.values()}) >= 3, by_plan   # the plans really differ
    assert by_plan["auto"]["ran"] == "optimal"
    if world == 4:
        assert [round(s, 6) for s in by_plan["optimal"]["shares"]] == [round(1 / 3, 6)] * 3 + [0.0]
        assert [round(s, 4) for s in by_plan["r2cc"]["shares"]] == [0.2917, 0.2917, 0.2917, 0.125]


ALGO_CASES = [("all_reduce", "float32", "sum", 1_000_003), ("all_reduce", "bfloat16", "sum", 3001),
              ("all_reduce", "float64", "prod", 300_001), ("reduce_scatter", "float32", "sum", 600_000),
              ("reduce_scatter", "int32", "max", 1200), ("all_gather", "bfloat16", "sum", 250_001),
              ("broadcast", "float32", "sum", 400_003)]


@pytest.mark.parametrize("world,local,caps", [(4, 1, [4, 4, 4, 2]), (3, 2, [4, 1, 3]), (2, 1, [4, 4])])
def test_every_algorithm_and_plan_gives_the_same_bits(world, local, caps):
    """direct (owners, with every plan), ring (the fold along the ring), doubling (every
    local sum to every process in log2 P rounds; the ring for kinds other than all-reduce) and
    auto, for every kind a ring exists for, large (pieced: 1 MiB pieces, several per ring hop)
    and small: every output is the canonical-order reference, byte for byte, on every process."""
    res = run_ranks("algos_bit_exact", world, nics=LOOPBACK4[:2], timeout=240,
                    args={"capacities": caps, "cases": ALGO_CASES, "local": local})
    rows = [r["result"] for r in res]
    for per_process in rows:
        assert all(x["exact"] for x in per_process), [x for x in per_process if not x["exact"]]
    ran = {(x["algo"], x["plan"]): x["ran"] for x in rows[0] if x["case"][0] == "all_reduce" and x["case"][3] > 5000}
    assert ran[("ring", "balance")][0] == "ring" and ran[("direct", "balance")][0] == "direct", ran
    assert ran[("doubling", "balance")][0] == ("doubling" if world > 1 else "direct"), ran
    assert ran[("auto", "auto")][0] == "direct", ran          # R2CCL_MAX_PEERS (16) >= world - 1
    if world > 2:
        assert ran[("direct", "auto")][1] == "optimal", ran   # the capacities differ: a real plan
    for case in {tuple(x["case"]) for x in rows[0]}:
        digests = {x["digest"] for x in rows[0] if tuple(x["case"]) == case}
        assert len(digests) == 1, (case, digests)        # every algorithm and plan: the same bytes


TWO_LEVEL_CASES = [("all_reduce", "float32", "sum", 1_000_003), ("all_reduce", "bfloat16", "sum", 300_001),
                   ("all_reduce", "float64", "prod", 3001), ("all_reduce", "int32", "max", 0)]


@pytest.mark.parametrize("world,local,max_peers,caps",
                         [(4, 1, 2, [4, 4, 4, 2]), (6, 1, 2, [4, 2, 4, 4, 4, 1]), (6, 1, 3, [4, 4, 1, 4, 3, 4]),
                          (3, 2, 1, [4, 1, 3])],
                         ids=["2x2", "3x2", "2x3", "3x1,local=2"])
def test_two_level_gives_the_canonical_bits_in_every_group_shape(world, local, max_peers, caps):
    """two_level (groups of two_level_group(P, R2CCL_MAX_PEERS) processes; the running fold
    from group to group): two groups, three groups (one in the middle, which passes the fold
    and the result on), groups of one (a chain of owners), every plan inside the groups (the
    capacities differ per group, so do the groups' shares and the owners of a range across
    groups), large (pieced) and small, an empty vector: every output the canonical-order
    reference byte for byte on every process, and what auto runs past R2CCL_MAX_PEERS."""
    from jax_r2ccl import _core
    res = run_ranks("algos_bit_exact", world, nics=LOOPBACK4[:2], timeout=240, config={"max_peers": max_peers},
                    args={"capacities": caps, "cases": TWO_LEVEL_CASES, "local": local,
                          "algos": ["two_level", "direct", "auto"]})
    rows = [r["result"] for r in res]
    for per_process in rows:
        assert all(x["exact"] for x in per_process), [x for x in per_process if not x["exact"]]
    for case in {tuple(x["case"]) for x in rows[0]}:
        digests = {x["digest"] for x in rows[0] if tuple(x["case"]) == case}
        assert len(digests) == 1, (case, digests)        # two_level, direct and auto: the same bytes
    m = max(d for d in range(1, max_peers + 1) if world % d == 0)
    big = [(rank, x) for rank, per in enumerate(rows) for x in per if x["case"][3] == 1_000_003]
    for rank, x in big:
        if x["algo"] == "two_level":
            assert x["ran"][0] == "two_level", x
            group = rank // m
            assert x["processes"] == list(range(group * m, group * m + m)), x   # its own group's plan
            if x["plan"] == "optimal" and m > 1:
                mine = caps[group * m:group * m + m]
                assert (len(set(mine)) == 1) == (len(set(x["shares"])) == 1), x   # unequal hosts: unequal shares
        if x["algo"] == "auto":   # past R2CCL_MAX_PEERS: two_level where groups of 2+ exist, else the ring
            assert x["ran"][0] == ("two_level" if m > 1 else "ring"), x
    assert _core.algo_predict("auto", "auto", [1.0] * world, 4e6, 1e9, max_peers=max_peers)["algo"] == \
        ("two_level" if m > 1 else "ring")


def test_mismatched_plans_are_a_clear_error_on_every_process():
    res = run_ranks("host_mismatch", 2, nics=LOOPBACK4[:2], timeout=60, args={"what": "plan"})
    for r in res:
        out = r["result"]
        assert out["cause"] == "mismatch" and "plan optimal" in out["error"] and "plan balance" in out["error"], out
        assert out["after"] == [3] * 10          # the next collective works


def test_large_collectives_of_different_kinds_are_a_clear_mismatch_on_every_process():
    res = run_ranks("host_kind_mismatch", 3, nics=LOOPBACK4[:2], timeout=60)
    for r in res:
        out = r["result"]
        assert out["cause"] == "mismatch", out
        assert "all_reduce" in out["error"] and "reduce_scatter" in out["error"], out


def test_a_small_all_reduce_against_another_kind_is_a_mismatch_at_once_not_a_timeout():
    """A small all-reduce carries its signature in front of its data under its own tag, so
    the other kind's announcement (same collective, same id) is never received by it: the
    executor finds it in staging and names both (found by the fault matrix: before, every
    process waited out its timeout)."""
    res = run_ranks("host_kind_mismatch", 3, nics=LOOPBACK4[:2], timeout=60, args={"n": 1024, "other": "all_gather"})
    for r in res:
        out = r["result"]
        assert out["cause"] == "mismatch", out
        assert "all_reduce" in out["error"] and "all_gather" in out["error"], out
        assert out["after_s"] < 5.0, out     # the timeout is 10 s; detection takes ~0.1 s


@pytest.mark.parametrize("n,other", [(1024, "all_gather"), (99_999, "reduce_scatter")], ids=["small", "large"])
def test_a_process_that_enters_after_its_peer_failed_on_the_mismatch_and_left_names_the_mismatch(n, other):
    """Process 1 enters the call 1.5 s late: rank 0 has found the disagreement (with process 2),
    failed and closed its endpoint by then, so process 1's receives from it fail at once with
    the peer gone. Rank 0's announcement of its other call (same id) is still in process 1's
    staging, and that is the account process 1 gives, not 'closed its endpoint' (CI under ASan
    saw the peer's close land before the 100 ms same-call probe).
    large: the two kinds' signatures travel under the same tag, so process 1's receive for
    rank 0's signature takes the announcement out of staging: the account must come from the
    signature that arrived even when the receive finished only while the failed send to the
    gone peer was being looked at (CI's quick tier: 'the peer closed its end', 1 run in 20
    under load, when process 1 entered a few ms after the others left)."""
    res = run_ranks("host_kind_mismatch", 3, nics=LOOPBACK4[:2], timeout=60,
                    args={"n": n, "other": other, "late": {"rank": 1, "s": 1.5}})
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["cause"] == "mismatch", (rank, out)
        assert "all_reduce" in out["error"] and other in out["error"], out
