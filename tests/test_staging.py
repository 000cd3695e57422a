"""The chunk pipeline of the GPU platform (csrc/stage), run on CPU with memcpy standing in for
the copy engine, between real processes over the multi-rail transport: device -> staging ->
transport -> staging -> device, in chunks, through the same runtime rendezvous a GPU's launch
thread uses. Every result is checked bit for bit against the canonical-order reference."""

import pytest

from harness import run_ranks

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"]


def _cases(n):
    cases = []
    for i, dt in enumerate(DTYPES):
        op = ["sum", "prod", "min", "max"][i % 4]
        cases += [("all_reduce", dt, op, 3001, 0), ("reduce_scatter", dt, "sum", n * 1001, 0),
                  ("all_gather", dt, "sum", 1003, 0), ("all_to_all", dt, "sum", n * 777, 0),
                  ("broadcast", dt, "sum", 999, n - 1)]
    cases += [("all_reduce", "bool", "max", 5000, 0), ("all_reduce", "float32", "sum", 0, 0),
              ("all_reduce", "float32", "sum", 1, 0)]
    return cases


@pytest.mark.parametrize("world,local,fold", [(2, 1, True), (2, 2, True), (3, 2, True), (2, 3, True), (2, 2, False)])
def test_every_kind_and_dtype_through_staging_is_bit_exact(world, local, fold):
    # 4 KiB steps: every case is cut into several chunks, the last one short. With several
    # local ranks all-reduce and reduce-scatter fold on the "device" (the copy engine) first
    # (reduce-scatter's chunk: one strided run per rank block); fold=False
    # sends every local rank's chunk to the host instead. Both give the canonical bits.
    rs = run_ranks("staged_collective", world, timeout=240,
                   args={"cases": _cases(world * local), "local": local, "chunk_bytes": 4096, "pool_bytes": 1 << 20,
                         "device_fold": fold, "small": False})
    for r in rs:
        res = r["result"]
        assert res["errors"] == [] and res["bad"] == [], (res["errors"], res["bad"])
        assert max(res["chunks"]) >= 4, res["chunks"]
        assert not any(res["small"]), res["small"]
        want = [[k, fold and local > 1 and k in ("all_reduce", "reduce_scatter")] for k, _ in res["folded"]]
        assert res["folded"] == want, res["folded"]


def test_a_small_call_takes_the_small_path_and_matches_a_process_that_stages_it():
    # Every kind at a few bytes (the 8-byte psum of a training step's loss among them): on
    # process 0 each reads its input with the group and rank and runs on the pool's small
    # area (the CUDA handler: one stream wait instead of four, no staging slot); process 1
    # stages the same calls through the pipeline. They meet on the wire as one chunk each,
    # every result is bit-exact, and the small path never leased or allocated a slot.
    cases = [("all_reduce", "float32", "sum", 2, 0), ("all_reduce", "float64", "max", 1, 0),
             ("all_gather", "int32", "sum", 3, 0), ("reduce_scatter", "bfloat16", "sum", 8, 0),
             ("all_to_all", "uint8", "sum", 12, 0), ("broadcast", "int64", "sum", 5, 1),
             ("all_reduce", "float32", "sum", 16384, 0),     # 64 KiB: the largest small call
             ("all_reduce", "float32", "sum", 16385, 0)]     # one element more: staged on both
    for local in (1, 2):
        rs = run_ranks("staged_collective", 2, timeout=120,
                       args={"cases": cases, "local": local, "chunk_bytes": 1 << 20, "pool_bytes": 8 << 20,
                             "small": [True, False], "repeat": 2})
        r0, r1 = rs[0]["result"], rs[1]["result"]
        for res in (r0, r1):
            assert res["errors"] == [] and res["bad"] == [], (local, res["errors"], res["bad"])
        assert r0["small"] == [True] * 7 + [False] + [True] * 7 + [False], r0["small"]
        assert r1["small"] == [False] * 16, r1["small"]
        assert r0["chunks"] == [1] * 16, r0["chunks"]
        # process 0 leased a slot only for the staged call
        assert all(a == 1 for p in r0["allocations"] for a in p.values()), r0["allocations"]


