"""`jax-r2ccl testbed`: the network test bed -- several "hosts" with several "NICs" each on
one Linux machine, from network namespaces, veth pairs, bridges and tbf rate limits.

  up HOSTS NICS RATE           build a bed (first tears down any previous bed of ours); waits
                               until every NIC has carrier; RATE like 500mbit, 1gbit, 100kbit;
                               HOSTS 2..250, NICS 1..254, HOSTS x NICS <= 1024
  down                         end the processes inside our namespaces, delete them, remove
                               the state (idempotent; fine when no bed is up)
  fail HOST NIC                take host HOST's nic<NIC> down (carrier lost at both ends)
  heal HOST NIC                bring it back up
  flap HOST NIC DOWN_MS COUNT  down for DOWN_MS, up for DOWN_MS, COUNT times (COUNT <= 10000)
  blackhole HOST NIC           carrier stays up, nothing passes in either direction (a gray
                               failure); 'degrade HOST NIC base' ends it
  degrade HOST NIC RATE|base   re-shape both directions of that NIC; base: the bed's own rate
  status [--json]              namespaces, addresses, link state, qdiscs
  vm up|down|run|fail|heal|status ...
                               the verbs test bed: two emulated guests with Soft-RoCE NICs
                               (testbed_vm.py; `vm help`)
  run [--timeout S] HOST [--] CMD...
                               run CMD as host HOST (an index or a name such as r2h0): inside
                               its namespace, with its own hostname (the namespace name) and a
                               private /etc/hosts mapping every r<HOSTS>h<i> to its nic0
                               address; exits with CMD's status. Nothing outside the new mount
                               and UTS namespaces changes.

Layout: host i is the namespace r<HOSTS>h<i>; its NIC k is the device nic<k> with address
198.18.<k>.<i+1>/24, one /24 per rail (rail k = every host's nic<k>), as in a rail-optimized
cluster. HOSTS == 2: nic<k> of r2h0 and of r2h1 are the two ends of one veth pair. HOSTS > 2:
a switch namespace r<HOSTS>sw holds one bridge per rail, br-rail<k>; every nic<k> is a veth
whose peer h<i>r<k> is a port of br-rail<k>. IPv6 is off and lo is up in every namespace.
Shaping: tbf on the egress of every nic<k> (rate RATE, burst 256kb, latency 50ms); with a
switch also on the egress of every switch port, so that a NIC is RATE in both directions.

Rule: the addresses 198.18.0.0/15 exist only inside these namespaces. Send nothing to them
from anywhere else, and nothing from the bed to anywhere else; bound every run in time.
`down` deletes only namespaces named like ^r[0-9]+(h[0-9]+|sw)$ and never touches others.

Root only (`--help` is not). Settings: --state or TB_STATE (the state file, JSON; default
/tmp/r2ccl-testbed/state.json), --burst or TB_BURST (256kb), --latency or TB_LATENCY (50ms),
--no-shape-switch or TB_SHAPE_SWITCH=0 (no tbf on the switch ports). Exit status: 0; 1 when
an ip/tc command fails (the message names it); 2 for a bad argument or when not root.

Python: up(hosts, nics, rate), down(), fail(host, nic), heal, flap, blackhole,
degrade(host, nic, rate_or_base), status() -> dict, run_prefix(host) -> argv prefix that runs
a command as that host, command(*args) -> argv that runs a subcommand of this file,
why_unavailable() -> None or the reason the bed cannot be built here."""

# Standard library only: this file must not import jax, jax_r2ccl._core or any other part of
# the package (it runs by path, as root, inside and outside the bed's namespaces).
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

