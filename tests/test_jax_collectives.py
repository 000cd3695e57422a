"""jax_r2ccl.psum and friends inside jax.jit + jax.shard_map, across real processes joined by
jax.distributed (tests/jax_rank_main.py), checked against jax.lax on the same inputs.

Matrix: every op (psum, pmean, pmax, pmin, all_gather, psum_scatter, all_to_all; tiled and
not) x dtype (float32, float64, float16, bfloat16, int8, uint8, int32, uint32, int64, uint64,
bool where jax.lax allows it: psum_scatter refuses bool) over all devices, on 2, 3 and 4
processes with 1 local device and on 2 and 3 processes with 2 local devices; on the 2-D
meshes also over each axis alone and over both in reverse order (groups, rank order) for
float32, bfloat16 and int64. Inputs are small integers (halves for floats) whose sums are
exact in every dtype, so r2ccl and jax.lax must agree bit for bit whatever their summation
order; random normal floats are checked against the exact sum within N * eps * sum|x_i|
(N devices). Results every group member must hold (all-reduces, all-gathers) are compared by
digest across all devices of all processes.

Each group of checks is one multi-process run (a process costs ~1-2 s of jax import and
distributed start); the runs are module fixtures shared by the tests that read them."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")
pytest.importorskip("jax_r2ccl._core")

from jax_rank_main import run_jax_ranks  # noqa: E402

CONFIGS = [(2, 1), (2, 2), (3, 1), (3, 2), (4, 1)]


def _merge_digests(results):
    merged = {}
    for r in results:
        for case, per_dev in r["result"]["digests"].items():
            for pos, (group, dig) in per_dev.items():
                merged.setdefault(case, {}).setdefault(group, {})[int(pos)] = dig
    return merged


# The quick tier runs the matrix on 3 processes x 2 devices (a process count that is not a power
# of two, several devices per process); the other shapes are the proof tier's.
QUICK_CONFIG = (3, 2)


@pytest.fixture(scope="module", ids=[f"{w}proc-x{l}dev" for w, l in CONFIGS],
                params=[c if c == QUICK_CONFIG else pytest.param(c, marks=pytest.mark.proof) for c in CONFIGS])
def matrix(request):
    world, local = request.param
    return world, local, run_jax_ranks("matrix", world, local=local, timeout=180)


def test_every_op_and_dtype_equals_jax_lax(matrix):
    world, local, rs = matrix
    for i, r in enumerate(rs):
        res = r["result"]
        assert res["devices"] == world * local
        assert res["bad"] == [], f"process {i}: {res['bad'][:5]}"
    # every case produced results for every device
    merged = _merge_digests(rs)
    for case, groups in merged.items():
        assert sum(len(g) for g in groups.values()) == world * local, case


def test_replicated_results_are_identical_on_every_device(matrix):
    world, local, rs = matrix
    for case, groups in _merge_digests(rs).items():
        for g, digs in groups.items():
            assert len(set(digs.values())) == 1, f"{case} group {g}: {digs}"


@pytest.mark.parametrize("which", ["random", "random_large"])
def test_random_floats_within_bound_and_identical_everywhere(matrix, which):
    world, local, rs = matrix
    for dt in ("float32", "float64", "float16", "bfloat16"):
        digs = {}
        for r in rs:
            rnd = r["result"][which][dt]
            assert rnd["r2ccl_err_over_bound"] <= 1.0, (dt, rnd)
            assert rnd["lax_err_over_bound"] <= 1.0, (dt, rnd)
            digs.update(rnd["digests"])
            if world * local == 2:   # a + b: one order only
                assert rnd["bit_equal_to_lax"], dt
        assert len(digs) == world * local and len(set(digs.values())) == 1, (dt, digs)


@pytest.fixture(scope="module")
def misc():
    rs = run_jax_ranks("misc", 2, local=2, timeout=180)
    return [r["result"] for r in rs]


def test_psum_in_scan_and_fori_loop_with_grad(misc):
    for res in misc:
        assert res["scan_fori_grad"]["equal"], res["scan_fori_grad"]


def test_two_unused_psums_both_run(misc):
    for res in misc:
        u = res["unused"]
        assert u["custom_calls_in_executable"] == 2, u
        one, two = u["tx_bytes"]["one_used"], u["tx_bytes"]["two_unused"]
        assert one > 0 and 1.8 * one <= two <= 2.5 * one, u
        assert u["top_level_effects"] == [], u   # else jit's C++ fast path is off


def test_forty_independent_psums_in_one_program(misc):
    for res in misc:
        assert res["forty"]["custom_calls"] == 40
        assert res["forty"]["equal"], res["forty"]


def test_grad_through_psum_equals_jax_lax(misc):
    for res in misc:
        g = res["grad"]
        assert g["True"]["equal"] and g["False"]["equal"] and g["outer"]["equal"], g


def test_vmap_equals_jax_lax(misc):
    for res in misc:
        assert all(res["vmap"].values()), res["vmap"]


def test_pytree_of_mixed_dtypes(misc):
    for res in misc:
        assert res["pytree"]


def test_varying_axes_typing_equals_jax_lax(misc):
    for res in misc:
        bad = {k: v for k, v in res["typing"].items() if v["jax_r2ccl"] != v["jax.lax"]}
        assert not bad, bad
        assert len(res["typing"]) == 32
        assert res["invariant_input"]


def test_a_nested_jit_called_twice_gets_two_op_ids(misc):
    for res in misc:
        n = res["nested_jit"]
        assert n["equal"] and len(n["op_ids"]) == 2 and len(set(n["op_ids"])) == 2, n


def test_unsupported_dtype_fails_at_trace_time(misc):
    for res in misc:
        errs = res["trace_errors"]
        for name in ("psum_int16", "all_gather_int16", "psum_complex"):
            assert errs[name]["raised"] and errs[name]["r2ccl"], errs[name]
            assert "not supported" in errs[name]["message"]


def test_axis_index_groups_is_a_clear_error(misc):
    for res in misc:
        e = res["trace_errors"]["groups"]
        assert e["raised"] and e["type"] == "NotImplementedError" and "axis_index_groups" in e["message"], e


def test_lowering_swap_reroutes_jax_lax_collectives(misc):
    for res in misc:
        s = res["swap"]
        assert s["equal"], s
        assert s["r2ccl_calls_inside"] == 7 and s["xla_collectives_inside"] == 0, s
        assert s["r2ccl_calls_after"] == 0 and s["xla_collectives_after"] == 7, s
        assert s["nested_install_r2ccl_calls"] == 1, s


def test_the_swap_never_breaks_a_program_that_runs_without_it():
    # What the swap cannot serve (groups that are not equal blocks, a complex dtype, an abstract
    # mesh) keeps jax's lowering, named; the collectives beside them still run on jax_r2ccl, and
    # every result equals jax's own bit for bit. (Before, axis_index_groups and a partly-manual
    # shard_map raised at lowering with the swap on: now both run on the rails, the next test.)
    for r in [r["result"] for r in run_jax_ranks("swap_transparent", 2, local=2, timeout=180)]:
        for name in ("uneven_groups", "complex_psum", "abstract_mesh"):
            out = r[name]
            assert "raised" not in out, (name, out)
            assert out["equal"] and out["r2ccl_calls"] == out["expect_r2ccl"], (name, out)
        assert r["fallbacks"] == ["jax.lax.psum: an abstract mesh", "jax.lax.psum: axis_index_groups of unequal sizes",
                                  "jax.lax.psum: dtype complex64"], r["fallbacks"]


def _all_on_the_rails_and_equal(r):
    """One process's jax_workers.against_jax report: every program ran with the swap, equal to
    jax's own bit for bit, with r2ccl custom calls and no XLA collective; nothing fell back."""
    for name, out in r.items():
        if name == "fallbacks":
            continue
        assert "raised" not in out, (name, out)
        assert out["equal"], (name, out)
        assert out["r2ccl_calls"] >= 1 and out["xla_collectives"] == 0, (name, out)
    assert r["fallbacks"] == [], r["fallbacks"]


