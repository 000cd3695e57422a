"""Tests of jax_r2ccl/tools/testbed.py, the network-namespace test bed, on this machine: 2 hosts
x 2 NICs and 3 hosts behind a switch; names, addresses, shaping, per-rail reachability, every
fault, `run`, argument errors and the root rule. Loads the file by path (needs neither jax nor the
installed package); root only, skipped with the reason otherwise. Traffic only to 198.18.x.x
inside the bed's namespaces. Every bed is torn down at the end."""

import importlib.util
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import time

import pytest

import cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED_PY = os.path.join(ROOT, "jax_r2ccl", "tools", "testbed.py")
_spec = importlib.util.spec_from_file_location("r2ccl_testbed_under_test", TESTBED_PY)
tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb)

ROOT_LINE = "jax-r2ccl testbed: must run as root (network namespaces)"
PORT = 47123           # inside the bed's namespaces only
RATE = "100mbit"



def _why_not():
    if cluster.active():
        return "multi-host mode: the hosts are given, no local test bed is built"
    return tb.why_unavailable()


def needs_bed(test):
    """Marks a test (or class) that builds a bed: skipped with the reason where it cannot."""
    return pytest.mark.testbed(pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))(test))

# a TCP echo server for `life` seconds on every address of its namespace, one thread a connection
SERVER = r"""
import socket, sys, threading, time
port, life = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(64); s.settimeout(0.2)
print("ready", flush=True)
def serve(c):
    with c:
        c.settimeout(3)
        try:
            c.sendall(b"echo:" + c.recv(64))
        except OSError:
            pass
end = time.monotonic() + life
while time.monotonic() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# connect to every address given (in parallel), send "hi", expect "echo:hi"; prints {addr: bool}
CLIENT = r"""
import json, socket, sys, threading
port, timeout = int(sys.argv[1]), float(sys.argv[2])
out = {}
def probe(dst):
    try:
        with socket.create_connection((dst, port), timeout=timeout) as c:
            c.settimeout(timeout); c.sendall(b"hi"); out[dst] = c.recv(64) == b"echo:hi"
    except OSError:
        out[dst] = False
threads = [threading.Thread(target=probe, args=(d,)) for d in sys.argv[3:]]
[t.start() for t in threads]; [t.join(timeout + 2) for t in threads]
print(json.dumps(out))
"""


def cli(*args, user=None, timeout=60):
    """The CLI as a child process (as `user` via setpriv when given)."""
    argv = tb.command(*args)
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def reach(src, dsts, timeout=1.5):
    """Which of `dsts` host `src` reaches with a TCP echo: {addr: bool}."""
    p = subprocess.run(tb.run_prefix(src) + [sys.executable, "-c", CLIENT, str(PORT), str(timeout), *dsts],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def link(ns, dev):
    p = subprocess.run(["ip", "-n", ns, "-j", "link", "show", dev], capture_output=True, text=True,
                       timeout=10, check=True)
    return json.loads(p.stdout)[0]


def carrier(ns, dev):
    return int("LOWER_UP" in link(ns, dev)["flags"])


def wait_carrier(ns, dev, want=1, within=3.0):
    end = time.monotonic() + within
    while carrier(ns, dev) != want and time.monotonic() < end:
        time.sleep(0.05)
    return carrier(ns, dev)


def tbf(ns, dev):
    p = subprocess.run(["tc", "-n", ns, "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True,
                       timeout=10, check=True)
    return next(q for q in json.loads(p.stdout) if q.get("root"))


def wait_no_foreign_bed(within=30.0):
    """Another engineer's bed uses the same names: wait for it to go, else skip (never delete it)."""
    end = time.monotonic() + within
    while tb.namespaces():
        if time.monotonic() > end:
            pytest.skip(f"another test bed is up ({', '.join(tb.namespaces())}); not touching it "
                        "(`jax-r2ccl testbed down` if it is stale)")
        time.sleep(2)