def test_the_staging_pool_allocates_up_front_and_never_frees_inside_a_call():
    # The GPU's pool reserves its slots when the runtime prepares the device. Calls of every
    # size from 1 KiB to 8 MiB, twice: no allocation after the reserve (before: a larger call
    # dropped the smaller free buffers, i.e. cudaFreeHost inside a collective, which
    # synchronises the whole device, and allocated anew)
    sizes = [256, 4096, 65536, 300_000, 1 << 20, 2 << 20, 1000, 512 << 10]
    cases = [("all_reduce", "float32", "sum", n, 0) for n in sizes]
    rs = run_ranks("staged_collective", 2, timeout=180,
                   args={"cases": cases, "chunk_bytes": 1 << 20, "pool_bytes": 8 << 20, "reserve": 3,
                         "repeat": 2})
    for r in rs:
        res = r["result"]
        assert res["errors"] == [] and res["bad"] == [], (res["errors"], res["bad"])
        pool = next(iter(res["pools"].values()))
        assert pool["slot_bytes"] == 2 << 20, pool     # the largest step: 1 MiB in, 1 MiB out
        assert pool["allocations"] == 3 and pool["allocated_bytes"] == 3 * pool["slot_bytes"], pool
        assert all(a == 3 for p in res["allocations"] for a in p.values()), res["allocations"]
        assert pool["in_use_bytes"] == 0, pool
        # Every slot and the small area registered with the endpoint, once (a socket transport
        # needs no keys: tests/test_verbs.py counts the copies this saves on RDMA rails).
        assert pool["registered_bytes"] > pool["allocated_bytes"], pool


def test_large_staged_all_reduce_is_cut_into_chunks_and_reuses_its_pool():
    cases = [("all_reduce", "float32", "sum", 4_000_000, 0), ("all_gather", "bfloat16", "sum", 1_000_001, 0),
             ("reduce_scatter", "float32", "sum", 2 * 1_500_000, 0)]
    rs = run_ranks("staged_collective", 2, timeout=240,
                   args={"cases": cases, "chunk_bytes": 1 << 20, "pool_bytes": 8 << 20, "repeat": 3})
    for r in rs:
        res = r["result"]
        assert res["errors"] == [] and res["bad"] == [], (res["errors"], res["bad"])
        assert res["chunks"][0] == 16, res["chunks"]          # 16 MB in 1 MiB steps
        first, *later = res["allocations"]
        assert all(a == first for a in later), res["allocations"]   # nothing allocated after the first round
        pool = res["pools"]["0"] if "0" in res["pools"] else next(iter(res["pools"].values()))
        assert pool["allocated_bytes"] <= pool["capacity_bytes"] and pool["in_use_bytes"] == 0, pool
        assert pool["reuses"] > 0, pool


def test_a_rail_fault_in_the_middle_of_a_staged_all_reduce_is_bit_exact():
    # 4 rails at 40 MB/s: 64 MiB moves for ~0.4 s; rail 2 is cut at 0.1 s
    cases = [("all_reduce", "float32", "sum", 16 << 20, 0)] * 2
    rs = run_ranks("staged_collective", 2, timeout=180, args={
        "cases": cases, "chunk_bytes": 4 << 20, "pool_bytes": 32 << 20, "rate": 40e6,
        "fault": {"case": 0, "after_s": 0.1, "rail": 2, "fault": "close"}})
    for r in rs:
        res = r["result"]
        assert res["errors"] == [] and res["bad"] == [], (res["errors"], res["bad"])
    assert rs[0]["result"]["stats"]["1"][2]["failures"] >= 1


