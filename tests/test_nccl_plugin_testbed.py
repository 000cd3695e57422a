"""The NCCL net plugin's fault cells on the namespace test bed: the conformance harness
(tests/nccl/plugin_harness.cc, --case loop) runs as 2 and 4 namespace hosts with 4 NICs each
at 200 Mbit/s, every process one NCCL rank driving the plugin the way NCCL's proxy does, while
the test bed's own faults hit the last host's NICs from outside:

- the survivable faults of the fault matrix (tests/test_fault_matrix.py: fail, flap, black
  hole, degrade to a tenth, all NICs but one, all NICs for 1 s, the same commands and times),
  under a loop of the ring all-reduce and all-gather plus an all-to-all over connections to
  every rank: test() never returns an error, every iteration is checked bit for bit, no
  iteration waits out R2CCL_TIMEOUT (the failover happened) and a fault that fails rails shows
  in the victim's log (the fault landed);
- the fatal faults (every NIC held down, the peer SIGKILLed, the peer SIGSTOPped) under a loop
  of the all-to-all (every rank always has a request on the victim's connections): every
  surviving process gets an error from test() within R2CCL_TIMEOUT + 2 s of the fault, closes
  its connections without hanging, and exits.

NCCL itself turns a plugin error into the end of the communicator; a rank with no request on
the lost peer's connections learns of it from its neighbours (ncclCommAbort), not from the
plugin, which is why the fatal loop is an all-to-all. Needs root; skipped with the reason
otherwise. Traffic only inside the bed's namespaces (198.18.0.0/15)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from jax_r2ccl.tools import testbed
from test_fault_matrix import FAILS_RAILS, FATAL, SLACK_S, SURVIVE_TIMEOUT_S, TIMEOUT_S, _all, _restore, _survivable
from test_nccl_plugin import plugin  # noqa: F401  (the fixture: builds the plugin and the harness)
from test_testbed import NICS, _why_not, hosts

pytestmark = [pytest.mark.testbed, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

RATE = "200mbit"
# The fault matrix's timers (tests/harness.FAST), through the plugin's own settings.
TIMERS = {"R2CCL_HEARTBEAT_MS": "100", "R2CCL_STALL_MS": "200", "R2CCL_REPROBE_MS": "100",
          "R2CCL_CONNECT_TIMEOUT_MS": "1000", "R2CCL_CRC": "1"}


@pytest.fixture(scope="module")
def bed():
    testbed.up(4, 4, RATE)
    try:
        yield
    finally:
        testbed.down()


class Job:
    """`world` harness processes of the loop case, process i as test-bed host i."""

    def __init__(self, plugin, tmp_path, world, timeout_s, args, env=None):
        so, harness = plugin
        self.dir, self.world = tmp_path, world
        env = dict(os.environ, R2CCL_NICS=",".join(NICS), R2CCL_TIMEOUT=str(timeout_s), **TIMERS, **(env or {}))
        self.logs = [open(tmp_path / f"out.{r}", "w+") for r in range(world)]
        self.procs = [subprocess.Popen(
            [*hosts(world)[r], harness, "--plugin", so, "--dir", str(tmp_path), "--rank", str(r), "--world", str(world),
             "--case", "loop", "--timeout", "90", "--seed", str(world), *args],
            env=env, stdout=self.logs[r], stderr=subprocess.STDOUT) for r in range(world)]

    def started(self, within_s=60.0) -> float:
        """Waits for rank 0's loop-started file; returns this machine's monotonic time of it."""
        deadline = time.monotonic() + within_s
        path = self.dir / "loop-started"
        while not path.exists():
            dead = [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, f"the loop never started (exited: {dead})\n{self.text()}"
            time.sleep(0.01)
        return time.monotonic()

    def pid(self, rank) -> int:
        return int((self.dir / f"pid.{rank}").read_text())

    def wait(self, ranks, within_s=120.0) -> None:
        deadline = time.monotonic() + within_s
        for r in ranks:
            try:
                self.procs[r].wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def kill_all(self) -> None:
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                try:
                    os.kill(self.pid(r), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()

    def out(self, rank) -> str:
        return (self.dir / f"out.{rank}").read_text()

    def text(self) -> str:
        return "\n".join(f"--- rank {r}:\n{self.out(r)[-3000:]}" for r in range(self.world))


def _sh(cmd: str) -> int:
    return subprocess.run(cmd, shell=True, timeout=60).returncode


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fault", list(_survivable(1)))
def test_survivable_fault_through_the_plugin_never_reaches_nccl_and_is_bit_exact(bed, plugin, tmp_path, fault, world):
    _restore(4)
    victim = world - 1
    cmd, heal, at, heal_at, settle = _survivable(victim)[fault]
    job = Job(plugin, tmp_path, world, SURVIVE_TIMEOUT_S,
              ["--collective", "both", "--loop-bytes", str(4 << 20), "--seconds", str(heal_at + settle + 1.0)])
    rcs = []
    try:
        t0 = job.started()
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        rcs.append(_sh(cmd))
        if heal:
            time.sleep(max(0.0, t0 + heal_at - time.monotonic()))
            rcs.append(_sh(heal))
        job.wait(range(world))
    finally:
        job.kill_all()
        _restore(4)
    assert rcs and all(rc == 0 for rc in rcs), (fault, rcs)
    for r in range(world):
        out = job.out(r)
        m = re.search(rf"harness: loop rank {r}: ok \((\d+) iterations .* median ([0-9.]+) ms, worst ([0-9.]+) ms[;)]", out)
        assert job.procs[r].returncode == 0 and m, f"{fault}, {world} hosts: rank {r} (exit {job.procs[r].returncode})\n{job.text()}"
        # No iteration waited out the timeout (a failover that did not happen would).
        assert float(m.group(3)) < SURVIVE_TIMEOUT_S * 1e3, (fault, world, r, m.group(0))
    print(f"plugin cell {fault} x {world} hosts: " + "; ".join(
        re.search(r"ok \((.*)\)", job.out(r)).group(1) for r in range(world)) +
        f"; victim's rail failures {job.out(victim).count(' failed: ')}")
    if fault in FAILS_RAILS:
        assert " failed: " in job.out(victim), f"the fault did not land on host {victim}:\n{job.out(victim)[-3000:]}"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fault", FATAL)
def test_fatal_fault_through_the_plugin_is_an_error_on_every_survivor_in_time(bed, plugin, tmp_path, fault, world):
    _restore(4)
    victim = world - 1
    survivors = list(range(world - 1)) if fault in ("kill", "stop") else list(range(world))
    job = Job(plugin, tmp_path, world, TIMEOUT_S,
              ["--collective", "alltoall", "--loop-bytes", str(1 << 20), "--expect-error", "--seconds", "60"])
    try:
        t0 = job.started()
        time.sleep(max(0.0, t0 + 0.5 - time.monotonic()))
        if fault == "all_nics_held":
            assert _sh(_all("fail", victim, [0, 1, 2, 3])) == 0
        else:
            os.kill(job.pid(victim), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        cut = time.time()
        job.wait(survivors, within_s=TIMEOUT_S + SLACK_S + 30)
    finally:
        job.kill_all()
        _restore(4)
    for r in survivors:
        out = job.out(r)
        m = re.search(rf"harness: loop rank {r}: ok \(the expected error: .* at wall ([0-9.]+);.* closed in ([0-9.]+) s\)", out)
        assert job.procs[r].returncode == 0 and m, f"{fault}, {world} hosts: rank {r} (exit {job.procs[r].returncode})\n{job.text()}"
        took = float(m.group(1)) - cut
        assert took <= TIMEOUT_S + SLACK_S, (fault, world, r, f"the error came {took:.2f} s after the fault", out[-2000:])
        print(f"plugin cell {fault} x {world} hosts: rank {r}: error {took:.2f} s after the fault, closed in {m.group(2)} s")
        # The text through NCCL's logger names the cause.
        assert re.search(r"NET/r2ccl: (send|receive) on NCCL connection \d+ failed \((peer_gone|all_rails_down)\)", out), out[-3000:]


def _tx_bytes(host: int) -> list[int]:
    """Bytes sent so far by each NIC of test-bed host `host` (the kernel's counters)."""
    import json
    out = subprocess.run(["ip", "-n", f"r4h{host}", "-j", "-s", "link", "show"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    by_name = {d["ifname"]: d["stats64"]["tx"]["bytes"] for d in json.loads(out)}
    return [by_name[n] for n in NICS]


def _nic_phases(job: Job, world: int, label: str, plan) -> dict[str, list[int]]:
    """Runs `job` through `plan`, a list of (name, start_s, end_s, command after it or None)
    in seconds from the loop's start: the bytes host 0's NICs sent between start and end of
    each phase. Every rank must then end its loop ok (bit-exact); the bed is restored."""
    phases = {}
    try:
        t0 = job.started()

        def at(s):
            time.sleep(max(0.0, t0 + s - time.monotonic()))

        for name, start, end, then in plan:
            at(start)
            a = _tx_bytes(0)
            at(end)
            phases[name] = [x - y for x, y in zip(_tx_bytes(0), a)]
            if then:
                assert _sh(then) == 0, then
        job.wait(range(world))
    finally:
        job.kill_all()
        _restore(4)
    for r in range(world):
        assert job.procs[r].returncode == 0 and f"harness: loop rank {r}: ok" in job.out(r), job.text()
    for name, tx in phases.items():
        print(f"{label}, {name}: host 0 sent " + ", ".join(f"nic{k} {b / 1e6:.1f} MB" for k, b in enumerate(tx)))
    return phases


def test_a_per_nic_device_keeps_its_traffic_on_its_nic_and_fails_over_to_the_backups(bed, plugin, tmp_path):
    """R2CCL_NCCL_DEVICES=nic, both processes on device 2: the kernel's counters of host 0's
    NICs show where the bytes went. Healthy: nic2 carries the connection (the other NICs only
    heartbeats and acks); nic2 cut: the backups carry it, every iteration still exact; nic2
    healed: back on nic2 (failback)."""
    world, dev = 2, 2
    _restore(4)
    job = Job(plugin, tmp_path, world, SURVIVE_TIMEOUT_S,
              ["--collective", "ring", "--loop-bytes", str(4 << 20), "--seconds", "6.5", "--dev", str(dev)],
              env={"R2CCL_NCCL_DEVICES": "nic"})
    phases = _nic_phases(job, world, f"per-NIC device {dev}", [
        ("healthy", 0.3, 1.8, testbed.command_line("fail", 0, dev)),
        ("nic2 down", 2.3, 3.8, testbed.command_line("heal", 0, dev)),
        ("healed", 5.0, 6.3, None)])
    total = {k: sum(v) for k, v in phases.items()}
    assert phases["healthy"][dev] >= 0.95 * total["healthy"], phases
    assert phases["nic2 down"][dev] <= 0.01 * total["nic2 down"] and total["nic2 down"] > 5e6, phases
    assert phases["healed"][dev] >= 0.95 * total["healed"], phases


def test_a_degraded_primary_nic_puts_its_connections_backups_to_work(bed, plugin, tmp_path):
    """R2CCL_NCCL_DEVICES=nic, one process per host driving four devices (as JAX's one
    process per host drives its GPUs): four rings, ring j on device j, one after another, so
    each NIC carries a quarter. Host 0's nic2 slowed to a tenth without failing: the health
    monitor sees that nic2 delivers under half of what the other NICs' primaries deliver and
    puts ring 2's backups to work (it would otherwise run at a tenth, still a quarter of the
    bytes); restored, ring 2 is back on nic2. Every iteration bit-exact."""
    world, dev = 2, 2
    _restore(4)
    job = Job(plugin, tmp_path, world, SURVIVE_TIMEOUT_S,
              ["--collective", "ring", "--loop-bytes", str(2 << 20), "--seconds", "10", "--rings", "4"],
              env={"R2CCL_NCCL_DEVICES": "nic"})
    phases = _nic_phases(job, world, "four devices", [
        ("healthy", 0.5, 2.0, testbed.command_line("degrade", 0, dev, "20mbit")),
        ("nic2 at a tenth", 3.5, 5.5, testbed.command_line("degrade", 0, dev, "base")),
        ("restored", 7.5, 9.5, None)])
    share = {k: v[dev] / max(1, sum(v)) for k, v in phases.items()}
    print("nic2's share: " + ", ".join(f"{k} {v:.1%}" for k, v in share.items()))
    for line in job.out(0).splitlines():
        if "backups_" in line:
            print(line.strip()[:200])
    assert share["healthy"] >= 0.18, phases
    assert share["nic2 at a tenth"] <= 0.10 and sum(phases["nic2 at a tenth"]) > 5e6, phases
    assert share["restored"] >= 0.18, phases
    assert "backups_engaged" in job.out(0) and "backups_released" in job.out(0), job.out(0)[-3000:]
