"""The 4-host test bed (4 hosts x 4 NICs at 100mbit behind a switch namespace): degraded-mode
all-reduce plans under a real NIC failure. Needs root; skipped with the reason otherwise."""

import subprocess

import pytest

from harness import run_ranks
from test_testbed import NETNS, NICS, NSRUN, _why_not

pytestmark = [pytest.mark.testbed, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def netns(*args):
    subprocess.run(["bash", NETNS, *map(str, args)], check=True, timeout=120, capture_output=True)


def test_four_hosts_replan_when_a_host_loses_a_nic_and_stay_bit_exact():
    """4 hosts x 4 NICs: host 3 loses a NIC in the middle of an all-reduce loop; the planner
    (fed by each host's monitor, agreed per call) moves ownership away from it, and every
    result stays bit-exact."""
    netns("up", 4, 4, "100mbit")
    try:
        res = run_ranks("replan_loop", 4, nics=NICS, timeout=240,
                        netns=[["bash", NSRUN, f"r4h{i}"] for i in range(4)],
                        config={"timeout_s": 30.0, "rail_window_bytes": 131072, "chunk_bytes": 65536},
                        args={"count": 2 << 20, "iters": 12, "fault_cmd": f"bash {NETNS} fail 3 3",
                              "fault_after_s": 1.5})
    finally:
        subprocess.run(["bash", NETNS, "down"], timeout=120, capture_output=True)
    for r in res:
        assert r["result"]["wrong"] == 0, r["result"]
    plans = [p for p in res[0]["result"]["plans"]]
    assert plans[0]["plan"] == "balance", plans[0]
    assert plans[-1]["plan"] == "optimal" and plans[-1]["capacities"][3] == 3.0, plans[-1]
    assert plans[-1]["shares"][3] < 0.2, plans[-1]
    for p in range(len(plans)):   # the same plan on every host, call by call
        assert len({tuple(r["result"]["plans"][p]["shares"]) for r in res}) == 1