@pytest.fixture(scope="module", autouse=True)
def private_state(tmp_path_factory):
    """A state file of our own, for the API here and for the CLI children."""
    old = os.environ.get("TB_STATE")
    os.environ["TB_STATE"] = str(tmp_path_factory.mktemp("testbed") / "state.json")
    try:
        yield os.environ["TB_STATE"]
    finally:
        if old is None:
            os.environ.pop("TB_STATE", None)
        else:
            os.environ["TB_STATE"] = old


def start_servers(hosts, life=50.0):
    procs = []
    for i in range(hosts):
        p = subprocess.Popen(tb.run_prefix(i) + [sys.executable, "-c", SERVER, str(PORT), str(life)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        ready, _, _ = select.select([p.stdout], [], [], 10)
        assert ready and p.stdout.readline().strip() == "ready", p.poll()
    return procs


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def rail_peers(hosts, src, k):
    return [f"198.18.{k}.{j + 1}" for j in range(hosts) if j != src]


# ------------------------------------------------------------------------------- without a bed

def test_help_and_root_rule_as_nobody(tmp_path):
    # A user without root: this one where it is not root, else nobody (setpriv)
    nobody = 65534 if os.geteuid() == 0 else None
    if nobody is not None:
        probe = subprocess.run(["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups",
                                sys.executable, "-c", f"open({TESTBED_PY!r}).close()"],
                               capture_output=True, timeout=30) if shutil.which("setpriv") else None
        if probe is None or probe.returncode != 0:
            pytest.skip("cannot run this Python as nobody here (setpriv); the in-process check below covers it")
    h = cli("--help", user=nobody)
    assert h.returncode == 0 and "198.18.0.0/15" in h.stdout and "blackhole" in h.stdout, h.stderr
    for args in (["up", "2", "2", RATE], ["down"], ["fail", "0", "0"], ["heal", "0", "0"], ["blackhole", "0", "0"],
                 ["degrade", "0", "0", "base"], ["flap", "0", "0", "10", "1"], ["run", "0", "true"]):
        p = cli(*args, user=nobody)
        assert (p.returncode, p.stderr, p.stdout) == (2, ROOT_LINE + "\n", ""), args


def test_root_rule_in_process(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("TB_STATE", str(tmp_path / "none.json"))   # even a missing root check could do nothing here
    monkeypatch.setattr(tb.os, "geteuid", lambda: 65534)
    assert tb.why_unavailable() == "the test bed needs root (network namespaces)"
    assert tb.main(tb.build_parser().parse_args(["fail", "0", "0"])) == 2
    assert capsys.readouterr().err == ROOT_LINE + "\n"
    with pytest.raises(tb.BedUsageError):
        tb.heal(0, 0)


def test_command_runs_the_file_by_path():
    argv = tb.command("fail", 1, 2)
    assert argv[0] == sys.executable and argv[-3:] == ["fail", "1", "2"] and TESTBED_PY in argv
    assert "--state" in tb.command("down", state="/tmp/x.json")


# ------------------------------------------------------------------------------- 2 hosts x 2 NICs

def bed_with_servers(hosts: int):
    """A bed of `hosts` x 2 NICs with an echo server on every host, torn down afterwards."""
    wait_no_foreign_bed()
    try:
        st = tb.up(hosts, 2, RATE)
        servers = start_servers(hosts)
        try:
            yield st
        finally:
            stop(servers)
    finally:
        tb.down()


@pytest.fixture(scope="class")
def two_hosts():
    yield from bed_with_servers(2)


@needs_bed
@pytest.mark.usefixtures("two_hosts")
class TestTwoHosts:
    @pytest.fixture
    def bed(self, two_hosts):
        return two_hosts

    def test_layout_addresses_and_shaping(self, bed):
        assert bed["hosts"] == 2 and bed["nics"] == 2 and bed["rate"] == RATE
        assert tb.namespaces() == ["r2h0", "r2h1"]
        for i in range(2):
            ns = f"r2h{i}"
            links = {l["ifname"]: l for l in json.loads(subprocess.run(
                ["ip", "-n", ns, "-j", "addr", "show"], capture_output=True, text=True, timeout=10).stdout)}
            assert "UP" in links["lo"]["flags"]
            for k in range(2):
                addrs = [(a["family"], a["local"], a["prefixlen"]) for a in links[f"nic{k}"]["addr_info"]]
                assert addrs == [("inet", f"198.18.{k}.{i + 1}", 24)], addrs     # and no IPv6
                assert "LOWER_UP" in links[f"nic{k}"]["flags"]
                q = tbf(ns, f"nic{k}")
                assert q["kind"] == "tbf" and q["options"]["rate"] * 8 == 100e6, q
                assert abs(q["options"]["burst"] - 256 * 1024) < 1024 and q["options"]["lat"] == 50000, q

    def test_every_rail_both_ways(self, bed):
        for src in range(2):
            got = reach(src, [a for k in range(2) for a in rail_peers(2, src, k)])
            assert all(got.values()), (src, got)

    def test_fail_then_heal(self, bed):
        p = cli("fail", 1, 1)
        assert p.returncode == 0, p.stderr
        try:
            assert carrier("r2h1", "nic1") == 0 and wait_carrier("r2h0", "nic1", want=0) == 0
            assert reach(0, ["198.18.1.2", "198.18.0.2"]) == {"198.18.1.2": False, "198.18.0.2": True}
            assert reach(1, ["198.18.1.1", "198.18.0.1"]) == {"198.18.1.1": False, "198.18.0.1": True}
        finally:
            tb.heal(1, 1)
        assert wait_carrier("r2h0", "nic1") == 1 and wait_carrier("r2h1", "nic1") == 1
        assert reach(0, ["198.18.1.2"]) == {"198.18.1.2": True}

    def test_blackhole_then_base(self, bed):
        tb.blackhole(1, 1)
        try:
            assert carrier("r2h0", "nic1") == 1 and carrier("r2h1", "nic1") == 1
            nic1 = tb.status()["namespaces"]["r2h1"]["links"]["nic1"]
            assert nic1["carrier"] == 1 and nic1["qdisc"]["blackhole"], nic1
            assert reach(0, ["198.18.1.2", "198.18.0.2"]) == {"198.18.1.2": False, "198.18.0.2": True}
            assert reach(1, ["198.18.1.1"]) == {"198.18.1.1": False}
        finally:
            p = cli("degrade", 1, 1, "base")
        assert p.returncode == 0, p.stderr
        assert tbf("r2h0", "nic1")["options"]["rate"] * 8 == 100e6
        assert reach(0, ["198.18.1.2"]) == {"198.18.1.2": True}
        assert reach(1, ["198.18.1.1"]) == {"198.18.1.1": True}

    def test_degrade_both_directions_and_flap(self, bed):
        assert tb.degrade("r2h0", 0, "50mbit") == "50mbit"
        try:
            assert tbf("r2h0", "nic0")["options"]["rate"] * 8 == 50e6
            assert tbf("r2h1", "nic0")["options"]["rate"] * 8 == 50e6
        finally:
            tb.degrade(0, 0, "base")
        assert tbf("r2h1", "nic0")["options"]["rate"] * 8 == 100e6
        t = time.monotonic()
        p = cli("flap", 1, 0, 20, 3)
        assert p.returncode == 0 and time.monotonic() - t >= 0.12, p.stderr
        assert wait_carrier("r2h0", "nic0") == 1
        assert reach(0, ["198.18.0.2"]) == {"198.18.0.2": True}

    def test_run_hostname_and_hosts(self, bed):
        script = ("import socket; n = socket.gethostname(); "
                  "print(n, socket.gethostbyname('r2h1'), socket.gethostbyname(n))")
        with open("/etc/hosts") as f:
            etc_hosts = f.read()
        me = socket.gethostname()
        p = subprocess.run(tb.run_prefix(0) + [sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=30)
        assert p.stdout.split() == ["r2h0", "198.18.0.2", "198.18.0.1"], p.stderr
        p = cli("run", "r2h1", "--", sys.executable, "-c", script + "; raise SystemExit(7)")
        assert p.returncode == 7 and p.stdout.split() == ["r2h1", "198.18.0.2", "198.18.0.2"], p.stderr
        with open("/etc/hosts") as f:
            assert f.read() == etc_hosts          # nothing outside the new namespaces changed
        assert socket.gethostname() == me

    def test_status(self, bed):
        s = json.loads(cli("status", "--json").stdout)
        assert (s["up"], s["hosts"], s["nics"], s["rate"]) == (True, 2, 2, RATE)
        assert sorted(s["namespaces"]) == ["r2h0", "r2h1"]
        assert s["namespaces"]["r2h1"]["links"]["nic1"]["addresses"] == ["198.18.1.2/24"]
        text = cli("status")
        assert text.returncode == 0 and "198.18.1.2/24" in text.stdout and "tbf 100mbit" in text.stdout

    @pytest.mark.parametrize("args", [
        ["up", "1", "2", RATE], ["up", "2", "0", RATE], ["up", "2", "2", "fast"], ["up", "x", "2", RATE],
        ["up", "2", "2"], ["up", "2", "2", RATE, "--burst", "lots"], ["up", "2", "2", RATE, "--latency", "soon"],
        ["up", "2", "2", RATE, "--latency", "0"],
        ["fail", "2", "0"], ["fail", "0", "2"], ["fail", "-1", "0"], ["heal", "a", "0"], ["heal", "r3h0", "0"],
        ["blackhole", "0"], ["degrade", "0", "0", "10furlongs"], ["flap", "0", "0", "10", "10001"],
        ["flap", "0", "0", "0", "1"], ["flap", "0", "0", "ten", "1"], ["run", "0"], ["run", "nohost", "true"],
        ["run", "--timeout", "-3", "0", "true"], ["frobnicate"], [],
    ])
    def test_argument_errors_are_one_line(self, bed, args):
        before = os.stat(os.environ["TB_STATE"]).st_mtime_ns
        p = cli(*args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("jax-r2ccl testbed") and "Traceback" not in p.stderr
        assert os.stat(os.environ["TB_STATE"]).st_mtime_ns == before and tb.namespaces() == ["r2h0", "r2h1"]


# ------------------------------------------------------------------------------- 3 hosts, a switch

@pytest.fixture(scope="class")
def three_hosts_on_a_switch():
    yield from bed_with_servers(3)


@needs_bed
@pytest.mark.usefixtures("three_hosts_on_a_switch")
class TestSwitch:
    @pytest.fixture
    def bed(self, three_hosts_on_a_switch):
        return three_hosts_on_a_switch

    def test_switch_layout_and_reach(self, bed):
        assert tb.namespaces() == ["r3h0", "r3h1", "r3h2", "r3sw"]
        for k in range(2):
            assert link("r3sw", f"br-rail{k}")["operstate"] == "UP"
            for i in range(3):
                assert link("r3sw", f"h{i}r{k}")["master"] == f"br-rail{k}"
                assert tbf("r3sw", f"h{i}r{k}")["options"]["rate"] * 8 == 100e6
        for src in (0, 2):
            got = reach(src, [a for k in range(2) for a in rail_peers(3, src, k)])
            assert all(got.values()), (src, got)

    def test_switch_blackhole_one_port(self, bed):
        tb.blackhole(2, 1)
        try:
            assert carrier("r3h2", "nic1") == 1
            assert reach(0, ["198.18.1.3", "198.18.1.2", "198.18.0.3"]) == {
                "198.18.1.3": False, "198.18.1.2": True, "198.18.0.3": True}
        finally:
            tb.degrade(2, 1, "base")
        assert reach(0, ["198.18.1.3"]) == {"198.18.1.3": True}


@needs_bed
def test_down_is_idempotent_and_leaves_nothing():
    wait_no_foreign_bed()
    for _ in range(2):
        p = cli("down")
        assert p.returncode == 0, p.stderr
    assert not [n for n in tb.namespaces() if re.match(r"^r[0-9]+(h[0-9]+|sw)$", n)]
    assert not os.path.exists(os.environ["TB_STATE"])
