"""The health monitor on loopback, faults by software injection: a rail slowed to a tenth gets
a matching weight and gets its share back when it recovers; a NIC declared down fails its
rails on both ends at once and is re-admitted when declared up. Every transfer bit-exact.
(The kernel's link events are tested on the test bed: test_testbed.py.)"""

import pytest

from harness import LOOPBACK4, run_ranks

MB = 1 << 20


def _weights(timeline, rail, t0, t1):
    return [r["weight"] for s in timeline if t0 <= s["t"] <= t1 for r in s["rails"] if r["rail"] == rail]


def _kinds(events, rail=None):
    return [e["kind"] for e in events if rail is None or e["rail"] == rail]


@pytest.mark.timing
def test_degraded_rail_gets_a_matching_weight_and_its_share_back_when_healed():
    rate = 40e6   # every rail of the sender capped: loopback behaves like 4 x 40 MB/s
    res = run_ranks("monitored_transfer", 2, nics=LOOPBACK4, timeout=90,
                    args={"nbytes": 8 * MB, "iters": 80, "rate": rate,
                          "steps": [(0.5, 0, "rate", [2, rate / 10]), (3.0, 0, "rate", [2, rate])]})
    r0, r1 = res[0]["result"], res[1]["result"]
    assert r1["wrong"] == 0
    assert "degraded" in _kinds(r0["events"], 2), r0["events"]
    assert "restored" in _kinds(r0["events"], 2), r0["events"]
    degraded = _weights(r0["timeline"], 2, 1.5, 3.0)
    assert degraded and min(degraded) <= 0.3, degraded
    low = [(s["t"], r["rail"], r["weight"], r.get("bandwidth_Bps")) for s in r0["timeline"] if 1.5 <= s["t"] <= 3.0
           for r in s["rails"] if r["rail"] != 2 and r["weight"] < 0.8]
    assert not low, (low[:6], [e for e in r0["events"] if e["rail"] != 2])
    healed = _weights(r0["timeline"], 2, 4.5, 99)
    assert healed and healed[-1] >= 0.8, healed


def test_nic_declared_down_fails_its_rails_on_both_ends_and_comes_back_when_up():
    res = run_ranks("monitored_transfer", 2, nics=LOOPBACK4, timeout=90,
                    args={"nbytes": 8 * MB, "iters": 50, "rate": 40e6,
                          "steps": [(0.5, 0, "nic", [1, 0]), (1.5, 0, "nic", [1, 1])]})
    r0, r1 = res[0]["result"], res[1]["result"]
    assert r1["wrong"] == 0
    s0, s1 = r0["stats"][1], r1["stats"][1]
    assert s0["failures"] >= 1 and s1["failures"] >= 1, (s0, s1)
    # the peer learns it from the notice on another rail, or (loopback: the close gets
    # through) from the connection's end, whichever comes first
    assert "reports its link down" in s1["last_error"] or "closed by the peer" in s1["last_error"], s1
    assert s0["state"] == "up" and s0["recoveries"] >= 1, s0
    # nothing on rail 1 while the NIC is down; back within 1 s of being declared up
    down = [r["tx_bytes"] for s in r0["timeline"] if 0.6 <= s["t"] <= 1.45 for r in s["rails"] if r["rail"] == 1]
    assert down and max(down) == min(down), down
    up_at = r0["steps"][1]["t1"]
    back = [s["t"] for s in r0["timeline"] if s["t"] > up_at for r in s["rails"] if r["rail"] == 1 and r["state"] == "up"]
    assert back and back[0] - up_at <= 1.0, (up_at, back[:3])
    assert "rail_failed" in _kinds(r0["events"], 1) and "rail_recovered" in _kinds(r0["events"], 1), r0["events"]


def test_prometheus_metrics_and_health_snapshot():
    res = run_ranks("metrics_scrape", 2, nics=LOOPBACK4[:2], timeout=60)
    assert res[1]["result"]["ok"]
    text, snap = res[0]["result"]["text"], res[0]["result"]["health"]
    for line in ('r2ccl_rail_up{nic="127.0.0.1",peer="1",rail="0",rank="0"} 1.0',
                 'r2ccl_rail_failures_total{nic="127.0.0.2",peer="1",rail="1",rank="0"} 1.0',
                 'r2ccl_nic_admitted{nic="127.0.0.2",rank="0"} 1.0'):
        assert line in text, text
    assert "r2ccl_rail_bandwidth_bytes_per_second" in text and "r2ccl_rail_tx_bytes_total" in text
    assert {"rail_failed", "rail_recovered"} <= set(res[0]["result"]["callback_events"]), res[0]["result"]
    rails = snap["peers"]["1"] if "1" in snap["peers"] else snap["peers"][1]
    assert [r["rail"] for r in rails] == [0, 1] and rails[0]["tx_bytes"] > 0, rails
    assert {"state", "weight", "bandwidth_Bps", "rtt_us", "failures", "last_event"} <= set(rails[0]), rails[0]


def test_doctor_reports_without_gpu_or_rdma(tmp_path):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "jax_r2ccl", "doctor", "--json"], capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path).stdout
    r = json.loads(out)
    assert any(n["name"] == "lo" for n in r["nics"]), r["nics"]
    assert any(line.startswith("NVML") for line in r["notes"]) and any(line.startswith("RDMA") for line in r["notes"])
    assert {s["env"] for s in r["settings"]} >= {"R2CCL_NICS", "R2CCL_MONITOR_MS"}
    text = subprocess.run([sys.executable, "-m", "jax_r2ccl", "doctor"], capture_output=True, text=True,
                          timeout=60, check=True, cwd=tmp_path).stdout
    assert "Settings in force" in text and "NICs" in text
