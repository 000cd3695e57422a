"""Tests of jax_r2ccl/tools/testbed_vm.py, the verbs test bed: two emulated guests with two
Soft-RoCE NICs each. Every guest sees both RDMA ports ACTIVE; an RC ping-pong of real verbs
traffic crosses each rail; a NIC cut from outside turns its port DOWN and healing brings it
back; the CLI's `run` passes exit statuses through; `down` leaves no guest behind. Loads the
file by path. Root and the Debian packages named in its docstring only; skipped with the
reason otherwise. Traffic only between the two guests (UDP on 127.0.0.1 underneath)."""

import importlib.util
import os
import subprocess
import sys
import time

import pytest

import cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VM_PY = os.path.join(ROOT, "jax_r2ccl", "tools", "testbed_vm.py")
_spec = importlib.util.spec_from_file_location("r2ccl_testbed_vm_under_test", VM_PY)
vm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vm)


def _why_not():
    if cluster.active():
        return "multi-host mode: no local guests are booted"
    return vm.why_unavailable()


pytestmark = [pytest.mark.proof, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def _port_states(guest):
    rc, out = vm.run(guest, "rdma link show", 30)
    assert rc == 0, out
    return {line.split()[1].split("/")[0]: line.split()[3] for line in out.splitlines() if line.startswith("link ")}


def _until(pred, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.5)
    return pred()


def test_two_guests_soft_roce_rails_and_carrier_faults():
    t0 = time.monotonic()
    st = vm.up(2, 2)
    boot_s = time.monotonic() - t0
    try:
        print(f"guests ready in {boot_s:.1f} s")
        for g in (0, 1):
            assert _port_states(g) == {"rxe_eth0": "ACTIVE", "rxe_eth1": "ACTIVE"}
        # Real verbs traffic over each rail: an RC ping-pong of 64 KiB messages, both ends exit 0.
        for k in (0, 1):
            server = vm.submit(1, f"ibv_rc_pingpong -d rxe_eth{k} -g 1 -s 65536 -n 20", 90)
            rc, out = vm.run(0, f"for i in $(seq 1 40); do ibv_rc_pingpong -d rxe_eth{k} -g 1 -s 65536 -n 20 "
                                f"198.18.{k}.2 && exit 0; sleep 0.5; done; exit 1", 90)
            assert rc == 0 and "2621440 bytes in" in out, out
            rc, out = vm.wait(1, server, 90)
            assert rc == 0 and "2621440 bytes in" in out, out
        # A NIC cut from outside: its port goes DOWN in the guest, the other stays; heal: ACTIVE.
        vm.fail(0, 1)
        assert _until(lambda: _port_states(0)["rxe_eth1"] == "DOWN", 20), _port_states(0)
        assert _port_states(0)["rxe_eth0"] == "ACTIVE"
        vm.heal(0, 1)
        assert _until(lambda: _port_states(0)["rxe_eth1"] == "ACTIVE", 20), _port_states(0)
        # The CLI: run passes the command's status through; status lists both guests alive.
        p = subprocess.run([sys.executable, VM_PY, "run", "1", "--", "sh", "-c", "echo hi; exit 3"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 3 and p.stdout == "hi\n", (p.returncode, p.stdout, p.stderr)
        assert vm.status()["alive"] == [True, True]
    finally:
        pids = st["pids"]
        vm.down()
    assert not any(os.path.exists(f"/proc/{pid}") and vm._alive(pid) for pid in pids)
    assert vm.status() == {"up": False}


def test_bad_arguments_name_the_problem():
    p = subprocess.run([sys.executable, VM_PY, "up", "3", "2"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "GUESTS must be 2..2, not 3" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, VM_PY, "up", "2", "9"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "NICS must be 1..8, not 9" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, VM_PY, "fail", "0", "1"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "no guests are up" in p.stderr, p.stderr
