"""The NCCL net plugin (csrc/nccl/, libnccl-net-r2ccl.so) driven without NCCL or a GPU: the
conformance harness (tests/nccl/plugin_harness.cc) dlopens the built plugin, looks up a table and
calls it the way NCCL 2.30's proxy does (the sequences and their NCCL source lines are in the
harness's header), in 2, 3 and 4 processes over loopback with two NICs each (127.0.0.1 and
127.0.0.2: two rails per connection). Every byte is checked. Built in the plain C++ folder
(tests/test_cpp.py's configure("plain")).

What the plugin must export is checked here too: `nm -D` lists its three tables, its health
function (r2ccl_nccl_plugin_health_v1, for jax_r2ccl.health()) and nothing else of ours.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from test_cpp import _cmake, _compiler, _ninja, _run, configure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NICS = "127.0.0.1,127.0.0.2"


@pytest.fixture(scope="module")
def plugin():
    """Builds the plugin and the harness; yields (plugin .so, harness binary)."""
    if _cmake() is None or _ninja() is None or _compiler() is None:
        pytest.skip("cmake, ninja or a C++ compiler missing")
    build_dir = configure("plain")
    _run([*_cmake(), "--build", str(build_dir), "--target", "r2ccl_nccl_net", "nccl_plugin_harness", "endpoint_rtt"], ROOT,
         "build of the NCCL plugin, its harness and the harness's endpoint baseline", timeout=900)
    return str(build_dir / "libnccl-net-r2ccl.so"), str(build_dir / "nccl_plugin_harness")


# A clean run logs no WARN: WARN is for faults (an orderly close is INFO). The lines a case
# provokes on purpose are named here; cases that inject faults pass warns=None.
WARN_LINE = re.compile(r"^\[rank \d+ nccl-log 2\] (.*)$", re.M)


def run_harness(plugin, tmp_path, case, world, table=12, seed=1, env=None, timeout=120, extra=(), warns=()):
    """Runs `world` harness processes of one case; returns their outputs (all must pass). With
    `warns` a sequence of regular expressions, every WARN line of the plugin must match one."""
    so, harness = plugin
    procs, logs = [], []
    for rank in range(world):
        e = dict(os.environ, R2CCL_NICS=NICS, R2CCL_TEST_FAULT_FILE=str(tmp_path / f"fault.{rank}"), **(env or {}))
        # Each rank's output to a file, not a pipe: a pipe read only after the other rank ended
        # fills (64 KiB) and blocks the plugin's logging thread (the engine's) in write().
        logs.append(open(tmp_path / f"harness.{case}.{rank}.log", "w+"))
        procs.append(subprocess.Popen(
            [harness, "--plugin", so, "--dir", str(tmp_path), "--rank", str(rank), "--world", str(world),
             "--case", case, "--table", str(table), "--seed", str(seed), "--timeout", "60", *extra],
            env=e, stdout=logs[-1], stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p, log in zip(procs, logs):
            p.wait(timeout=timeout)
            log.seek(0)
            outs.append((p.returncode, log.read()))
    finally:
        for p, log in zip(procs, logs):
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    for rank, (rc, out) in enumerate(outs):
        # (every rank's end: the first to fail is often the others' reason to wait)
        assert rc == 0 and f"harness: {case} rank {rank}: ok" in out, \
            "\n".join(f"rank {r} (exit {c}):\n{o[-6000:]}" for r, (c, o) in enumerate(outs))
        if warns is not None:
            stray = [w for w in WARN_LINE.findall(out) if not any(re.search(p, w) for p in warns)]
            assert not stray, f"rank {rank} logged WARN lines in a clean run:\n" + "\n".join(stray[:20])
    return [out for _, out in outs]


def test_the_plugin_exports_its_tables_and_nothing_else(plugin):
    """The three tables NCCL looks up, and one function for jax_r2ccl.health() whose r2ccl_
    prefix cannot collide with NCCL or a program's symbols."""
    so, _ = plugin
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not installed")
    out = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == ["ncclNetPlugin_v10", "ncclNetPlugin_v11", "ncclNetPlugin_v12", "r2ccl_nccl_plugin_health_v1"], names
    # No undefined symbol outside the C and C++ runtimes (it loads into any process NCCL runs in).
    undefined = subprocess.run([nm, "-D", "--undefined-only", so], capture_output=True, text=True, check=True).stdout
    ours = [line for line in undefined.splitlines() if "r2ccl" in line]
    assert not ours, ours


