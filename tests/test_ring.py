"""The ring (R2CCL_ALGO=ring, or auto past R2CCL_MAX_PEERS) and connections on demand: a
process connects only to the peers its collectives use, every ring collective is the
canonical-order reference bit for bit, and a disagreement or failure anywhere on the ring is
a clear error on every process of it, not a timeout. Loopback; the 8-host test bed runs the
same with real links (bench/testbed_algos.sh, test_testbed8.py)."""

import pytest

from harness import LOOPBACK4, run_ranks


def _neighbours(rank, world):
    return sorted({(rank - 1) % world, (rank + 1) % world})


@pytest.mark.parametrize("world,config", [(4, {"algo": "ring"}), (5, {"max_peers": 2})],
                         ids=["4,algo=ring", "5,auto,max_peers=2"])
def test_the_ring_connects_each_process_to_its_two_neighbours_only(world, config):
    from jax_r2ccl import _core
    auto = "max_peers" in config
    res = run_ranks("ring_connections", world, nics=LOOPBACK4[:2], config=config, timeout=120)
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["bad"] == [], out
        # auto past R2CCL_MAX_PEERS: the ring for the large all-reduce, doubling for the small.
        assert out["algos"] == ["ring", "doubling" if auto else "ring"], out
        rails = out["rails_per_peer"]
        seen = {s["when"]: s for s in out["seen"]}
        # Start-up and every ring collective: the two neighbours, 2 x rails connections.
        for when in ("start", "reduce_scatter", "all_gather", "broadcast"):
            assert seen[when]["opened"] == _neighbours(rank, world), (rank, when, seen[when])
        assert seen["broadcast"]["rails_up"] == 2 * rails, (rank, seen)
        # The small all-reduce under doubling opens its partners (2^r before and after).
        partners = sorted(set(_neighbours(rank, world)) | {(rank + s * d) % world for d in (1, 2, 4)
                                                           if d < world for s in (1, -1)} - {rank})
        assert seen["all_reduce"]["opened"] == (partners if auto else _neighbours(rank, world)), (rank, seen)
        assert len(partners) == _core.algo_predict("doubling", "auto", [1.0] * world, 4000.0, 1e9)["peers"]
        # All-to-all is always direct: it opens every peer on first use.
        assert seen["all_to_all"]["opened"] == [p for p in range(world) if p != rank], (rank, seen)
        assert seen["all_to_all"]["rails_up"] == (world - 1) * rails, (rank, seen)


def test_two_level_connects_each_process_to_its_group_and_its_column_neighbours_only():
    """Past R2CCL_MAX_PEERS a large all-reduce runs two_level (6 processes, R2CCL_MAX_PEERS=2:
    three groups of two): each process dials its group and the same column in the groups
    before and after it at start-up, and the all-reduces open nothing else."""
    from jax_r2ccl import _core
    world, m = 6, 2
    res = run_ranks("two_level_connections", world, nics=LOOPBACK4[:2], config={"max_peers": m}, timeout=120)
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["bad"] == [] and out["algos"] == ["two_level"] * 3, out
        group = rank // m
        peers = sorted((set(range(group * m, group * m + m)) | {(rank + m) % world, (rank - m) % world}) - {rank})
        assert out["seen"]["start"] == peers and out["seen"]["after"] == peers, (rank, out["seen"])
        assert len(peers) == _core.algo_predict("auto", "auto", [1.0] * world, 4e6, 1e9, max_peers=m)["peers"]
        assert peers == sorted(_core.startup_peers("auto", rank, world, m))


def test_direct_within_max_peers_connects_to_every_process_at_start():
    world = 3
    res = run_ranks("ring_connections", world, nics=LOOPBACK4[:2], timeout=120)
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["bad"] == [] and out["algos"] == ["direct", None], out
        assert out["seen"][0]["opened"] == [p for p in range(world) if p != rank]
        assert out["seen"][0]["rails_up"] == (world - 1) * out["rails_per_peer"]


