"""Whole jobs on the test bed: 4 hosts x 4 NICs at 100mbit behind a switch namespace
(degraded-mode all-reduce plans under a real NIC failure), and the training demo on two
namespace hosts through a real link down. Needs root; skipped with the reason otherwise."""

import pytest

from harness import run_ranks
from jax_r2ccl.tools import testbed
from test_testbed import NICS, _why_not, hosts, tb

pytestmark = [pytest.mark.testbed, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def test_four_hosts_replan_when_a_host_loses_a_nic_and_stay_bit_exact():
    """4 hosts x 4 NICs: host 3 loses a NIC in the middle of an all-reduce loop; the planner
    (fed by each host's monitor, agreed per call) moves ownership away from it, and every
    result stays bit-exact."""
    testbed.up(4, 4, "100mbit")
    try:
        res = run_ranks("replan_loop", 4, nics=NICS, timeout=240,
                        netns=hosts(4),
                        config={"timeout_s": 30.0},
                        args={"count": 2 << 20, "iters": 12, "fault_cmd": tb("fail", 3, 3),
                              "fault_after_s": 1.5})
    finally:
        testbed.down()
    for r in res:
        assert r["result"]["wrong"] == 0, r["result"]
    plans = [p for p in res[0]["result"]["plans"]]
    assert plans[0]["plan"] == "balance", plans[0]
    assert plans[-1]["plan"] == "optimal" and plans[-1]["capacities"][3] == 3.0, plans[-1]
    assert plans[-1]["shares"][3] < 0.2, plans[-1]
    for p in range(len(plans)):   # the same plan on every host, call by call
        assert len({tuple(r["result"]["plans"][p]["shares"]) for r in res}) == 1


@pytest.mark.timeout(600)
def test_training_demo_on_two_testbed_hosts_is_bit_identical_through_a_real_link_down():
    """`jax-r2ccl demo --testbed`: the two processes run as two namespace hosts, host 0's nic2
    loses carrier in the middle of a step's gradient all-reduce; the demo measures that the
    fault landed inside the all-reduce and that the loss curve is bit-identical."""
    import re
    import subprocess
    import sys
    from jax_r2ccl.tools.launch import child_env
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "demo", "--testbed", "--steps", "40"],
                       capture_output=True, text=True, timeout=560, env=child_env())
    text = r.stdout + r.stderr
    shown = "\n".join(l for l in text.splitlines() if l.startswith(("[demo]", "demo:", "Traceback", "jax-r2ccl")))
    assert r.returncode == 0, shown[-5000:] + "\n" + text[-2000:]
    assert "taken DOWN (link down: carrier lost" in text, text[-5000:]
    m = re.search(r"fault inside an all-reduce: YES \((\d+) bytes unacknowledged on rail (\d) when it went down, "
                  r"(\d+) chunks re-sent\)", text)
    assert m and int(m.group(1)) > 0 and int(m.group(3)) > 0, text[-5000:]
    assert f"rail {m.group(2)} failed and recovered: YES" in text and "loss curves BIT-IDENTICAL over 40 steps" in text, text[-5000:]
    assert not [ns for ns in testbed.namespaces() if ns.startswith("r2")], "the demo left its test bed up"
