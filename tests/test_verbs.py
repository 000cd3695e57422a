"""The verbs transport on the project's verbs test bed (jax_r2ccl/tools/testbed_vm.py): two
emulated guests, two Soft-RoCE NICs each, one rank per guest, every rail an RC queue pair
(R2CCL_TRANSPORT=ibverbs, so a silent fallback to sockets fails the test). Real faults: a
NIC's carrier cut from outside (the guest's monitor) mid-transfer, a black hole inside the
guest (netem drops everything), a flapping NIC, both NICs cut, a killed peer. Every transfer
is checked byte for byte. Needs root and the test bed's Debian packages; skipped with the
reason otherwise. Guests run under TCG emulation: each rank takes ~3 s to start."""

import os

import numpy as np
import pytest

from harness import run_ranks_vm
from test_nccl_plugin import plugin  # noqa: F401  (the fixture: builds the plugin and its harness)
from jax_r2ccl.tools import testbed_vm as vm

NICS = [["198.18.0.1", "198.18.1.1"], ["198.18.0.2", "198.18.1.2"]]
# R2CCL_TIMEOUT 30 s: the guests are emulated (a 24 MiB transfer takes 2-3 s when healthy,
# 4-6 s on a loaded host). Cutting one NIC once left the other rail silent for ~3 s as well:
# destroying the dead QP blocks ~3.06 s in the guest's Soft-RoCE in about 1 cut of 3, and
# it ran on the progress thread. It now runs on the device's own thread; the tests below
# check that the surviving rail never fails.
# The guests are emulated (TCG, one vCPU): a guest can be descheduled for a few hundred ms on
# a loaded host, which the harness's 100 ms heartbeat / 200 ms stall timer (tests/harness.FAST)
# read as a dead rail (seen in CI: healthy rails failed "silent for 306 ms" over and over).
# The guests' timers are those of a slow network instead; the tests' bounds follow them.
# Likewise the wait of a registered send for its receive's advert (R2CCL_ADVERT_WAIT_MS, 2 ms):
# two guests' processes drift apart by more than 50 ms here (a 1 MiB memcpy alone takes
# milliseconds under TCG), so with 2 ms or 50 ms an eighth to a half of the staged path's
# chunks went in frames; with 1 s, none (BENCHMARKS.md, "staged path over verbs").
GUEST_TIMERS = {"heartbeat_ms": 500, "stall_ms": 1000, "advert_wait_ms": 1000}
# How late a 1-vCPU TCG guest on a loaded host may run a timer (CI: ~300 ms stalls seen).
GUEST_SCHED_SLACK_MS = 400
VERBS = {"transport": "ibverbs", "timeout_s": 30.0, **GUEST_TIMERS}


def _why_not():
    if os.environ.get("R2CCL_COORDINATOR"):
        return "multi-host mode: no local test bed"
    from jax_r2ccl import _core
    why = _core.verbs_status([])["unavailable"]
    if "no verbs backend" in why:   # built without rdma-core's headers
        return why
    return vm.why_unavailable()