@pytest.mark.parametrize("table", [10, 11, 12])
def test_properties_of_every_table(plugin, tmp_path, table):
    # (the case's listen on a device past the last is an error returned to the caller: WARN, on purpose)
    run_harness(plugin, tmp_path, "properties", 2, table=table, warns=(r"past the devices",))


@pytest.mark.parametrize("world,table", [(2, 12), (4, 12), (2, 10)])
def test_p2p_random_sizes_larger_receives_zero_bytes_and_32_outstanding_are_exact(plugin, tmp_path, world, table):
    outs = run_harness(plugin, tmp_path, "p2p", world, table=table, seed=world * 7 + table)
    assert all("bytes checked" in o for o in outs)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_ring_all_reduce_and_all_gather_through_the_slots_are_bit_exact(plugin, tmp_path, world):
    run_harness(plugin, tmp_path, "ring", world, table=11 if world == 3 else 12, seed=world)


def test_connects_on_one_thread_while_another_moves_data(plugin, tmp_path):
    run_harness(plugin, tmp_path, "threads", 2, seed=5)


def test_close_with_requests_in_flight_then_a_new_connection_works(plugin, tmp_path):
    # (the case's refused regMrDmaBuf calls are errors returned to the caller: WARN, on purpose)
    run_harness(plugin, tmp_path, "close", 2, seed=9, warns=(r"regMrDmaBuf",))


# NCCL's closes (issue 48): destroy, abort and connection teardown close comms at any point,
# from several threads. The close race's cells and checks are in tests/nccl/close_race.cc.
# Under the sanitizers: tests/test_sanitizers.py runs the same cases.
@pytest.mark.parametrize("seed", [1, 2])
def test_close_race_never_crashes_never_waits_past_its_bound_and_delivers_every_completed_send(plugin, tmp_path, seed):
    outs = run_harness(plugin, tmp_path, "close_race", 2, seed=seed, timeout=180, warns=None,
                       extra=("--iters", "300"))
    assert all("300 iterations" in o and "over 20 cells" in o for o in outs), outs[0][-2000:]


@pytest.mark.proof
def test_close_race_ten_thousand_iterations(plugin, tmp_path):
    outs = run_harness(plugin, tmp_path, "close_race", 2, seed=48, timeout=900, warns=None,
                       extra=("--iters", "10000"))
    assert all("10000 iterations" in o for o in outs), outs[0][-2000:]


def test_eight_threads_four_communicators_shared_listens_connect_within_a_second_without_cross_talk(plugin, tmp_path):
    # (64 connections' rails on two shared cores: the monitor may judge one slow, a WARN it owes)
    run_harness(plugin, tmp_path, "many", 2, seed=3, timeout=300, extra=("--rounds", "10"), warns=(r"health: .* degraded",))


@pytest.mark.proof
def test_eight_threads_four_communicators_a_hundred_rounds(plugin, tmp_path):
    run_harness(plugin, tmp_path, "many", 2, seed=4, timeout=900, extra=("--rounds", "100"), warns=(r"health: .* degraded",))


def test_connections_open_within_a_second_beside_a_thread_spinning_on_test(plugin, tmp_path):
    """NCCL's progress thread polls test() without rest while its proxy thread connects."""
    run_harness(plugin, tmp_path, "spin", 2, seed=7)


def test_a_throw_on_the_engine_thread_fails_one_connection_not_the_process(plugin, tmp_path):
    run_harness(plugin, tmp_path, "contain", 2, seed=6, warns=None)


def test_finalize_dlclose_and_dlopen_again(plugin, tmp_path):
    run_harness(plugin, tmp_path, "reload", 2, seed=11)