@pytest.mark.parametrize("world,local", [(2, 2), (1, 8)], ids=["2proc-x2dev", "1proc-x8dev"])
def test_axis_index_groups_and_partly_manual_shard_maps_ride_the_rails_and_equal_jax_lax(world, local):
    for r in [r["result"] for r in run_jax_ranks("groups_and_partly_manual_cases", world, local=local, timeout=300)]:
        _all_on_the_rails_and_equal(r)


@pytest.mark.parametrize("world,local", [(2, 2), (2, 1), (1, 8)], ids=["2proc-x2dev", "2proc-x1dev", "1proc-x8dev"])
def test_ppermute_under_the_swap_rides_the_rails_and_equals_jax_lax(world, local):
    # Two processes: every program moves blocks between processes over the rails (and, with
    # two devices each, between a process's own devices by copy); one with 8 devices: copies.
    for r in [r["result"] for r in run_jax_ranks("ppermute_cases", world, local=local, timeout=240)]:
        _all_on_the_rails_and_equal(r)


@pytest.mark.parametrize("world,local", [(2, 2), (1, 8)], ids=["2proc-x2dev", "1proc-x8dev"])
def test_ragged_all_to_all_under_the_swap_rides_the_rails_and_keeps_jax_semantics(world, local):
    # XLA:CPU cannot run jax.lax.ragged_all_to_all at all; with the swap it runs on the rails,
    # equal to its documented semantics (computed in numpy) bit for bit, grad included.
    for r in [r["result"] for r in run_jax_ranks("ragged_cases", world, local=local, timeout=240)]:
        _all_on_the_rails_and_equal(r)