pytestmark = [pytest.mark.testbed, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


@pytest.fixture(scope="module")
def _bed_module():
    vm.up(2, 2)
    try:
        yield
    finally:
        vm.down()


@pytest.fixture
def bed(_bed_module):
    # A guest whose kernel died in an earlier test (Soft-RoCE in Debian's 6.1 kernel has
    # oopsed once here, under load) fails that test only: the bed is booted again for the
    # next, and the dead guest's console is kept in the state folder's .last sibling.
    if not all(vm.status().get("alive", [])):
        vm.up(2, 2)
    yield


# The fault cells run twice: chunks in frames through the bounce buffers, and registered memory
# (zero copy: one-sided writes, resends in frames after the late-write fence).
ZERO_COPY = pytest.mark.parametrize("register", [False, True], ids=["copy", "zero-copy"])


def results(rs):
    return [r["result"] for r in rs]


def test_exact_transfers_of_several_sizes_ride_verbs_on_both_rails(bed):
    sizes = [0, 1, 4096 + 3, 70_000, 1 << 20, 9 << 20]
    for r in results(run_ranks_vm("exchange", nics=NICS, config=VERBS, args={"sizes": sizes, "rounds": 2})):
        assert r["wrong"] == 0, r
        rails = r["stats"]["1" if "1" in r["stats"] else "0"]
        assert [s["transport"] for s in rails] == ["ibverbs", "ibverbs"], rails
        assert all(s["state"] == "up" and s["tx_bytes"] > 1 << 20 for s in rails), rails
        # The bounce path copies each payload byte once on each side (FrameLink::copied): the
        # data's bytes plus the control frames' few (acks, heartbeats, the handshake).
        for s in rails:
            assert s["tx_bytes"] <= s["tx_copied_bytes"] <= s["tx_bytes"] * 1.01 + (64 << 10), s
            assert s["rx_bytes"] <= s["rx_copied_bytes"] <= s["rx_bytes"] * 1.01 + (64 << 10), s


def test_registered_memory_moves_by_one_sided_writes_with_no_copies_bit_exact(bed):
    # Registered buffers, receives posted (advertised) before the sends: every data chunk is an
    # RDMA WRITE from the sender's memory into the receiver's (FrameLink::copied counts none of
    # its bytes); what is still copied is the control frames' few bytes (acks, heartbeats,
    # adverts). The same exchange unregistered copies every byte once on each side (above).
    sizes = [4096 + 3, 70_000, 1 << 20, 9 << 20]
    for r in results(run_ranks_vm("exchange", nics=NICS, config=VERBS,
                                  args={"sizes": sizes, "rounds": 2, "register": True})):
        assert r["wrong"] == 0, r
        rails = r["stats"]["1" if "1" in r["stats"] else "0"]
        assert [s["transport"] for s in rails] == ["ibverbs", "ibverbs"], rails
        sent = sum(s["tx_bytes"] for s in rails)
        assert sent >= 2 * sum(sizes), rails
        for s in rails:
            assert s["tx_copied_bytes"] <= 64 << 10 and s["rx_copied_bytes"] <= 64 << 10, s


def _cut(guest, nic):
    return lambda: vm.fail(guest, nic)


def _heal(guest, nic):
    return lambda: vm.heal(guest, nic)


@ZERO_COPY
def test_nic_cut_from_outside_mid_transfer_fails_over_at_the_port_event_bit_exact(bed, register):
    n = 24 << 20
    import re
    rs = run_ranks_vm("transfer_with_fault", nics=NICS, config=VERBS,
                      args=dict(nbytes=n, fault_cmd="touch {SHARED}/cut", heal_cmd="touch {SHARED}/heal",
                                fault_after_s=0.3, heal_after_s=6.0, register=register),
                      on_file={"cut": _cut(0, 1), "heal": _heal(0, 1)})
    r0, r1 = results(rs)
    assert r1["wrong"] == 0
    if register:   # the data went by one-sided writes; only the failed rail's chunks went again in frames
        assert sum(s["tx_copied_bytes"] for s in r0["stats"]) < n / 2, r0["stats"]
    rail = r0["stats"][1]
    # Down until the heal 6 s after the cut; a transfer that outlasts that (a loaded host's
    # guests) sees the rail come back before its stats are read.
    assert rail["failures"] >= 1 and (rail["state"] == "down" or rail["recoveries"] >= 1), r0["stats"]
    # The rail failed on the port event itself (not on silence): the event's guest time is in
    # the reason, the rail's failure time in its stats, both on the guest's clock. (Its last
    # change is the failback when the transfer outlasted the heal: 6.5 s was read so in CI.)
    m = re.search(r"IBV_EVENT_PORT_ERR at unix time ([0-9.]+)", rail["last_error"])
    assert m, rail
    react = rail["last_failure_unix_s"] - float(m.group(1))
    # The target is 50 ms; measured here 9.3, 31.9 and 53.9 ms: the event is read and the rail
    # failed on one emulated vCPU that the guest kernel's Soft-RoCE work shares. The bound
    # leaves that scheduling noise room; the printed number is the measurement.
    assert 0 <= react <= 0.100, (react, rail)
    assert r0["stats"][0]["tx_bytes"] > n / 2, r0["stats"]   # the survivor took over
    assert r0["stats"][0]["failures"] == 0, r0["stats"]       # ...and never stalled meanwhile
    print(f"failover: port event -> rail failed in {react * 1e3:.1f} ms; transfer {r1['times'][0]:.2f} s")


@ZERO_COPY
def test_black_hole_inside_the_guest_is_caught_by_the_stall_timer_bit_exact(bed, register):
    n = 24 << 20
    rs = run_ranks_vm("transfer_with_fault", nics=NICS, config=VERBS,
                      args=dict(nbytes=n, fault_cmd="tc qdisc add dev eth1 root netem loss 100%",
                                heal_cmd="tc qdisc del dev eth1 root", fault_after_s=0.3, heal_after_s=4.0,
                                register=register))
    import re
    r0, r1 = results(rs)
    assert r1["wrong"] == 0
    if register:   # the data went by one-sided writes; only the failed rail's chunks went again in frames
        assert sum(s["tx_copied_bytes"] for s in r0["stats"]) < n / 2, r0["stats"]
    rail = r0["stats"][1]
    assert rail["failures"] >= 1 and rail["last_reason"] == "stalled", r0["stats"]
    # Caught by the stall timer (R2CCL_STALL_MS, plus the rail's measured drain allowance).
    # In namespaces that is bounded tightly (test_testbed.py's
    # test_black_hole_is_left_within_300_ms). These guests are 1-vCPU TCG: CI's loaded host
    # deschedules them for ~300 ms at a time (1090 ms seen against a 1026 ms deadline), so
    # the bound here is the deadline plus GUEST_SCHED_SLACK_MS; the printed line is the
    # measurement.
    m = re.search(r"unacknowledged for (\d+) ms \(its measured drain time: (\d+) ms\)", rail["last_error"])
    assert m, rail
    assert int(m.group(1)) <= VERBS["stall_ms"] + int(m.group(2)) + GUEST_SCHED_SLACK_MS, rail
    print("black hole:", rail["last_error"], "times", r1["times"])


@ZERO_COPY
def test_flapping_nic_loses_nothing(bed, register):
    import threading
    import time
    n = 8 << 20

    def flap():
        def run():
            for _ in range(4):
                vm.fail(0, 1)
                time.sleep(0.3)
                vm.heal(0, 1)
                time.sleep(0.5)
        threading.Thread(target=run, daemon=True).start()
    rs = run_ranks_vm("transfer_with_fault", nics=NICS, config=VERBS, timeout=180,
                      args=dict(nbytes=n, iters=6, fault_cmd="touch {SHARED}/flap", fault_after_s=0.05,
                                register=register),
                      on_file={"flap": flap})
    r1 = results(rs)[1]
    assert r1["wrong"] == 0, r1
    time.sleep(1.5)   # the flapper's last heal


def test_both_nics_cut_is_the_documented_error_naming_the_peer(bed):
    def cut_both():
        vm.fail(0, 0)
        vm.fail(0, 1)
    try:
        rs = run_ranks_vm("transfer_with_fault", nics=NICS, config={**VERBS, "timeout_s": 3.0}, expect_fail=True,
                          args=dict(nbytes=24 << 20, fault_cmd="touch {SHARED}/cut", fault_after_s=0.3,
                                    op_timeout=30.0),
                          on_file={"cut": cut_both})
    finally:
        vm.heal(0, 0)
        vm.heal(0, 1)
    for rank, r in enumerate(rs):
        assert not r["ok"] and r["cause"] == "all_rails_down" and r["peer"] == 1 - rank, r
        assert f"rank {1 - rank}" in r["error"], r["error"]
    print("both cut:", rs[0]["error"][:300])


def test_killed_peer_is_peer_gone_without_hang(bed):
    rs = run_ranks_vm("killed_peer", nics=NICS, config=VERBS, may_die={1}, args={"nbytes": 32 << 20})
    assert rs[1].get("died")
    r = rs[0]["result"]
    assert r["error"] and r["cause"] == "peer_gone" and r["peer"] == 1, r
    assert r["after_s"] < 10.0, r


def test_host_collectives_over_verbs_are_bit_exact(bed):
    cases = [("all_reduce", "float32", "sum", 100_003, 0), ("all_reduce", "int32", "max", 4096, 0),
             ("all_gather", "float32", "sum", 70_000, 0), ("reduce_scatter", "float32", "sum", 1 << 18, 0),
             ("all_to_all", "bfloat16", "sum", 2 * 50_000, 0), ("broadcast", "uint8", "sum", 3 << 20, 1)]
    for r in results(run_ranks_vm("host_collective", nics=NICS, config=VERBS, args={"cases": cases})):
        assert r["bad"] == [], r
        assert {s["transport"] for s in next(iter(r["stats"].values()))} == {"ibverbs"}


def _staged_copies(r):
    """(payload bytes this rank sent, bytes its transport copied to send them, bytes it received,
    bytes it copied out) over its rails, after the first round (the rails' set-up and the
    processes' start skew: a receive posted more than 2 ms after its send is not advertised
    in time, and that send goes in frames)."""
    def sums(stats):
        rails = [s for peer in stats.values() for s in peer]
        return [sum(s[k] for s in rails) for k in ("tx_bytes", "tx_copied_bytes", "rx_bytes", "rx_copied_bytes")]
    end, first = sums(r["stats"]), sums(r["stats_after_first"])
    return tuple(e - f for e, f in zip(end, first))


STAGED_CASES = [["all_gather", "float32", "sum", 1 << 20, 0], ["broadcast", "float32", "sum", 1 << 20, 1],
                ["all_to_all", "float32", "sum", 1 << 20, 0], ["all_reduce", "float32", "sum", 1 << 20, 0],
                ["reduce_scatter", "float32", "sum", 1 << 20, 0]]


# The unregistered staged path (every byte copied once on each side) is not run here: the copy
# path's counter is checked by test_exact_transfers_of_several_sizes_ride_verbs_on_both_rails,
# and its 48 s in CI bought no other check (bench/testbed_verbs_p2p.sh measures the copy path
# beside the zero-copy one).
@pytest.mark.parametrize("fault", [None, "close"], ids=["registered", "registered-rail-fails"])
def test_the_staged_path_over_verbs_moves_its_registered_pool_with_no_copies_bit_exact(bed, fault):
    # The CUDA platform's chunk pipeline (csrc/stage, memcpy standing in for the GPU's copies):
    # each 4 MiB collective is cut into 1 MiB chunks through the staging pool, three rounds.
    # The pool's slots are registered with the endpoint (as on a GPU, where they are pinned),
    # and so is the collectives' scratch (coll/scratch.h: a peer's partial before it is
    # folded), so every chunk is a one-sided write; what is still copied is the control
    # frames' few bytes.
    # registered-rail-fails: rank 0 closes its rail 1 (and keeps it down) 0.3 s into the
    # all_reduce's first round; its chunks in flight go again over rail 0 in frames (a written
    # chunk is never written again: docs/design.md §10), every result is still bit-exact, and
    # rounds 2-3 write everything over rail 0 alone.
    rs = run_ranks_vm("staged_collective", nics=NICS, config=VERBS, timeout=240,
                      args=dict(cases=STAGED_CASES, chunk_bytes=1 << 20, pool_bytes=16 << 20, reserve=3,
                                register=True, repeat=3,
                                fault=fault and {"case": 3, "after_s": 0.3, "rail": 1, "fault": fault}))
    for g, r in enumerate(results(rs)):
        sent, tx_copied, got, rx_copied = _staged_copies(r)
        print(f"rank {g}, rounds 2-3: sent {sent} B, copied "
              f"{tx_copied / sent:.3f}/B; received {got} B, copied {rx_copied / got:.3f}/B; "
              f"pool {next(iter(r['pools'].values()))}")
    for g, r in enumerate(results(rs)):
        assert r["bad"] == [] and r["errors"] == [], r
        assert all(s["transport"] == "ibverbs" for peer in r["stats"].values() for s in peer), r["stats"]
        sent, tx_copied, got, rx_copied = _staged_copies(r)
        pool = next(iter(r["pools"].values()))
        assert sent >= 2 * 5 * (2 << 20), r["stats"]   # each case moves at least half its 4 MiB each way
        assert pool["registered_bytes"] > pool["allocated_bytes"] > 0, pool   # every slot, and the small area
        if fault and g == 0:
            assert r["stats"]["1"][1]["failures"] >= 1 and r["stats"]["1"][1]["state"] != "up", r["stats"]
        assert tx_copied <= 0.05 * sent, r["stats"]
        assert rx_copied <= 0.05 * got, r["stats"]


def test_dma_buf_registration_is_probed_per_device_and_refused_with_the_drivers_answer(bed):
    # GPUDirect without nvidia_peermem registers device memory through a dma-buf
    # (ibv_reg_dmabuf_mr). Each device is probed when it opens, as NCCL's net_ib does (a call
    # with fd -1: EOPNOTSUPP or EPROTONOSUPPORT where the driver has no dma-buf support, EBADF
    # where it has). Debian 6.1's Soft-RoCE (rdma_rxe) has none: the endpoint says so per
    # device, a registration is refused with that answer, doctor's line carries it, and a
    # plain registered exchange works after. A kernel whose rxe gains support turns the probe
    # around: the memfd (no dma-buf) must then fail in ibv_reg_dmabuf_mr, naming the device.
    for r in results(run_ranks_vm("dmabuf_register", nics=NICS, config=VERBS)):
        assert r["after"] == 0, r
        assert r["bad_fd"][0] == "invalid_argument" and "fd -1" in r["bad_fd"][1], r
        assert r["registered"] is False, r
        if r["support"]:
            assert r["support"].startswith("ibverbs: ") and "registers no dma-buf (ibv_reg_dmabuf_mr: " in r["support"], r
            assert r["cause"] == "invalid_argument" and r["support"][len("ibverbs: "):] in r["error"], r
            assert "registers no dma-buf" in r["gpudirect"] and "registers dma-bufs" not in r["gpudirect"], r
        else:
            assert r["cause"] == "system" and "ibv_reg_dmabuf_mr of 1048576 bytes on " in r["error"], r
            assert "registers dma-bufs" in r["gpudirect"], r
        # what this bed's kernel does (the fact design.md §10 states)
        assert "Operation not supported" in r["support"] or "Protocol not supported" in r["support"], r


def test_auto_picks_verbs_on_rdma_nics(bed):
    rs = run_ranks_vm("exchange", nics=NICS, config={"transport": "auto", **GUEST_TIMERS}, args={"sizes": [1 << 20]})
    for r in results(rs):
        assert r["wrong"] == 0
        rails = next(iter(r["stats"].values()))
        assert {s["transport"] for s in rails} == {"ibverbs"}, rails


def test_sockets_still_run_on_the_same_nics(bed):
    rs = run_ranks_vm("exchange", nics=NICS, config={"transport": "socket", **GUEST_TIMERS}, args={"sizes": [1 << 20]})
    for r in results(rs):
        assert r["wrong"] == 0
        assert {s["transport"] for s in next(iter(r["stats"].values()))} == {"socket"}



def test_jax_psum_in_shard_map_over_verbs(bed):
    # One device per guest, jax.distributed's coordinator in guest 0, jax_r2ccl's rails on the
    # Soft-RoCE NICs with R2CCL_TRANSPORT=ibverbs: jax_r2ccl.psum inside shard_map under jit,
    # checked against XLA's own psum (gloo over TCP) in the same program, bit for bit.
    import json
    import sys
    import time
    import uuid
    from harness import ROOT, _package_parent
    tag = f"jax-{uuid.uuid4().hex[:10]}"
    host_dir, guest_dir = os.path.join(vm.common_dir(), tag), f"{vm.GUEST_COMMON}/{tag}"
    os.makedirs(host_dir)
    ids = []
    t0 = time.monotonic()
    for rank in range(2):
        spec = {"func": "mixed_program", "rank": rank, "world": 2, "local": 1, "port": 0,
                "coordinator": "198.18.0.1:45321", "nics": NICS[rank],
                "config": {"transport": "ibverbs", "timeout_s": 60.0, "bootstrap_timeout_s": 120.0},
                "args": {"n": 1 << 18, "rounds": 3}, "out": f"{guest_dir}/out{rank}.json"}
        with open(os.path.join(host_dir, f"spec{rank}.json"), "w") as f:
            json.dump(spec, f)
        ids.append(vm.submit(rank, f"cd {ROOT}/tests && PYTHONPATH={_package_parent()} {sys.executable} "
                                   f"{ROOT}/tests/jax_rank_main.py {guest_dir}/spec{rank}.json", 400))
    outs = [vm.wait(rank, ids[rank], 400) for rank in range(2)]
    for rank in range(2):
        path = os.path.join(host_dir, f"out{rank}.json")
        assert os.path.exists(path), outs[rank][1][-3000:]
        with open(path) as f:
            r = json.load(f)
        assert r["ok"], r["error"][-3000:]
        assert r["result"]["equal"], r
        print(f"rank {rank}: start {r['seconds']['start']} s, work {r['seconds']['work']} s")
    print(f"jax psum over verbs in the guests: {time.monotonic() - t0:.0f} s in all")


def test_failback_after_the_port_is_active_again_makes_new_queue_pairs(bed):
    rs = run_ranks_vm("carrier_failback", nics=NICS, config=VERBS,
                      args=dict(cut_cmd="touch {SHARED}/cut", heal_cmd="touch {SHARED}/heal"),
                      on_file={"cut": _cut(0, 1), "heal": _heal(0, 1)})
    r0, r1 = results(rs)
    assert r1["ok"]
    rail = r0["stats"][1]
    assert rail["state"] == "up" and rail["recoveries"] >= 1 and rail["transport"] == "ibverbs", rail
    assert r0["carried"] > 0, r0
    assert r0["down_after_s"] < 1.0 and r0["up_after_s"] < 10.0, r0
    print(f"failback: down {r0['down_after_s'] * 1e3:.0f} ms after the cut, up {r0['up_after_s']:.2f} s after "
          f"the heal, then carried {r0['carried']} bytes")


def _rxe_active(nic, wait_s=20.0):
    import time
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all("ACTIVE" in vm.run(g, f"cat /sys/class/infiniband/rxe_eth{nic}/ports/1/state 2>/dev/null", 30)[1]
               for g in range(2)):
            return True
        time.sleep(0.2)
    return False


def test_a_rail_is_a_rail_verbs_chunks_move_to_a_socket_rail(bed):
    # NIC 1's Soft-RoCE device removed in both guests: auto runs rail 0 on verbs and rail 1 on
    # sockets. NIC 0 is cut mid-transfer: the verbs rail's chunks finish on the socket rail.
    n = 24 << 20
    for g in range(2):
        assert vm.run(g, "rdma link delete rxe_eth1", 30)[0] == 0
    try:
        rs = run_ranks_vm("transfer_with_fault", nics=NICS, config={**VERBS, "transport": "auto"},
                          args=dict(nbytes=n, fault_cmd="touch {SHARED}/cut", heal_cmd="touch {SHARED}/heal",
                                    fault_after_s=0.3, heal_after_s=6.0),
                          on_file={"cut": _cut(0, 0), "heal": _heal(0, 0)})
    finally:
        vm.heal(0, 0)
        for g in range(2):
            vm.run(g, "rdma link add rxe_eth1 type rxe netdev eth1", 30)
        assert _rxe_active(1), "rxe_eth1 did not come back ACTIVE"
    r0, r1 = results(rs)
    assert r1["wrong"] == 0
    assert [s["transport"] for s in r0["stats"]] == ["ibverbs", "socket"], r0["stats"]
    assert r0["stats"][0]["failures"] >= 1 and "IBV_EVENT_PORT_ERR" in r0["stats"][0]["last_error"], r0["stats"]
    assert r0["stats"][1]["tx_bytes"] > n / 2, r0["stats"]
    # The socket rail carried on through the verbs rail's teardown (a QP destroy that blocks
    # ~3 s in Soft-RoCE after a port error, in about 1 cut of 3): it never failed, on either
    # side. (In CI, when the destroy ran on the progress thread, both sides failed it as
    # silent and the transfer outlasted its 10 s deadline.)
    assert r0["stats"][1]["failures"] == 0 and r1["stats"][1]["failures"] == 0, (r0["stats"], r1["stats"])


# The fault matrix's cells over verbs (tests/test_fault_matrix.py runs the full matrix on the
# namespace test bed): two guests, every kind at 4 KiB and 1 MiB (the guests are emulated: a
# 16 MiB collective takes seconds there), through the same workers.
MATRIX_CELLS = [(k, n) for n in (4 << 10, 1 << 20) for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")]


@pytest.mark.parametrize("fault", ["fail", "blackhole"])
def test_matrix_cells_over_verbs_survive_bit_exact(bed, fault):
    """Guest 1's second NIC cut from outside (port event), or a black hole inside guest 0,
    landing in the middle of each cell's loop; every output bit-exact."""
    if fault == "fail":
        cmd, heal = "touch {SHARED}/cut{cell}", "touch {SHARED}/heal{cell}"
        on_file = {**{f"cut{i}": _cut(1, 1) for i in range(len(MATRIX_CELLS))},
                   **{f"heal{i}": _heal(1, 1) for i in range(len(MATRIX_CELLS))}}
        hole_s = 1.7
    else:
        # An idle rail's black hole is seen by heartbeat silence: 3 x 500 ms here, plus a
        # guest's scheduling; the hole lasts longer than that.
        # The first netem qdisc in a guest took 2.2 s to set up (tc and sch_netem read over 9p):
        # the hole then began just before its heal and no rail failed (2 of 3 runs, CI's
        # included). A lossless netem qdisc set up and removed first makes the timed one quick.
        cmd, heal, on_file = "tc qdisc add dev eth1 root netem loss 100%", "tc qdisc del dev eth1 root", None
        hole_s = 2.5
    prime = "tc qdisc add dev eth1 root netem loss 0% && tc qdisc del dev eth1 root" if fault == "blackhole" else None
    rs = run_ranks_vm("matrix_workers:survivable", nics=NICS, config=VERBS, timeout=400, on_file=on_file,
                      args={"cells": MATRIX_CELLS, "fault_cmd": cmd, "heal_cmd": heal, "fault_after_s": 0.3,
                            "heal_after_s": 0.3 + hole_s, "settle_s": 1.0, "prime_cmd": prime})
    cells = [r["cells"] for r in results(rs)]
    for ci, (kind, n) in enumerate(MATRIX_CELLS):
        for r in range(2):
            x = cells[r][ci]
            assert x["wrong"] == 0 and x["worst_s"] < VERBS["timeout_s"], (fault, kind, n, r, x)
            assert x["failures"] >= 1, (fault, kind, n, r, x)       # the fault landed
        print(f"verbs {fault} {kind} {n >> 10} KiB: worst {cells[0][ci]['worst_s'] * 1e3:.0f} ms "
              f"(healthy {cells[0][ci]['healthy_s'] * 1e3:.1f} ms)")


def test_matrix_mismatch_over_verbs_is_an_error_on_both_then_the_next_works(bed):
    rs = run_ranks_vm("matrix_workers:mismatched", nics=NICS, config=VERBS, timeout=300,
                      args={"cells": MATRIX_CELLS, "victim": 1, "timeout_s": 10.0})
    for r, res in enumerate(results(rs)):
        for x in res["cells"]:
            assert x["error"] and x["cause"] == "mismatch" and x["after_s"] < 10.0, (r, x)
            assert x["then_wrong"] == 0, (r, x)


def test_matrix_killed_peer_over_verbs_is_an_error_within_the_timeout(bed):
    """The four kinds at 1 MiB in flight at once (a thread each) when the peer dies."""
    timeout = 10.0
    kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    rs = run_ranks_vm("matrix_workers:fatal", nics=NICS, config={**VERBS, "timeout_s": timeout}, timeout=200,
                      expect_fail=True, may_die={1},
                      args={"kinds": kinds, "nbytes": 1 << 20, "victim": 1, "fault": "kill",
                            "fault_after_s": 0.3, "limit_s": timeout + 20})
    assert rs[1].get("died"), rs[1]
    assert rs[0]["ok"], rs[0]
    for kind, x in rs[0]["result"]["cells"].items():
        assert x["wrong"] == 0 and x["error"] and x["cause"] in ("peer_gone", "all_rails_down", "timeout"), (kind, x)
        assert x["after_s"] <= timeout + 2.0, (kind, x)
        print(f"verbs kill {kind} 1 MiB: {x['cause']} after {x['after_s']:.2f} s")


def _plugin_job(plugin, args: str, seconds: float, timeout_s: float = VERBS["timeout_s"]):
    """The conformance harness in both guests over the plugin (R2CCL_TRANSPORT=ibverbs: no socket
    fallback; the health monitor on, so each rank prints its rails' bytes and copies at the end).
    Returns (host folder, submitted ids)."""
    import uuid
    so, harness = plugin
    tag = f"nccl-{uuid.uuid4().hex[:12]}"
    host_dir = os.path.join(vm.common_dir(), tag)
    os.makedirs(host_dir)
    env = {"R2CCL_TRANSPORT": "ibverbs", "R2CCL_TIMEOUT": str(timeout_s), "R2CCL_MONITOR_MS": "100",
           "R2CCL_HEARTBEAT_MS": str(GUEST_TIMERS["heartbeat_ms"]), "R2CCL_STALL_MS": str(GUEST_TIMERS["stall_ms"]),
           "R2CCL_ADVERT_WAIT_MS": str(GUEST_TIMERS["advert_wait_ms"])}
    ids = []
    for g in (0, 1):
        envs = " ".join(f"{k}={v}" for k, v in {**env, "R2CCL_NICS": ",".join(NICS[g])}.items())
        ids.append(vm.submit(g, f"{envs} {harness} --plugin {so} --dir {vm.GUEST_COMMON}/{tag} --rank {g} --world 2 "
                                f"--case loop {args} --seconds {seconds} --timeout 120", 240))
    return host_dir, ids


def _await(path, within_s=120.0) -> bool:
    import time
    deadline = time.monotonic() + within_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def _copies(out: str) -> tuple[int, int]:
    """(payload bytes sent, bytes the transport copied for them) over a rank's send connections,
    from its harness's health line."""
    import json
    import re
    m = re.search(r"^harness: health (.*)$", out, re.M)
    assert m, out[-4000:]
    rails = [r for r in json.loads(m.group(1))["rails"] if r["peer_name"].startswith("NCCL send")]
    assert rails and all(r["transport"] == "ibverbs" for r in rails), rails
    return sum(r["tx_bytes"] for r in rails), sum(r["tx_copied_bytes"] for r in rails)


@pytest.mark.parametrize("fault", ["none", "nic_cut", "black_hole"])
def test_the_nccl_plugin_over_verbs_rails_moves_registered_slots_with_no_copies_through_faults(bed, plugin, fault):
    """The NCCL net plugin (csrc/nccl/) in the guests, its connections' rails RC queue pairs:
    the conformance harness's loop (the ring all-reduce and all-gather plus an all-to-all
    through slots registered with regMr, as NCCL's are; every iteration checked bit for bit).
    The slots' chunks go as one-sided RDMA writes: the transport copies (almost) nothing. Then
    the same while guest 0's NIC 1 is cut from outside and healed, or black-holed inside the
    guest and restored: test() never returns an error, and only what the failed rail held goes
    again in frames."""
    import re
    import time
    host_dir, ids = _plugin_job(plugin, f"--collective both --loop-bytes {1 << 20}", 10)
    started = _await(os.path.join(host_dir, "loop-started"))
    if started and fault != "none":
        time.sleep(1.0)
        vm.fail(0, 1) if fault == "nic_cut" else vm.blackhole(0, 1)
        time.sleep(4.0)
        vm.heal(0, 1) if fault == "nic_cut" else vm.degrade(0, 1, "base")
    outs = [vm.wait(g, ids[g], 240) for g in (0, 1)]
    assert started, outs
    for g, (rc, out) in enumerate(outs):
        assert rc == 0 and f"harness: loop rank {g}: ok" in out, (g, rc, out[-4000:])
        print(re.search(r"harness: loop rank \d: ok .*", out).group(0))
        sent, copied = _copies(out)
        print(f"rank {g} ({fault}): {sent} payload bytes sent, {copied} copied ({copied / max(sent, 1):.4f}/byte)")
        # Copied: control frames' bytes, the chunks a sender dealt before the receiver's advert
        # reached it (the harness posts each step's receive and send at once), and under a fault
        # what the failed rail held, sent again in frames.
        # Measured (BENCHMARKS.md): 0.014-0.017 with no fault, 0.0001-0.036 under one.
        # The floor only says the loop moved enough for the ratio to mean something: a loaded
        # CI machine's guests moved exactly 8 MiB in the 10 s with a NIC cut for 4 of them.
        assert sent >= 4 << 20 and copied <= (0.1 if fault == "none" else 0.5) * sent, (sent, copied)
    if fault != "none":   # the fault landed: guest 0's rail 1 failed
        m = re.search(r"NET/r2ccl: rail 1 to NCCL .* failed: .*", outs[0][1])
        assert m, outs[0][1][-4000:]
        print(m.group(0))


def test_the_nccl_plugin_over_verbs_reports_a_killed_peer_on_the_survivor_in_time(bed, plugin):
    """The fatal cell over verbs: rank 1 SIGKILLed mid all-to-all (registered slots, one-sided
    writes); rank 0's test() returns an error within R2CCL_TIMEOUT + 2 s (plus a loaded guest's
    scheduling slack), and it closes its connections and exits. A receive connection's side
    cannot probe the dead peer's listener (it never learned it: the peer dialled), so its error
    may come only at R2CCL_TIMEOUT: the cell runs with a short one (CI measured 32.1 s with 30 s)."""
    import re
    import time
    timeout_s = 6.0
    host_dir, ids = _plugin_job(plugin, f"--collective alltoall --expect-error --loop-bytes {1 << 20}", 60, timeout_s)
    started = _await(os.path.join(host_dir, "loop-started")) and _await(os.path.join(host_dir, "pid.1"))
    killed_at = None
    if started:
        time.sleep(1.0)
        pid = int(open(os.path.join(host_dir, "pid.1")).read())
        killed_at = time.time()
        vm.run(1, f"kill -9 {pid}", 30)
    rc0, out0 = vm.wait(0, ids[0], 240)
    vm.wait(1, ids[1], 60)
    assert started, out0[-4000:]
    assert rc0 == 0 and "harness: loop rank 0: ok (the expected error" in out0, out0[-4000:]
    m = re.search(r"at wall ([0-9.]+)", out0)
    after = float(m.group(1)) - killed_at
    print(f"killed peer over verbs: the survivor's error {after:.2f} s after the kill")
    assert after <= timeout_s + 2.0 + GUEST_SCHED_SLACK_MS / 1000, after