@pytest.mark.parametrize("world", [2, 4])
def test_survivable_faults_under_traffic_never_reach_nccl_and_every_byte_is_exact(plugin, tmp_path, world):
    """Rank 0 closes a rail of every connection, heals it, black-holes the other, heals it,
    declares a NIC down and up (R2CCL_TEST_FAULT_FILE) while traffic streams: test() never
    returns an error, every byte is checked, and the plugin applied every fault."""
    outs = run_harness(plugin, tmp_path, "faults", world, seed=world, timeout=180, warns=None)
    assert "ok (6 faults" in outs[0], outs[0][-3000:]
    # The core's own lines (a rail failing) reach NCCL's logger, not stderr.
    assert "nccl-log 2] NET/r2ccl: rail 1 to NCCL" in outs[0] and "[r2ccl " not in outs[0], outs[0][-3000:]


def test_every_nic_held_down_past_the_timeout_fails_both_sides_in_time(plugin, tmp_path):
    """The fatal cell: every NIC of rank 0 down past R2CCL_TIMEOUT (2 s): both ranks' send and
    receive return ncclRemoteError within R2CCL_TIMEOUT + 2 s, the log naming the cause and
    the rails; nothing hangs."""
    outs = run_harness(plugin, tmp_path, "fatal", 2, env={"R2CCL_TIMEOUT": "2"}, warns=None)
    for o in outs:
        assert "all_rails_down" in o and "R2CCL_TIMEOUT" in o, o[-3000:]


def test_the_bandwidth_case_streams_exact_pieces_and_times_a_round_trip(plugin, tmp_path):
    """The case bench/testbed_nccl.sh times on the test bed (no speed is judged here)."""
    outs = run_harness(plugin, tmp_path, "bandwidth", 2, extra=("--bytes", str(16 << 20)))
    assert all(" BW " in o and " RTT " in o for o in outs), outs