def test_a_staging_bound_too_small_for_one_step_is_a_clear_error_on_every_process():
    cases = [("all_reduce", "float32", "sum", 100_000, 0)]
    rs = run_ranks("staged_collective", 2, timeout=120,
                   args={"cases": cases, "chunk_bytes": 1 << 20, "pool_bytes": 1 << 20})
    for r in rs:
        errs = r["result"]["errors"]
        assert len(errs) == 1, errs
        e = next(iter(errs[0]["errors"].values()))
        assert e["cause"] == "invalid_argument" and "R2CCL_STAGING_BYTES" in e["error"], e


@pytest.mark.parametrize("who", [0, 1])
def test_a_failed_device_fold_fails_every_local_rank_without_a_hang(who):
    # 2 local ranks fold on the "device": the leader's (who=0) or the member's (who=1) copy
    # engine fails its third batch; every local rank's call fails, none hangs, the next works
    # (The peer leaves case 0 when it sees this process in case 1, after R2CCL_MISMATCH_MS
    # and a quarter, 2.5 s; case 1 here waits that long for it, within R2CCL_TIMEOUT.)
    cases = [("all_reduce", "float32", "sum", 50_000, 0), ("all_reduce", "int32", "sum", 40_000, 0)]
    rs = run_ranks("staged_collective", 2, timeout=120, config={"timeout_s": 6.0},
                   args={"cases": cases, "local": 2, "chunk_bytes": 16 << 10, "pool_bytes": 1 << 20,
                         "fail_copy": {"case": 0, "rank": who, "batch": 2}})
    for r in rs:
        res = r["result"]
        assert res["bad"] == [], res["bad"]
        assert [e["case"] for e in res["errors"]] == [0], res["errors"]
    assert set(rs[0]["result"]["errors"][0]["errors"]) == {"0", "1"}   # both local ranks of process 0


def test_chunks_a_failed_local_rank_abandoned_are_not_taken_for_another_program():
    # Process 0's local rank fails case 0 after two of its chunks: process 0 moves on to
    # case 1 while process 1 still announces case 0's later chunks. Before: process 0 took
    # those announcements for another program and failed case 1 with a mismatch (seen in CI
    # under ASan, where it won the race; here process 0 looks sooner, so it always would).
    # Now the chunks process 0 abandoned count as run there: only case 0 fails, on both.
    cases = [("all_reduce", "float32", "sum", 50_000, 0), ("all_reduce", "int32", "sum", 40_000, 0)]
    rs = run_ranks("staged_collective", 2, timeout=120, config={"timeout_s": 10.0},
                   rank_config=[{"mismatch_ms": 300}, {"mismatch_ms": 2000}],
                   args={"cases": cases, "local": 2, "chunk_bytes": 16 << 10, "pool_bytes": 1 << 20,
                         "fail_copy": {"case": 0, "rank": 1, "batch": 2}})
    for r in rs:
        res = r["result"]
        assert res["bad"] == [], res["bad"]
        assert [e["case"] for e in res["errors"]] == [0], res["errors"]
    assert all(e["cause"] == "device" for e in rs[0]["result"]["errors"][0]["errors"].values())


def test_a_failed_copy_fails_the_call_without_a_hang_and_the_next_call_works():
    # rank 0's third copy batch fails: its call reports the device error; the peer's chunk that
    # never meets its partner ends at R2CCL_TIMEOUT (bounded), and the next collective is exact
    cases = [("all_reduce", "float32", "sum", 50_000, 0), ("all_reduce", "int32", "sum", 40_000, 0)]
    rs = run_ranks("staged_collective", 2, timeout=120, config={"timeout_s": 3.0},
                   args={"cases": cases, "chunk_bytes": 16 << 10, "pool_bytes": 1 << 20,
                         "fail_copy": {"case": 0, "rank": 0, "batch": 2}})
    e0 = rs[0]["result"]["errors"]
    assert len(e0) == 1 and e0[0]["case"] == 0, e0
    assert e0[0]["errors"]["0"]["cause"] == "device", e0
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]["bad"]
        assert all(e["case"] == 0 for e in r["result"]["errors"]), r["result"]["errors"]
    assert len(rs[1]["result"]["errors"]) == 1   # the peer's call fails too (a timeout), not hangs
