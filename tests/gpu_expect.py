"""What the GPU workers' results must show (tests/jax_workers.py, gpu_* and mismatch): one
set of checks for tests/test_gpu.py on a GPU and tests/test_gpu_workers.py on CPU."""


def matrix(rs, min_ran: int = 50) -> None:
    for r in rs:
        assert r["result"]["bad"] == [] and r["result"]["ran"] > min_ran, r["result"]


def rail_fault(rs) -> None:
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]
    res = rs[0]["result"]
    assert res["rail_failures"] >= 1, res
    # it landed inside the collective: the rail held bytes of it, which other rails re-sent
    assert res["fault"]["unacked_bytes"] > 0 and res["fault"]["resent_chunks"] >= 1, res


def train_step(rs) -> None:
    for r in rs:
        res = r["result"]
        assert res["custom_call"] and not res["xla_all_reduce"], res
        assert res["bad_sums"] == [] and not res["params_differ"], res
        assert res["losses"][-1] < res["losses"][0], res["losses"]
    assert len({r["result"]["param_digest"] for r in rs}) == 1


def mismatch(rs) -> None:
    for r in rs:
        res = r["result"]
        assert res["error"] and "[r2ccl " in res["error"], res
        assert res["after"]["ok"] and res["after"]["value"] == res["after"]["expected"], res


def subnormals(rs) -> None:
    # docs/design.md §9: a float32 subnormal reads as zero in jax_r2ccl's reductions on both
    # platforms (XLA CPU's DAZ/FTZ, reproduced in integer logic)
    for r in rs:
        assert r["result"]["r2ccl_psum"] == 0.0, r["result"]