@pytest.mark.parametrize("mode", [(), ("--stream", str(16 << 20))])
def test_the_endpoint_baseline_moves_the_same_traffic_exactly(plugin, tmp_path, mode):
    """tests/nccl/endpoint_rtt.cc, bench/testbed_nccl.sh's baseline: the harness's round trip
    and stream through the core's Endpoint from C++ (no speed is judged here)."""
    rtt = os.path.join(os.path.dirname(plugin[1]), "endpoint_rtt")
    procs = [subprocess.Popen([rtt, "--rank", str(r), "--dir", str(tmp_path), *mode], env=dict(os.environ, R2CCL_NICS=NICS),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    word = " BW " if mode else " RTT "
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"endpoint_rtt rank {r}: ok" in out and word in out, out[-3000:]


# Per-NIC devices (R2CCL_NCCL_DEVICES=nic): one device per NIC, the connection's own NIC its
# primary rail and the others backups (docs/design.md §12). Loopback cannot show where the
# bytes went (both NICs are lo): tests/test_nccl_plugin_testbed.py reads the test bed's NIC
# counters; here every byte is checked through the same cases.
PER_NIC = {"R2CCL_NCCL_DEVICES": "nic"}


@pytest.mark.parametrize("table", [10, 12])
def test_per_nic_devices_report_one_device_per_nic_each_its_own(plugin, tmp_path, table):
    run_harness(plugin, tmp_path, "properties", 2, table=table, env=PER_NIC, extra=("--devices", "2"),
                warns=(r"past the devices",))


def test_per_nic_devices_move_exact_bytes_on_either_device(plugin, tmp_path):
    for dev in (0, 1):
        d = tmp_path / f"dev{dev}"
        d.mkdir()
        run_harness(plugin, d, "ring", 4, env=PER_NIC, seed=dev, extra=("--dev", str(dev)))


def test_per_nic_device_survives_its_own_nic_failing_onto_the_backup_exactly(plugin, tmp_path):
    """Device 1: its primary rail is NIC 1's. The fault schedule closes rail 1 (the primary),
    stalls rail 0 (the backup) while the primary is healed, then declares NIC 1 down: the
    backup carries everything, then the primary again; test() never fails, every byte exact."""
    outs = run_harness(plugin, tmp_path, "faults", 2, env=PER_NIC, seed=3, timeout=180, extra=("--dev", "1"),
                       warns=None)
    assert "ok (6 faults" in outs[0], outs[0][-3000:]


HEALTH_PROBE = r'''
import ctypes, json, os, sys, time
so = sys.argv[1]
lib = ctypes.CDLL(so)
R = ctypes.c_int
P = ctypes.c_void_p
PP = ctypes.POINTER(ctypes.c_void_p)
# ncclNet_v10_t (csrc/nccl/net_abi.h): name, init, devices, getProperties, listen, connect, then the data path.
slots = (ctypes.c_void_p * 19).in_dll(lib, "ncclNetPlugin_v10")
fn = lambda i, *args: ctypes.CFUNCTYPE(R, *args)(slots[i])
init, listen = fn(1, P, P), fn(4, R, P, PP)
connect, accept = fn(5, R, P, P, PP, PP), fn(6, P, PP, PP)
isend = fn(10, P, P, ctypes.c_size_t, R, P, P, PP)
irecv = fn(11, P, R, PP, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(R), PP, PP, PP)
test = fn(13, P, ctypes.POINTER(R), ctypes.POINTER(R))
from jax_r2ccl.transport import nccl
assert nccl.plugin_health()["monitor"] == "not initialized", nccl.plugin_health()
assert init(None, None) == 0
handle = ctypes.create_string_buffer(128)
lc, sc, rc, dh = P(), P(), P(), P()
assert listen(0, handle, ctypes.byref(lc)) == 0
assert connect(0, None, handle, ctypes.byref(sc), ctypes.byref(dh)) == 0 and sc.value
deadline = time.monotonic() + 30
while not rc.value:
    assert accept(lc, ctypes.byref(rc), ctypes.byref(dh)) == 0 and time.monotonic() < deadline
out, into = ctypes.create_string_buffer(b"x" * 4096, 4096), ctypes.create_string_buffer(8192)
sreq, rreq = P(), P()
data, size, tag = P(ctypes.addressof(into)), ctypes.c_size_t(8192), R(0)
assert irecv(rc, 1, ctypes.byref(data), ctypes.byref(size), ctypes.byref(tag), None, None, ctypes.byref(rreq)) == 0
assert isend(sc, out, 4096, 0, None, None, ctypes.byref(sreq)) == 0
for req in (sreq, rreq):
    done, got = R(0), R(-1)
    while not done.value:
        assert test(req, ctypes.byref(done), ctypes.byref(got)) == 0 and time.monotonic() < deadline
assert into.raw[:4096] == out.raw
time.sleep(0.3)   # a monitor sample or more
snap = nccl.plugin_health()
from jax_r2ccl.transport.endpoint import Endpoint
from jax_r2ccl.transport.health import HealthMonitor
from jax_r2ccl.monitoring.metrics import HealthCollector
ep = Endpoint(0, 1, nics=["127.0.0.1"], secret=b"health-probe-secret-0123456789")
mon = HealthMonitor(ep)
samples = [(s.name, s.labels, s.value) for fam in HealthCollector(mon).collect() for s in fam.samples]
print(json.dumps({"snap": snap, "samples": samples}))
'''


def test_the_plugins_rails_show_in_jax_r2ccl_health_and_the_metrics(plugin, tmp_path):
    """A process that loaded the plugin (here through its v10 table, as NCCL would) and moved a
    message over a connection to itself: transport.nccl.plugin_health() (what health() adds as
    "nccl_plugin") shows both connections, their rails and bytes, the NICs and the monitor; the
    Prometheus collector lists the plugin's rails under their connections' names."""
    import json
    import sys
    so, _ = plugin
    env = dict(os.environ, R2CCL_NICS=NICS, R2CCL_MONITOR_MS="50")
    r = subprocess.run([sys.executable, "-c", HEALTH_PROBE, so], capture_output=True, text=True, timeout=120,
                       env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    snap = out["snap"]
    assert snap["plugin"] == "r2ccl" and snap["monitor"] == "on" and snap["devices"] == "fused", snap
    assert [n["name"] for n in snap["nics"]] == NICS.split(","), snap["nics"]
    conns = {r["peer_name"] for r in snap["rails"]}
    assert any(c.startswith("NCCL send connection") for c in conns) and \
        any(c.startswith("NCCL receive connection") for c in conns), conns
    assert len(snap["rails"]) == 4 and all(r["state"] == "up" for r in snap["rails"]), snap["rails"]
    sent = sum(r["tx_bytes"] for r in snap["rails"] if r["peer_name"].startswith("NCCL send"))
    assert sent >= 4096, snap["rails"]
    peers = {s[1]["peer"] for s in out["samples"] if s[0] == "r2ccl_rail_up"}
    assert conns <= peers, (conns, peers)
