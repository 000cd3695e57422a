"""The random-fault soak (`jax-r2ccl soak`, jax_r2ccl/tools/soak.py): its schedule's rules,
checked against an independent sweep of the timeline, and a soak of R2CCL_SOAK_MINUTES
(default 3) on two test-bed hosts, which must end with no wrong result and no hang. The soak
itself needs root; the schedule's tests run everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jax_r2ccl.tools import soak


def _active(faults, t):
    return [f for f in faults if f.at_s <= t < f.at_s + f.dur_s]


@pytest.mark.parametrize("seed,hosts", [(1, 2), (2, 4), (3, 8), (4, 4)])
def test_schedule_keeps_a_path_between_every_pair_of_hosts(seed, hosts):
    faults = soak.schedule(seed, 30 * 60, hosts)
    assert len(faults) > 300, len(faults)                  # ~one every 2.5 s, minus the refused
    assert {f.kind for f in faults} == set(soak.KINDS)
    assert max(len(_active(faults, t / 10)) for t in range(0, 30 * 600)) >= 3   # they do overlap
    for tick in range(0, 30 * 60 * 20):                    # every 50 ms of the half hour
        act = _active(faults, tick / 20)
        if any(f.kind == "host_blip" for f in act):
            assert len(act) == 1 and act[0].dur_s < 1.0, act
            continue
        nics = [(f.host, k) for f in act for k in f.nics()]
        assert len(nics) == len(set(nics)), act            # never two faults on one NIC
        cut = {(f.host, k) for f in act if f.kind != "degrade" for k in f.nics()}
        for a in range(hosts):
            for b in range(a + 1, hosts):
                assert any((a, k) not in cut and (b, k) not in cut for k in range(soak.NICS)), (tick, act)
    assert all(f.at_s >= soak.WARMUP_S and f.at_s + f.dur_s <= 30 * 60 - 5 for f in faults)


def test_schedule_is_a_function_of_its_seed():
    assert soak.schedule(7, 600, 4) == soak.schedule(7, 600, 4)
    assert soak.schedule(7, 600, 4) != soak.schedule(8, 600, 4)


def test_bad_arguments_are_refused_with_the_reason():
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "soak", "--hosts", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--hosts must be between 2 and 8" in r.stderr, r.stderr


def _why_not():
    from jax_r2ccl.tools import testbed
    return testbed.why_unavailable()


@pytest.mark.testbed
@pytest.mark.timeout(1800)
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_soak_on_two_testbed_hosts_has_no_wrong_result_and_no_hang(tmp_path):
    from jax_r2ccl.tools import testbed
    from jax_r2ccl.tools.launch import child_env
    minutes = float(os.environ.get("R2CCL_SOAK_MINUTES", "3"))
    report = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "soak", "--minutes", str(minutes), "--seed", "1",
                        "--hosts", "2", "--report", str(report)], capture_output=True, text=True,
                       timeout=minutes * 60 + 600, env=child_env())
    text = r.stdout + r.stderr
    shown = "\n".join(line for line in text.splitlines() if line.startswith(("[soak]", "Traceback", "jax-r2ccl")))
    print(shown)
    assert report.exists(), text[-5000:]
    rep = json.loads(report.read_text())
    assert rep["wrong"] == 0 and rep["hangs"] == 0, shown
    assert r.returncode == 0 and rep["pass"], shown + "\n" + text[-3000:]
    assert rep["faults_injected"] >= 0.8 * rep["faults_scheduled"] > 0 and not rep["fault_errors"], rep
    assert rep["failovers"] > 0 and rep["failbacks"] > 0, rep
    assert rep["steps"] > 100, rep
    assert not [ns for ns in testbed.namespaces() if ns.startswith("r2")], "the soak left its test bed up"