PROG = "jax-r2ccl testbed"
ROOT_MESSAGE = "must run as root (network namespaces)"
DEFAULT_STATE = "/tmp/r2ccl-testbed/state.json"
DEFAULT_BURST = "256kb"
DEFAULT_LATENCY = "50ms"
NS_RE = re.compile(r"^r[0-9]+(h[0-9]+|sw)$")      # the only namespaces this file creates or deletes
HOST_NS_RE = re.compile(r"^r([0-9]+)h([0-9]+)$")
SWITCH_NS_RE = re.compile(r"^r([0-9]+)sw$")
RATE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([kmgt]i?)?(bit|bps)$", re.IGNORECASE)
SIZE_RE = re.compile(r"^[0-9]+(b|k|kb|m|mb|g|gb|kbit|mbit|gbit)?$", re.IGNORECASE)
TIME_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(s|sec|secs|ms|msec|msecs|us|usec|usecs)?$", re.IGNORECASE)
MAX_HOSTS, MAX_NICS, MAX_LINKS = 250, 254, 1024   # HOSTS x NICS <= MAX_LINKS keeps `up` within seconds
MAX_FLAPS, MAX_DOWN_MS, MAX_FLAP_S = 10000, 60000, 3600
CALL_TIMEOUT_S = 20.0          # every ip/tc call
CARRIER_TIMEOUT_S = 5.0        # `up` waits this long for carrier on every NIC
BLACKHOLE_TBF = ("rate", "8bit", "burst", "1", "latency", "1ms")   # a 1-byte bucket passes no packet
TOOLS = (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"), ("mount", "util-linux"))
# sh -c SCRIPT HOSTS_FILE NAME CMD...: bind the private hosts file, set the hostname, exec CMD
_RUN_SCRIPT = 'mount --bind "$0" /etc/hosts && printf %s "$1" > /proc/sys/kernel/hostname && shift && exec "$@"'
_THIS_FILE = os.path.abspath(__file__)


class BedError(RuntimeError):
    """A test-bed operation failed (the CLI exits 1)."""


class BedUsageError(BedError, ValueError):
    """A bad argument, or not root (the CLI exits 2)."""


# ---------------------------------------------------------------------------------- helpers

def _tool(name: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin:/usr/bin:/bin"
    return shutil.which(name, path=path)


def _exe(name: str) -> str:
    return _tool(name) or name


def _call(argv: list[str], timeout: float = CALL_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    """Runs one command, bounded by `timeout`; a failure is a BedError naming the command and
    its stderr on one line."""
    argv = [str(a) for a in argv]
    shown = shlex.join([os.path.basename(argv[0]), *argv[1:]])
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BedError(f"{shown}: '{argv[0]}' is not installed") from None
    except subprocess.TimeoutExpired:
        raise BedError(f"{shown}: no answer within {timeout:g} s") from None
    if check and p.returncode != 0:
        err = " ".join((p.stderr or p.stdout).split())[:400] or f"exit status {p.returncode}"
        raise BedError(f"{shown}: {err}")
    return p


def _ip(*args) -> subprocess.CompletedProcess:
    return _call([_exe("ip"), *args])


def _tc(*args, check: bool = True) -> subprocess.CompletedProcess:
    return _call([_exe("tc"), *args], check=check)


def _json(p: subprocess.CompletedProcess, what: str):
    try:
        return json.loads(p.stdout or "[]")
    except ValueError:
        raise BedError(f"{what}: output is not JSON") from None


def _is_root() -> bool:
    return os.geteuid() == 0


def _require_root() -> None:
    if not _is_root():
        raise BedUsageError(ROOT_MESSAGE)


def _require_tools() -> None:
    for name, package in TOOLS:
        if not _tool(name):
            raise BedError(f"'{name}' is not installed ({package})")


def why_unavailable() -> str | None:
    """None when the bed can be built here (Linux, root, ip/tc/unshare/mount present); else
    the reason, for a pytest skip."""
    if not sys.platform.startswith("linux"):
        return "the test bed needs Linux network namespaces"
    if not _is_root():
        return "the test bed needs root (network namespaces)"
    for name, package in TOOLS:
        if not _tool(name):
            return f"'{name}' is not installed ({package})"
    return None


def _int(name: str, value, lo: int, hi: int) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", text):
        raise BedUsageError(f"{name} must be a whole number {lo}..{hi}, not {str(value)!r}")
    n = int(text)
    if not lo <= n <= hi:
        raise BedUsageError(f"{name} must be {lo}..{hi}, not {n}")
    return n


def _rate(value, name: str = "RATE") -> str:
    text = str(value).strip()
    m = RATE_RE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise BedUsageError(f"{name} must be a rate such as 500mbit, 1gbit or 100kbit, not {text!r}")
    return text.lower()


def _size(value, name: str) -> str:
    text = str(value).strip()
    if not SIZE_RE.match(text) or not int(re.match(r"[0-9]+", text).group()):
        raise BedUsageError(f"{name} must be a size such as 256kb, 1mb or 65536, not {text!r}")
    return text.lower()


def _duration(value, name: str) -> str:
    text = str(value).strip()
    if not TIME_RE.match(text) or not float(re.match(r"[0-9.]+", text).group()):
        raise BedUsageError(f"{name} must be a time such as 50ms or 1s, not {text!r}")
    return text.lower()


def host_ns(hosts: int, i: int) -> str:
    return f"r{hosts}h{i}"


def switch_ns(hosts: int) -> str:
    return f"r{hosts}sw"


def state_path(state: str | None = None) -> str:
    return os.path.abspath(state or os.environ.get("TB_STATE") or DEFAULT_STATE)


def _state_dir(state: str | None) -> str:
    """The state file's folder, created if missing; refused when it is a link or belongs to
    another user (it lies in /tmp)."""
    d = os.path.dirname(state_path(state))
    os.makedirs(d, mode=0o755, exist_ok=True)
    st = os.lstat(d)
    if os.path.islink(d) or st.st_uid != os.geteuid():
        raise BedError(f"state folder {d} is a link or not ours; remove it or set TB_STATE")
    return d


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _load(state: str | None = None, required: bool = True) -> dict | None:
    path = state_path(state)
    try:
        with open(path) as f:
            st = json.load(f)
        int(st["hosts"]), int(st["nics"]), str(st["rate"])
    except FileNotFoundError:
        if not required:
            return None
        raise BedError(f"no test bed is up (no state file {path}); run: {PROG} up HOSTS NICS RATE") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BedError(f"state file {path} is unreadable ({e}); run: {PROG} down") from None
    return st


def _host(st: dict, host) -> int:
    """A host of the bed: an index or a namespace name such as r2h1."""
    hosts = int(st["hosts"])
    m = HOST_NS_RE.match(str(host).strip())
    if m:
        if int(m.group(1)) != hosts or int(m.group(2)) >= hosts:
            raise BedUsageError(f"HOST {host} is not a host of this bed (r{hosts}h0..r{hosts}h{hosts - 1})")
        return int(m.group(2))
    return _int("HOST", host, 0, hosts - 1)


def _nic(st: dict, nic) -> int:
    return _int("NIC", nic, 0, int(st["nics"]) - 1)


def _far_end(st: dict, i: int, k: int) -> tuple[str, str]:
    """The other end of host i's nic<k>: the peer host's nic<k>, or the switch port."""
    hosts = int(st["hosts"])
    if hosts == 2:
        return host_ns(hosts, 1 - i), f"nic{k}"
    return switch_ns(hosts), f"h{i}r{k}"


def _shape(ns: str, dev: str, rate: str, burst: str, latency: str) -> None:
    _tc("-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", latency)


def namespaces() -> list[str]:
    """The namespaces of ours that exist now (names like ^r[0-9]+(h[0-9]+|sw)$)."""
    p = _call([_exe("ip"), "netns", "list"])
    names = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if NS_RE.match(n))


def _links(ns: str) -> list[dict]:
    return _json(_ip("-n", ns, "-j", "addr", "show"), f"ip -n {ns} -j addr show")


def _has_carrier(link: dict) -> bool:
    return "LOWER_UP" in link.get("flags", [])


def _ready(link: dict) -> bool:
    """Carrier and an operational state of UP: the kernel sets operstate a moment after
    carrier (linkwatch), and programs that read link state (the health monitor among them)
    must find every NIC up when `up` returns."""
    return _has_carrier(link) and link.get("operstate") == "UP"


def _hosts_file(hosts: int, state: str | None = None) -> str:
    """The private /etc/hosts of the hosts of an r<hosts> bed (written when missing)."""
    path = os.path.join(_state_dir(state), f"etc-hosts.r{hosts}")
    text = "127.0.0.1 localhost\n" + "".join(f"198.18.0.{i + 1} {host_ns(hosts, i)}\n" for i in range(hosts))
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    _write(path, text)
    return path


# ---------------------------------------------------------------------------------- the API

def down(*, state: str | None = None) -> list[str]:
    """Ends the processes inside every namespace of ours (TERM, up to 1 s, then KILL, by PID),
    deletes the namespaces and removes the state. Returns the namespaces deleted."""
    _require_root()
    gone = []
    for ns in namespaces():
        _end_processes(ns)
        _call([_exe("ip"), "netns", "del", ns], check=False)
        gone.append(ns)
    left = namespaces()
    if left:
        raise BedError(f"could not delete namespace(s) {', '.join(left)}")
    path = state_path(state)
    try:
        st = _load(state, required=False)
    except BedError:      # unreadable: removed below all the same
        st = None
    hosts_file = str((st or {}).get("hosts_file") or "")
    ours = (os.path.dirname(hosts_file) == os.path.dirname(path)
            and re.fullmatch(r"etc-hosts\.r[0-9]+", os.path.basename(hosts_file)))
    for p in [path] + ([hosts_file] if ours else []):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return gone


def _pids(ns: str) -> list[int]:
    p = _call([_exe("ip"), "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]


def _end_processes(ns: str) -> None:
    pids = _pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 1.0
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _pids(ns)
        if not pids:
            return


def _mkns(ns: str) -> None:
    _ip("netns", "add", ns)
    # IPv4 only: no IPv6 link-local chatter on the shaped links
    _call([_exe("ip"), "netns", "exec", ns, "/bin/sh", "-c",
           "for f in all default; do [ ! -e /proc/sys/net/ipv6/conf/$f/disable_ipv6 ] || "
           "echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6 || exit 1; done"])
    _ip("-n", ns, "link", "set", "lo", "up")


def up(hosts, nics, rate, *, burst: str | None = None, latency: str | None = None,
       shape_switch: bool | None = None, state: str | None = None,
       carrier_timeout_s: float = CARRIER_TIMEOUT_S) -> dict:
    """Builds a bed of `hosts` hosts with `nics` NICs each at `rate` (tearing down any previous
    bed of ours first) and returns its state."""
    h = _int("HOSTS", hosts, 2, MAX_HOSTS)
    n = _int("NICS", nics, 1, MAX_NICS)
    rate = _rate(rate)
    if h * n > MAX_LINKS:
        raise BedUsageError(f"HOSTS x NICS must be at most {MAX_LINKS}, not {h * n}")
    burst = _size(burst or os.environ.get("TB_BURST") or DEFAULT_BURST, "burst (TB_BURST)")
    latency = _duration(latency or os.environ.get("TB_LATENCY") or DEFAULT_LATENCY, "latency (TB_LATENCY)")
    if shape_switch is None:
        shape_switch = os.environ.get("TB_SHAPE_SWITCH", "1").strip() not in ("0", "no", "false", "off")
    _require_root()
    _require_tools()
    down(state=state)
    hns = [host_ns(h, i) for i in range(h)]
    try:
        for ns in hns:
            _mkns(ns)
        if h == 2:
            for k in range(n):
                _ip("link", "add", "name", f"nic{k}", "netns", hns[0], "type", "veth",
                    "peer", "name", f"nic{k}", "netns", hns[1])
        else:
            sw = switch_ns(h)
            _mkns(sw)
            for k in range(n):
                _ip("-n", sw, "link", "add", f"br-rail{k}", "type", "bridge", "stp_state", "0", "forward_delay", "0")
                _ip("-n", sw, "link", "set", f"br-rail{k}", "up")
                for i in range(h):
                    port = f"h{i}r{k}"
                    _ip("link", "add", "name", f"nic{k}", "netns", hns[i], "type", "veth",
                        "peer", "name", port, "netns", sw)
                    _ip("-n", sw, "link", "set", port, "master", f"br-rail{k}", "up")
                    if shape_switch:
                        _shape(sw, port, rate, burst, latency)
        for i, ns in enumerate(hns):
            for k in range(n):
                _ip("-n", ns, "addr", "add", f"198.18.{k}.{i + 1}/24", "dev", f"nic{k}")
                _ip("-n", ns, "link", "set", f"nic{k}", "up")
                _shape(ns, f"nic{k}", rate, burst, latency)
        deadline = time.monotonic() + max(0.0, float(carrier_timeout_s))
        while True:
            missing = [f"{ns}/{link['ifname']}" for ns in hns for link in _links(ns)
                       if link.get("ifname", "").startswith("nic") and not _ready(link)]
            if not missing:
                break
            if time.monotonic() >= deadline:
                raise BedError(f"no carrier after {carrier_timeout_s:g} s on {', '.join(missing[:8])}")
            time.sleep(0.05)
        st = {"hosts": h, "nics": n, "rate": rate, "burst": burst, "latency": latency,
              "shape_switch": bool(shape_switch), "layout": "direct" if h == 2 else "switch",
              "namespaces": hns + ([] if h == 2 else [switch_ns(h)]),
              "hosts_file": _hosts_file(h, state), "created": time.time()}
        _write(state_path(state), json.dumps(st, indent=1) + "\n")
        return st
    except BaseException:
        try:
            down(state=state)
        except BedError:
            pass
        raise


def fail(host, nic, *, state: str | None = None) -> None:
    """Host `host`'s nic<nic> down (the carrier drops at both ends)."""
    _set_link(host, nic, "down", state)


def heal(host, nic, *, state: str | None = None) -> None:
    """Host `host`'s nic<nic> up again."""
    _set_link(host, nic, "up", state)


def _set_link(host, nic, how: str, state: str | None) -> tuple[str, str]:
    _require_root()
    st = _load(state)
    i, k = _host(st, host), _nic(st, nic)
    ns = host_ns(int(st["hosts"]), i)
    _ip("-n", ns, "link", "set", f"nic{k}", how)
    return ns, f"nic{k}"


def flap(host, nic, down_ms, count, *, state: str | None = None) -> None:
    """`count` times: nic<nic> of host `host` down for `down_ms` ms, then up for `down_ms` ms.
    The NIC is up at the end, also when interrupted."""
    down_ms = _int("DOWN_MS", down_ms, 1, MAX_DOWN_MS)
    count = _int("COUNT", count, 1, MAX_FLAPS)
    if 2 * down_ms * count > MAX_FLAP_S * 1000:
        raise BedUsageError(f"flapping would last {2 * down_ms * count / 1000:g} s; at most {MAX_FLAP_S} s")
    _require_root()
    st = _load(state)
    i, k = _host(st, host), _nic(st, nic)
    ns, dev = host_ns(int(st["hosts"]), i), f"nic{k}"
    try:
        for _ in range(count):
            _ip("-n", ns, "link", "set", dev, "down")
            time.sleep(down_ms / 1000)
            _ip("-n", ns, "link", "set", dev, "up")
            time.sleep(down_ms / 1000)
    finally:
        _call([_exe("ip"), "-n", ns, "link", "set", dev, "up"], check=False)


def blackhole(host, nic, *, state: str | None = None) -> None:
    """Host `host`'s nic<nic> keeps its carrier but passes nothing, in either direction: a
    token bucket of one byte on both ends (`degrade ... base` ends it)."""
    _require_root()
    st = _load(state)
    i, k = _host(st, host), _nic(st, nic)
    for ns, dev in ((host_ns(int(st["hosts"]), i), f"nic{k}"), _far_end(st, i, k)):
        _tc("-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", *BLACKHOLE_TBF)


def degrade(host, nic, rate_or_base, *, state: str | None = None) -> str:
    """Re-shapes both directions of host `host`'s nic<nic> to `rate_or_base` ("base": the
    bed's own rate, which also ends a black hole). Returns the rate set."""
    base = str(rate_or_base).strip().lower() == "base"
    rate = None if base else _rate(rate_or_base)
    _require_root()
    st = _load(state)
    i, k = _host(st, host), _nic(st, nic)
    rate = st["rate"] if base else rate
    burst, latency = st.get("burst", DEFAULT_BURST), st.get("latency", DEFAULT_LATENCY)
    _shape(host_ns(int(st["hosts"]), i), f"nic{k}", rate, burst, latency)
    far_ns, far_dev = _far_end(st, i, k)
    if base and int(st["hosts"]) > 2 and not st.get("shape_switch", True):
        _tc("-n", far_ns, "qdisc", "del", "dev", far_dev, "root", check=False)   # unshaped switch port
    else:
        _shape(far_ns, far_dev, rate, burst, latency)
    return rate


def _rate_text(bits: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale and bits % scale == 0:
            return f"{bits / scale:g}{unit}"
    return f"{bits:g}bit"


def _qdisc(q: dict | None) -> dict | None:
    if not q:
        return None
    opts = q.get("options", {}) or {}
    out = {"kind": q.get("kind")}
    if q.get("kind") == "tbf":
        rate = int(opts.get("rate64", opts.get("rate", 0)) or 0) * 8
        out.update(rate_bit=rate, rate=_rate_text(rate), burst_bytes=opts.get("burst"),
                   latency_us=opts.get("lat"), blackhole=int(opts.get("burst") or 0) < 64)
    return out


def status(*, state: str | None = None) -> dict:
    """The bed now: its state (hosts, nics, rate, ...; "up" false when there is no state file)
    and, per namespace of ours, per device: state, carrier, IPv4 addresses, master, root qdisc.
    Without root the devices are None (reading inside a namespace needs root)."""
    st = _load(state, required=False)
    out = {"up": st is not None, "state_file": state_path(state), "root": _is_root()}
    out.update({key: st.get(key) for key in ("hosts", "nics", "rate", "burst", "latency",
                                              "shape_switch", "layout", "hosts_file")} if st else {})
    out["namespaces"] = {}
    for ns in namespaces():
        if not out["root"]:
            out["namespaces"][ns] = None
            continue
        qdiscs = {q.get("dev"): q for q in _json(_tc("-n", ns, "-j", "qdisc", "show"), f"tc -n {ns} -j qdisc show")
                  if q.get("root")}
        links = {}
        for link in _links(ns):
            name = link.get("ifname")
            links[name] = {
                "state": link.get("operstate"), "up": "UP" in link.get("flags", []),
                "carrier": int(_has_carrier(link)), "master": link.get("master"),
                "addresses": [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                              if a.get("family") == "inet"],
                "qdisc": _qdisc(qdiscs.get(name))}
        out["namespaces"][ns] = {"role": "switch" if SWITCH_NS_RE.match(ns) else "host", "links": links}
    return out


def _status_text(s: dict) -> str:
    lines = []
    if s["up"]:
        layout = "direct veth pairs" if s.get("layout") == "direct" else f"switch r{s['hosts']}sw"
        lines.append(f"test bed: {s['hosts']} hosts x {s['nics']} NICs at {s['rate']} ({layout}), "
                     f"burst {s.get('burst')}, latency {s.get('latency')}; state {s['state_file']}")
    else:
        lines.append(f"no test bed is up (no state file {s['state_file']})")
    if not s["namespaces"]:
        lines.append("no namespaces of ours")
    for ns, info in s["namespaces"].items():
        if info is None:
            lines.append(f"{ns}  (run as root to see links, addresses and qdiscs)")
            continue
        lines.append(f"{ns} ({info['role']})")
        for name, link in info["links"].items():
            if name == "lo":
                continue
            q = link["qdisc"]
            if q is None:
                shaping = "no qdisc"
            elif q["kind"] == "tbf" and q["blackhole"]:
                shaping = "tbf black hole (nothing passes)"
            elif q["kind"] == "tbf":
                lat = q["latency_us"] or 0
                shaping = (f"tbf {q['rate']} burst {round((q['burst_bytes'] or 0) / 1024)}kb latency "
                           + (f"{lat / 1000:g}ms" if lat >= 1000 else f"{lat}us"))
            else:
                shaping = str(q["kind"])
            where = " ".join(link["addresses"]) or (f"port of {link['master']}" if link["master"] else "")
            lines.append(f"  {name:<10} {'up' if link['up'] else 'DOWN':<4} carrier {link['carrier']}  "
                         f"{where:<18} {shaping}")
    return "\n".join(lines) + "\n"


def _run_target(host, state: str | None) -> tuple[str, int]:
    """(namespace, HOSTS) of a `run` target: an index of the bed that is up, or a name."""
    text = str(host).strip()
    m = HOST_NS_RE.match(text) or SWITCH_NS_RE.match(text)
    if m:
        hosts = int(m.group(1))
        if m.re is HOST_NS_RE and int(m.group(2)) >= hosts:
            raise BedUsageError(f"HOST {text}: host index must be below {hosts}")
        return text, hosts
    if not re.fullmatch(r"[0-9]+", text):
        raise BedUsageError(f"HOST must be an index or a namespace name such as r2h0, not {text!r}")
    st = _load(state)
    return host_ns(int(st["hosts"]), _host(st, text)), int(st["hosts"])


def run_prefix(host, *, state: str | None = None) -> list[str]:
    """The argv prefix that runs a command as host `host` (an index or a name such as r2h0):
    ip netns exec <ns> unshare --uts --mount --propagation private /bin/sh -c ... — the command
    sees its own hostname and a private /etc/hosts. Nothing of this package is imported."""
    ns, hosts = _run_target(host, state)
    return [_exe("ip"), "netns", "exec", ns, _exe("unshare"), "--uts", "--mount", "--propagation", "private",
            "/bin/sh", "-c", _RUN_SCRIPT, _hosts_file(hosts, state), ns]


def command(*args, state: str | None = None) -> list[str]:
    """The argv that runs a subcommand of this file, e.g. command("fail", 1, 2) for a fault
    command a worker runs; runs the file by path, so the package need not be importable."""
    argv = [str(a) for a in args]
    if state and argv:
        argv[1:1] = ["--state", os.path.abspath(state)]
    return [sys.executable, "-I", _THIS_FILE, *argv]


def command_line(*args, state: str | None = None) -> str:
    """command(*args) as one shell string."""
    return shlex.join(command(*args, state=state))


# ---------------------------------------------------------------------------------- the CLI

class _Parser(argparse.ArgumentParser):
    """Argument errors as one line and exit status 2 (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _one_line_error(parser: argparse.ArgumentParser):
    def error(message: str):
        parser.exit(2, f"{parser.prog}: {message} (see --help)\n")
    return error


def add_args(parser: argparse.ArgumentParser) -> None:
    """The subcommands of `jax-r2ccl testbed` on `parser`."""
    parser.error = _one_line_error(parser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state", metavar="PATH", default=None,
                        help=f"the state file (default: $TB_STATE or {DEFAULT_STATE})")
    sub = parser.add_subparsers(dest="tb_command", metavar="SUBCOMMAND", parser_class=_Parser)

    def add(name, help_text):
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    p = add("up", "build a bed of HOSTS hosts x NICS NICs at RATE (tears down any previous bed first)")
    p.add_argument("hosts", metavar="HOSTS", help=f"2..{MAX_HOSTS}")
    p.add_argument("nics", metavar="NICS", help=f"1..{MAX_NICS}")
    p.add_argument("rate", metavar="RATE", help="e.g. 500mbit, 1gbit, 100kbit")
    p.add_argument("--burst", default=None, help=f"tbf burst (default: $TB_BURST or {DEFAULT_BURST})")
    p.add_argument("--latency", default=None, help=f"tbf latency (default: $TB_LATENCY or {DEFAULT_LATENCY})")
    p.add_argument("--no-shape-switch", action="store_true",
                   help="no tbf on the switch ports (also TB_SHAPE_SWITCH=0)")
    add("down", "end the processes inside our namespaces, delete them, remove the state")
    for name, text in (("fail", "take host HOST's nic<NIC> down"), ("heal", "bring host HOST's nic<NIC> up"),
                       ("blackhole", "host HOST's nic<NIC> keeps carrier but passes nothing (both ways)")):
        p = add(name, text)
        p.add_argument("host", metavar="HOST", help="index or name (r2h1)")
        p.add_argument("nic", metavar="NIC")
    p = add("flap", "take host HOST's nic<NIC> down for DOWN_MS, up for DOWN_MS, COUNT times")
    for arg in ("HOST", "NIC", "DOWN_MS", "COUNT"):
        p.add_argument(arg.lower(), metavar=arg)
    p = add("degrade", "re-shape both directions of host HOST's nic<NIC> to RATE (base: the bed's rate)")
    for arg in ("HOST", "NIC", "RATE"):
        p.add_argument(arg.lower(), metavar=arg)
    p = add("status", "namespaces, addresses, link state, qdiscs")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p = sub.add_parser("vm", help="the verbs test bed: emulated guests with Soft-RoCE NICs (testbed_vm.py)",
                       description="the verbs test bed: up GUESTS NICS, down, run, fail, heal, status "
                                   "(`vm help` for the whole text)", add_help=False)
    p.add_argument("vm_args", metavar="ARGS", nargs=argparse.REMAINDER)
    p = add("run", "run CMD as host HOST (own hostname, private /etc/hosts); exits with CMD's status")
    p.add_argument("--timeout", metavar="S", default=None, help="end CMD after S seconds (exit status 124)")
    p.add_argument("host", metavar="HOST", help="index or namespace name (r2h0)")
    p.add_argument("cmd", metavar="CMD", nargs=argparse.REMAINDER, help="the command and its arguments")


def _say(text: str) -> None:
    print(f"{PROG}: {text}", flush=True)


def _main_up(a) -> int:
    st = up(a.hosts, a.nics, a.rate, burst=a.burst, latency=a.latency,
            shape_switch=False if a.no_shape_switch else None, state=a.state)
    layout = "direct veth pairs" if st["layout"] == "direct" else f"switch {switch_ns(st['hosts'])}"
    _say(f"up: {st['hosts']} hosts x {st['nics']} NICs at {st['rate']} ({layout}); "
         f"hosts {', '.join(st['namespaces'][:st['hosts']])}")
    return 0


def _main_down(a) -> int:
    gone = down(state=a.state)
    _say(f"down ({', '.join(gone) or 'no namespaces of ours'})")
    return 0


def _main_link(a) -> int:
    {"fail": fail, "heal": heal, "blackhole": blackhole}[a.tb_command](a.host, a.nic, state=a.state)
    what = {"fail": "down", "heal": "up", "blackhole": "black-holed (carrier up, nothing passes)"}[a.tb_command]
    _say(f"host {a.host} nic{a.nic} {what}")
    return 0


def _main_flap(a) -> int:
    flap(a.host, a.nic, a.down_ms, a.count, state=a.state)
    _say(f"host {a.host} nic{a.nic} flapped {a.count} times ({a.down_ms} ms down, {a.down_ms} ms up)")
    return 0


def _main_degrade(a) -> int:
    rate = degrade(a.host, a.nic, a.rate, state=a.state)
    _say(f"host {a.host} nic{a.nic} at {rate} both ways")
    return 0


def _main_status(a) -> int:
    s = status(state=a.state)
    print(json.dumps(s, indent=1) if a.json else _status_text(s), end="\n" if a.json else "", flush=True)
    return 0


def _main_run(a) -> int:
    cmd = list(a.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise BedUsageError("run: CMD is missing (run HOST [--] CMD...)")
    timeout = None
    if a.timeout is not None:
        try:
            timeout = float(a.timeout)
        except ValueError:
            timeout = -1.0
        if not 0 < timeout <= 7 * 86400:
            raise BedUsageError(f"--timeout must be seconds (0 < S <= 604800), not {a.timeout!r}")
    _require_root()
    ns, _ = _run_target(a.host, a.state)
    if ns not in namespaces():
        raise BedError(f"no namespace {ns} (is the bed up? {PROG} up HOSTS NICS RATE)")
    argv = run_prefix(ns, state=a.state)
    if timeout is not None:
        argv = [_exe("timeout"), "--kill-after=5", f"{timeout:g}", *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv + cmd)     # this process becomes CMD: its exit status is ours
    except OSError as e:
        raise BedError(f"{argv[0]}: {e.strerror}") from None


def _main_vm(a) -> int:
    import importlib.util
    spec = importlib.util.spec_from_file_location("r2ccl_testbed_vm", os.path.join(os.path.dirname(_THIS_FILE),
                                                                                  "testbed_vm.py"))
    vm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vm)
    return vm.main(list(a.vm_args))


_HANDLERS = {"vm": _main_vm, "up": _main_up, "down": _main_down, "fail": _main_link, "heal": _main_link,
             "blackhole": _main_link, "flap": _main_flap, "degrade": _main_degrade,
             "status": _main_status, "run": _main_run}


def main(args: argparse.Namespace) -> int:
    """Runs the subcommand parsed by add_args's parser; returns the exit status (`run` does
    not return: the process becomes CMD)."""
    handler = _HANDLERS.get(getattr(args, "tb_command", None) or "")
    if handler is None:
        print(f"{PROG}: a subcommand is needed: {', '.join(_HANDLERS)} (see --help)", file=sys.stderr)
        return 2
    try:
        return handler(args)
    except BedUsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except (BedError, OSError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