def test_lowering_swap_routes_the_gradient_all_reduce_of_invariant_params(misc):
    for res in misc:
        s = res["swap_vma_grad"]
        assert s["equal"] and s["r2ccl_calls"] > 0 and s["xla_collectives"] == 0, s


def test_mismatched_shapes_across_processes_fail_everywhere_without_hang():
    import cluster
    timeout = 5.0
    rs = run_jax_ranks("mismatch", 2, local=1, config={"timeout_s": timeout}, timeout=120)
    if cluster.active():
        timeout = cluster.runtime_timeout()   # one runtime serves every test of a multi-host run
    for i, r in enumerate(rs):
        res = r["result"]
        assert res["error"] and "r2ccl" in res["error"], (i, res)
        assert res["seconds"] < timeout + 10, (i, res)
        # the process lives on: the next (well-formed) collective works
        assert res["after"]["ok"] and res["after"]["value"] == res["after"]["expected"], (i, res)


def test_xla_collective_after_an_r2ccl_one_in_the_same_program_does_not_deadlock():
    rs = run_jax_ranks("mixed_program", 2, local=2, timeout=150)
    for r in rs:
        assert r["result"]["equal"], r


@pytest.mark.parametrize("world,local,config", [(3, 2, {"algo": "ring"}),
                                                pytest.param(4, 1, {"max_peers": 1}, marks=pytest.mark.proof)],
                         ids=["3x2,algo=ring", "4x1,auto,max_peers=1"])
def test_every_jax_op_and_dtype_under_the_ring_equals_jax_lax(world, local, config):
    """jax_r2ccl.psum and friends inside shard_map under jit (tests/jax_workers.py:matrix) with
    the ring (and, past R2CCL_MAX_PEERS = 1, doubling for the small all-reduces): every op and
    dtype against jax.lax, bit for bit where the order is exact."""
    rs = run_jax_ranks("matrix", world, local=local, config=config, timeout=240)
    for i, r in enumerate(rs):
        res = r["result"]
        assert res["devices"] == world * local
        assert res["bad"] == [], f"process {i}: {res['bad'][:5]}"