def test_a_mismatch_on_the_ring_is_a_clear_error_on_every_process_at_once():
    """Process 1 calls an int32 all-reduce, the others float32: its two neighbours see its
    signature; process 3, which never exchanges with it, hears of it through the ring."""
    res = run_ranks("host_mismatch", 4, nics=LOOPBACK4[:2], config={"algo": "ring"}, timeout=60,
                    args={"what": "dtype"})
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["cause"] == "mismatch", (rank, out)
        assert "int32" in out["error"] and "float32" in out["error"], (rank, out)
        assert out["seconds"] < 2.0, (rank, out)        # the call's timeout is 5 s
        assert out["after"] == [10] * 10                 # the next collective works
    assert "told by process" in res[3]["result"]["error"], res[3]["result"]


def test_processes_that_disagree_about_the_algorithm_get_a_clear_error():
    res = run_ranks("host_mismatch", 4, nics=LOOPBACK4[:2], timeout=60, args={"what": "algo"})
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["cause"] == "mismatch", (rank, out)
        assert "algorithm direct" in out["error"] and "algorithm ring" in out["error"], (rank, out)
        assert out["seconds"] < 4.0, (rank, out)
        assert out["after"] == [10] * 10



def test_a_mismatch_under_two_level_is_a_clear_error_on_every_process_at_once():
    """Six processes in three groups of two (R2CCL_ALGO=two_level, R2CCL_MAX_PEERS=2): process 1
    calls an int32 all-reduce, the others float32; its group and its column's neighbours see
    its signature, the others hear of it through them."""
    world = 6
    res = run_ranks("host_mismatch", world, nics=LOOPBACK4[:2], config={"algo": "two_level", "max_peers": 2},
                    timeout=90, args={"what": "dtype"})
    for rank, r in enumerate(res):
        out = r["result"]
        assert out["cause"] == "mismatch", (rank, out)
        assert "int32" in out["error"] and "float32" in out["error"], (rank, out)
        assert out["seconds"] < 2.5, (rank, out)        # the call's timeout is 5 s
        assert out["after"] == [21] * 10, (rank, out)   # the next collective works
    assert "told by process" in res[2]["result"]["error"], res[2]["result"]   # not a neighbour of process 1


@pytest.mark.parametrize("setting,values", [("algo", ["ring", "direct", "ring", "ring"]),
                                             ("max_peers", [2, 2, 3, 2])], ids=["algo", "max_peers"])
def test_processes_started_with_different_start_up_settings_fail_at_once_naming_the_setting(setting, values):
    """R2CCL_ALGO and R2CCL_MAX_PEERS decide which peers a process dials at start-up; processes
    that disagree used to wait for each other's rails until the bootstrap timeout ("rails not up
    after 30 s", naming neither). Now every process fails at start-up with a mismatch that
    names the setting, both values and the process that differs, long before that timeout."""
    from jax_r2ccl.config import SETTINGS
    env = next(s.env for s in SETTINGS if s.field == setting)
    res = run_ranks("barrier", 4, nics=LOOPBACK4[:2], timeout=60, expect_fail=True,
                    config={"algo": "auto", "max_peers": 2, "bootstrap_timeout_s": 30.0},
                    rank_config=[{setting: v} for v in values])
    odd = values.index(next(v for v in values if values.count(v) == 1))
    for rank, r in enumerate(res):
        assert not r["ok"] and r["cause"] == "mismatch", (rank, r)
        assert env in r["error"] and all(str(v) in r["error"] for v in set(values)), (rank, r["error"])
        assert f"process {odd}" in r["error"] or rank == odd, (rank, r["error"])
        assert r["peer"] >= 0, (rank, r)


def test_back_to_back_large_all_reduces_under_every_algorithm():
    """Doubling posts a round's send once the slots it carries have arrived; an op whose fold
    completed between that look and its last check finished without the send, and its partner,
    one call behind, waited out its timeout (seen under ASan in test_plans.py; fixed: the sends
    are looked at again after the folds, and an op with a round unsent is not done)."""
    res = run_ranks("repeated_all_reduces", 4, nics=LOOPBACK4[:2], timeout=180,
                    args={"algos": ["doubling", "ring", "doubling", "direct", "doubling"], "reps": 4})
    for r in res:
        assert r["result"] == {"wrong": 0, "calls": 20}, r["result"]
