"""Real faults on the network test bed: 2 hosts × 4 NICs at 500 Mbit/s built from network
namespaces (the project's own test bed, jax_r2ccl/tools/testbed.py: `jax-r2ccl testbed`). A NIC goes down, black-holes, flaps or slows to a
tenth in the middle of a transfer; every transfer must arrive bit-exact and in bounded
time. Needs root; skipped with the reason otherwise."""

import os

import pytest

from harness import run_ranks
from jax_r2ccl.tools import testbed

RATE_BPS = 500e6 / 8 * 0.957     # payload of a 500 Mbit/s link (TCP/IP headers take ~4%)
NICS = ["nic0", "nic1", "nic2", "nic3"]


def _why_not():
    if os.environ.get("R2CCL_COORDINATOR"):
        return "multi-host mode: the hosts are given, no local test bed is built"
    return testbed.why_unavailable()


def tb(*args) -> str:
    """A test-bed command as a shell line, for the workers' fault steps."""
    return testbed.command_line(*map(str, args))


def hosts(n: int) -> list[list[str]]:
    """Per-rank command prefixes that run rank i as test-bed host i."""
    return [testbed.run_prefix(i) for i in range(n)]


pytestmark = [pytest.mark.testbed, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


@pytest.fixture(scope="module")
def bed():
    testbed.up(2, 4, "500mbit")
    try:
        yield
    finally:
        testbed.down()


def run_pair(bed, **args):
    return run_ranks("transfer_with_fault", 2, nics=NICS, args=args, timeout=120,
                     netns=hosts(2),
                     config={"timeout_s": 20.0})


def test_four_nics_stripe_bit_exact(bed):
    n = 128 << 20
    r0, r1 = (r["result"] for r in run_pair(bed, nbytes=n, iters=2))
    assert r1["wrong"] == 0
    tx = [s["tx_bytes"] for s in r0["stats"]]
    assert min(tx) > 0.2 * sum(tx), tx      # every NIC carried its share


@pytest.mark.parametrize("fault,cmd,heal", [
    ("fail", "fail 1 2", "heal 1 2"),
    ("blackhole", "blackhole 1 2", "degrade 1 2 base"),
])
def test_nic_lost_mid_transfer_is_bit_exact_and_bounded(bed, fault, cmd, heal):
    n = 128 << 20
    res = run_pair(bed, nbytes=n, fault_cmd=tb(*cmd.split()), heal_cmd=tb(*heal.split()),
                   fault_after_s=0.15, heal_after_s=3.0)
    r0, r1 = (r["result"] for r in res)
    assert r1["wrong"] == 0
    assert r0["stats"][2]["failures"] >= 1, r0["stats"]
    # floor: all bytes at 3-NIC speed; the issue allows +0.5 s for detection and re-sending
    bound = n / (3 * RATE_BPS) + 0.5
    assert r1["times"][0] < bound + 0.5, (r1["times"], bound)


def test_a_nic_lost_in_a_ppermute_loop_is_bit_exact(bed):
    # jax.lax.ppermute's collective: 32 MiB per rank around the two hosts, 6 times; host 1's
    # nic2 goes down 0.3 s in (the second call or so) and comes back 1.5 s later.
    rs = run_ranks("permute_with_fault", 2, nics=NICS, timeout=180, netns=hosts(2), config={"timeout_s": 20.0},
                   args=dict(nbytes=32 << 20, iters=6, fault_cmd=tb("fail", 1, 2), heal_cmd=tb("heal", 1, 2),
                             fault_after_s=0.3, heal_after_s=1.8))
    r0, r1 = (r["result"] for r in rs)
    assert r0["wrong"] == 0 and r1["wrong"] == 0, (r0, r1)
    assert r0["stats"]["1"][2]["failures"] >= 1, r0["stats"]


def test_a_nic_lost_in_a_ragged_all_to_all_loop_is_bit_exact(bed):
    # jax.lax.ragged_all_to_all's collective: about 16 MiB per rank in 1 KiB rows, uneven slices,
    # 6 times; host 1's nic2 goes down 0.3 s in and comes back 1.5 s later.
    cases = [("float32", 16 << 10, (256,), 2, 4 << 10)] * 6
    rs = run_ranks("host_ragged", 2, nics=NICS, timeout=180, netns=hosts(2), config={"timeout_s": 20.0},
                   args=dict(cases=cases, commands=dict(fault_cmd=tb("fail", 1, 2), heal_cmd=tb("heal", 1, 2),
                                                        fault_after_s=0.3, heal_after_s=1.8)))
    r0, r1 = (r["result"] for r in rs)
    assert r0["bad"] == r1["bad"] == [] and r0["errors"] == r1["errors"] == [], (r0, r1)
    assert r0["stats"]["1"][2]["failures"] >= 1, r0["stats"]


def test_flapping_nic_loses_nothing(bed):
    n = 64 << 20
    res = run_pair(bed, nbytes=n, iters=6, fault_cmd=tb("flap", 1, 2, 50, 20), fault_after_s=0.05)
    r1 = res[1]["result"]
    assert r1["wrong"] == 0
    assert sum(r1["times"]) < 30


def test_degraded_nic_loses_nothing(bed):
    n = 64 << 20
    res = run_pair(bed, nbytes=n, iters=2, fault_cmd=tb("degrade", 1, 2, "50mbit"),
                   heal_cmd=tb("degrade", 1, 2, "base"), fault_after_s=0.05, heal_after_s=4.0)
    r1 = res[1]["result"]
    assert r1["wrong"] == 0


def run_monitored(bed, **args):
    return run_ranks("monitored_transfer", 2, nics=NICS, args=args, timeout=120,
                     netns=hosts(2),
                     config={"timeout_s": 20.0})


def _rail_tx(timeline, rail):
    return [(s["t"], r["tx_bytes"]) for s in timeline for r in s["rails"] if r["rail"] == rail]


def test_link_events_move_traffic_off_at_once_and_back_after_heal(bed):
    """Host 1's NIC goes down: its monitor sees the kernel's event at once and fails the
    NIC's rails; host 0 is told on another rail (its own carrier-loss event comes later: the
    kernel delivers it through linkwatch, measured 350 ms). Traffic leaves the NIC within
    50 ms; after `heal` the NIC carries traffic again within 1 s (hold-down 100 ms, re-dial)."""
    res = run_monitored(bed, nbytes=32 << 20, iters=14,
                        steps=[(0.4, 0, "cmd", tb("fail", 1, 2)), (1.4, 0, "cmd", tb("heal", 1, 2))])
    r0, r1 = res[0]["result"], res[1]["result"]
    assert r1["wrong"] == 0
    down_cmd, up_cmd = r0["steps"]
    downs = [e for e in r1["events"] if e["kind"] == "link_down" and e["nic"] == "nic2"]
    assert downs, r1["events"]
    # the event is emitted after the rails were failed: its time bounds the failover
    assert downs[0]["time"] - down_cmd["t1_unix"] < 0.05, (downs[0], down_cmd)
    for r in (r0, r1):
        assert any(e["kind"] == "rail_failed" and e["rail"] == 2 for e in r["events"]), r["events"]
        assert any(e["kind"] == "rail_recovered" and e["rail"] == 2 for e in r["events"]), r["events"]
    # rank 0 sends: nothing more on rail 2 from 50 ms after the command (plus one sampling
    # period of slack) until the heal, then traffic again within 1 s
    tx = [b for t, b in _rail_tx(r0["timeline"], 2) if down_cmd["t1"] + 0.05 + 0.05 <= t <= up_cmd["t0"]]
    assert tx and max(tx) == min(tx), tx
    back = [t for t, b in _rail_tx(r0["timeline"], 2) if t > up_cmd["t1"] and b > max(tx)]
    assert back and back[0] - up_cmd["t1"] <= 1.0, (up_cmd, back[:3])


def test_black_hole_is_left_within_300_ms(bed):
    """Link up, nothing passes: the rail is failed within 300 ms and its chunks move; bit-exact.
    Which timer fires depends on what the rail held when the hole opened: with bytes in flight,
    the stall timer (R2CCL_STALL_MS, 250 ms, while its siblings progress); idle (between two of
    the transfers), there is nothing unacknowledged to stall on and the heartbeat silence
    (3 x 100 ms) fails it."""
    res = run_monitored(bed, nbytes=32 << 20, iters=10,
                        steps=[(0.4, 0, "cmd", tb("blackhole", 1, 2)),
                               (1.6, 0, "cmd", tb("degrade", 1, 2, "base"))])
    r0, r1 = res[0]["result"], res[1]["result"]
    assert r1["wrong"] == 0
    hole = r0["steps"][0]
    failed = [e for e in r0["events"] if e["kind"] == "rail_failed" and e["rail"] == 2 and e["time"] >= hole["t0_unix"]]
    assert failed and ("stalled" in failed[0]["detail"] or "heartbeats missed" in failed[0]["detail"]), r0["events"]
    tx = [b for t, b in _rail_tx(r0["timeline"], 2) if hole["t1"] + 0.30 + 0.05 <= t <= r0["steps"][1]["t0"]]
    assert tx and max(tx) == min(tx), tx


def test_degraded_nic_gets_a_tenth_of_the_weight_and_loses_nothing(bed):
    res = run_monitored(bed, nbytes=32 << 20, iters=12,
                        steps=[(0.3, 0, "cmd", tb("degrade", 1, 2, "50mbit")),
                               (2.3, 0, "cmd", tb("degrade", 1, 2, "base"))])
    r0, r1 = res[0]["result"], res[1]["result"]
    assert r1["wrong"] == 0
    assert any(e["kind"] == "degraded" and e["rail"] == 2 for e in r0["events"]), r0["events"]
    w = [r["weight"] for s in r0["timeline"] if 1.3 <= s["t"] <= 2.3 for r in s["rails"] if r["rail"] == 2]
    assert w and min(w) <= 0.2, w


def test_flapping_link_is_held_down_and_nothing_is_lost(bed):
    res = run_monitored(bed, nbytes=32 << 20, iters=16,
                        steps=[(0.3, 0, "cmd", tb("flap", 1, 2, 50, 20))])
    r0, r1 = res[0]["result"], res[1]["result"]
    assert r1["wrong"] == 0
    downs = [e for e in r1["events"] if e["kind"] == "link_down" and e["nic"] == "nic2"]
    assert len(downs) >= 10, r1["events"]
    # the hold-down keeps the NIC out while it flaps: far fewer failovers than flaps
    assert r0["stats"][2]["failures"] <= 5, r0["stats"][2]


def test_a_nic_down_at_start_does_not_hold_the_job_and_joins_when_healed(bed):
    testbed.fail(1, 2)
    try:
        # the transfer goes on until the healed NIC's rail has carried bytes (bounded): it joins
        # after the link's hold-down, which may come after three iterations on a fast run
        res = run_pair(bed, nbytes=64 << 20, iters=3, fault_cmd="true", fault_after_s=0.0,
                       heal_cmd=tb("heal", 1, 2), heal_after_s=0.3, until_rail_carries=2)
    finally:
        testbed.heal(1, 2)
    r0, r1 = (r["result"] for r in res)
    assert r1["wrong"] == 0 and len(r1["times"]) == len(r0["times"]) >= 3, (r0["times"], r1["times"])
    assert r0["stats"][2]["state"] == "up" and r0["stats"][2]["tx_bytes"] > 0, r0["stats"][2]

