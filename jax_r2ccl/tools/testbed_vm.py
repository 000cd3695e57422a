"""`jax-r2ccl testbed vm`: the verbs test bed -- emulated guests with Soft-RoCE NICs.

  up GUESTS NICS        boot GUESTS guests (2) with NICS virtio NICs each (1..8), guest g's NIC k
                        joined point to point to the other guest's NIC k, Soft-RoCE (rxe) on
                        every NIC; waits until every guest reports every RDMA port ACTIVE.
                        Tears down any previous bed of ours first.
  down                  end our guests (by the PIDs we recorded), remove the state (idempotent)
  run [--timeout S] GUEST [--] CMD...
                        run CMD in guest GUEST (as root, in the host's root filesystem, read-only,
                        /tmp is the host's under a writable overlay); prints its output, exits with its status
  fail GUEST NIC        NIC loses carrier (from outside: the guest's monitor)
  heal GUEST NIC        NIC gets carrier back
  flap GUEST NIC DOWN_MS UP_MS COUNT
                        carrier off DOWN_MS, on UP_MS, COUNT times (from outside)
  blackhole GUEST NIC   NIC drops everything it sends, carrier and port stay up (inside: tc)
  degrade GUEST NIC RATE|base
                        NIC sends at most RATE (10mbit; inside: tc netem); base: no limit
  status                guests, their PIDs, NICs
  help                  this text

Guests: qemu under TCG (nested KVM hangs on these machines), 1 vCPU, 1.5 GiB, no disk image:
the kernel is the newest /boot/vmlinuz-* whose modules have rdma_rxe (Debian's
linux-image-amd64), a busybox initrd loads virtio and 9p, mounts this machine's "/" read-only
over 9p and chroots into it, so the guests run this machine's Python, venvs and rdma-core.
Guest g's NIC k is eth<k> with address 198.18.<k>.<g+1>/24 and RDMA device rxe_eth<k>
(RoCEv2 GID index 1); the two guests' NIC k talk over UDP on 127.0.0.1 (no host network
configuration). Commands reach a guest through its writable 9p share (an agent runs the
files put in it), so the bed needs no network into the guests either. A third share, the
state folder's common/, is /mnt/common in every guest: what the guests' processes share
(a bootstrap store, results).

Debian packages: qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers ibverbs-utils
busybox-static. Root only. Settings: TB_VM_DIR (the state folder, default
/tmp/r2ccl-testbed-vm), TB_VM_PORT (first UDP port on 127.0.0.1, default 47000).
Measured on the 2-core machines: both guests ready in about 10 s; `ibv_rc_pingpong` 82 Mbit/s
per rail; `import jax` in a guest 37-54 s.

Python: up(guests, nics), down(), run(guest, cmd, timeout) -> (status, output),
submit(guest, cmd, timeout) -> id and wait(guest, id, timeout) -> (status, output) (commands
run concurrently), fail(guest, nic), heal(guest, nic), flap(guest, nic, down_ms, up_ms, count),
blackhole(guest, nic), degrade(guest, nic, rate), status() -> dict, common_dir(),
why_unavailable() -> None or the reason."""

# Standard library only, like testbed.py: runs by path, as root.
from __future__ import annotations

import glob
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

PROG = "jax-r2ccl testbed vm"
DEFAULT_DIR = "/tmp/r2ccl-testbed-vm"
DEFAULT_PORT = 47000
GUESTS = 2                      # point-to-point NICs join exactly two guests
MAX_NICS = 8
MEMORY_MB = 1536
BOOT_TIMEOUT_S = 180.0          # under TCG a guest is ready in ~10 s on 2 cores
STOP_TIMEOUT_S = 5.0
GUEST_MODULES = ("virtio_pci", "virtio_net", "9p", "9pnet_virtio")
PACKAGES = "qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers ibverbs-utils busybox-static"
_RXE = "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"


def _load_testbed():
    """testbed.py, by path (both files run by path, as root): its errors and helpers are shared."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("r2ccl_testbed_for_vm",
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "testbed.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_tb = _load_testbed()
VmError = _tb.BedError               # a guest test-bed operation failed (the CLI exits 1)
VmUsageError = _tb.BedUsageError     # a bad argument, or not root (the CLI exits 2)
_tool = _tb._tool
_int = _tb._int


# ---------------------------------------------------------------------------------- helpers

def _dir() -> str:
    return os.environ.get("TB_VM_DIR") or DEFAULT_DIR


def common_dir() -> str:
    """The folder every guest sees as /mnt/common (read-write): files the guests share."""
    return os.path.join(_dir(), "common")


GUEST_COMMON = "/mnt/common"


def _port_base() -> int:
    raw = os.environ.get("TB_VM_PORT") or str(DEFAULT_PORT)
    if not raw.isdigit() or not 1024 <= int(raw) <= 65000:
        raise VmUsageError(f"TB_VM_PORT must be a port 1024..65000, not {raw!r}")
    return int(raw)


def _kernel() -> tuple[str, str] | None:
    """(vmlinuz path, release) of the newest installed kernel whose modules have rdma_rxe."""
    found = []
    for path in glob.glob("/boot/vmlinuz-*"):
        rel = path[len("/boot/vmlinuz-"):]
        mods = f"/lib/modules/{rel}"
        if any(os.path.exists(f"{mods}/{_RXE}{ext}") for ext in ("", ".xz", ".zst")):
            found.append((os.path.getmtime(path), path, rel))
    return (max(found)[1], max(found)[2]) if found else None


def _busybox() -> str | None:
    for path in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.exists(path):
            with open(path, "rb") as f:   # a static one: it runs alone in the initrd
                if b"ld-linux" not in f.read(1 << 20):
                    return path
    return None


def why_unavailable() -> str | None:
    """None when guests can be booted here; else the reason (for a pytest skip)."""
    if not sys.platform.startswith("linux"):
        return "the guest test bed needs Linux"
    if os.geteuid() != 0:
        return "the guest test bed needs root"
    missing = [n for n in ("qemu-system-x86_64", "modprobe") if not _tool(n)]
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: {PACKAGES})"
    if _busybox() is None:
        return f"no static busybox (Debian: busybox-static; all of: {PACKAGES})"
    if _kernel() is None:
        return f"no /boot/vmlinuz-* with rdma_rxe in its modules (Debian: linux-image-amd64; all of: {PACKAGES})"
    if not _tool("ibv_devices"):
        return f"rdma-core's tools are not installed (Debian: ibverbs-utils; all of: {PACKAGES})"
    return None


def _load(required: bool = True) -> dict | None:
    path = os.path.join(_dir(), "state.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        if required:
            raise VmError(f"no guests are up (no {path}; {PROG} up 2 NICS)") from None
        return None


def _guest(st: dict, guest) -> int:
    return _int("GUEST", guest, 0, st["guests"] - 1)


def _alive(pid: int) -> bool:
    """The PID is a qemu of ours (its command line names our state folder)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return _dir().encode() in f.read()
    except OSError:
        return False


# ---------------------------------------------------------------------------------- initrd

_INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /newroot
$B mount -t proc proc /proc; $B mount -t sysfs sys /sys; $B mount -t devtmpfs dev /dev
for m in {mods}; do $B insmod /mods/$m || echo "r2ccl-vm: insmod $m failed"; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro hostroot /newroot || $B poweroff -f
$B mount -t 9p -o trans=virtio,version=9p2000.L share /newroot/mnt || $B poweroff -f
$B mkdir -p /newroot/mnt/common
$B mount -t 9p -o trans=virtio,version=9p2000.L common /newroot/mnt/common || $B poweroff -f
for d in run var/tmp; do $B mount -t tmpfs tmpfs /newroot/$d; done
for d in proc sys dev; do $B mount --move /$d /newroot/$d; done
exec $B chroot /newroot /bin/sh /mnt/agent.sh
"""

# Runs in the guest, from its share: addresses, Soft-RoCE, then the command loop. A command
# file <id>.sh (first line "# timeout S") gives <id>.out and <id>.rc, then is renamed .done.
# Commands run concurrently (a fault command while a rank runs; one ping-pong per rail).
_AGENT = """#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
hostname r2vm{g}
# /tmp: the host's (a checkout or a venv may live there) with the guest's writes on a tmpfs
# above it (overlayfs); a plain tmpfs where overlay is not available.
modprobe overlay 2>/dev/null; mkdir -p /run/tmp-rw/upper /run/tmp-rw/work
mount -t overlay overlay -o lowerdir=/tmp,upperdir=/run/tmp-rw/upper,workdir=/run/tmp-rw/work /tmp ||
  mount -t tmpfs tmpfs /tmp
# The root filesystem is the host's, read-only: the guest's own name goes into a private copy
# of /etc/hosts bound over it (gloo and others resolve the hostname).
cp /etc/hosts /tmp/hosts && echo "198.18.0.{host} r2vm{g}" >> /tmp/hosts && mount --bind /tmp/hosts /etc/hosts
ip link set lo up
k=0
for i in $(ls /sys/class/net | grep -v '^lo$' | sort); do
  ip addr add 198.18.$k.{host}/24 dev $i && ip link set $i up; k=$((k+1))
done
modprobe rdma_rxe
for i in $(ls /sys/class/net | grep -v '^lo$' | sort); do rdma link add rxe_$i type rxe netdev $i; done
for t in $(seq 1 100); do
  n=$(rdma link show 2>/dev/null | grep -c 'state ACTIVE')
  [ "$n" -ge {nics} ] && break; sleep 0.1
done
echo "$n" > /mnt/ready.tmp && mv /mnt/ready.tmp /mnt/ready
while true; do
  for f in /mnt/cmd/*.sh; do
    [ -e "$f" ] || continue
    mv "$f" "$f.run" || continue
    t=$(head -1 "$f.run" | sed -n 's/^# timeout \\([0-9]*\\)$/\\1/p')
    ( timeout -k 2 "${{t:-60}}" sh "$f.run" > "${{f%.sh}}.out" 2>&1
      echo $? > "${{f%.sh}}.rc.tmp" && mv "${{f%.sh}}.rc.tmp" "${{f%.sh}}.rc"
      mv "$f.run" "$f.done" ) &
  done
  sleep 0.05
done
"""


def _modules(release: str) -> list[str]:
    """The guest's boot modules and their dependencies, in load order (absolute paths)."""
    paths: list[str] = []
    for m in GUEST_MODULES:
        p = subprocess.run([_tool("modprobe") or "modprobe", "-S", release, "--show-depends", m],
                           capture_output=True, text=True, timeout=20)
        if p.returncode != 0:
            raise VmError(f"modprobe --show-depends {m} for {release}: {p.stderr.strip() or p.returncode}")
        for line in p.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "insmod" and parts[1] not in paths:
                paths.append(parts[1])
    if any(p.endswith((".xz", ".zst")) for p in paths):
        raise VmError("compressed kernel modules are not supported by the initrd (busybox insmod)")
    return paths


def _cpio_entry(name: str, data: bytes, mode: int, ino: int) -> bytes:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    head = b"070701" + b"".join(f"{v:08X}".encode() for v in fields) + name.encode() + b"\0"
    pad = lambda n: b"\0" * (-n % 4)   # noqa: E731
    return head + pad(len(head)) + data + pad(len(data))


def _initrd(path: str, release: str) -> None:
    """A newc cpio of busybox, the modules and /init, gzipped."""
    mods = _modules(release)
    with open(_busybox() or "/bin/busybox", "rb") as f:
        busybox = f.read()
    entries = [("bin", b"", 0o40755), ("mods", b"", 0o40755), ("bin/busybox", busybox, 0o100755)]
    for m in mods:
        with open(m, "rb") as f:
            entries.append((f"mods/{os.path.basename(m)}", f.read(), 0o100644))
    init = _INIT.format(mods=" ".join(os.path.basename(m) for m in mods)).encode()
    entries.append(("init", init, 0o100755))
    blob = b"".join(_cpio_entry(n, d, m, i + 1) for i, (n, d, m) in enumerate(entries))
    blob += _cpio_entry("TRAILER!!!", b"", 0, 0)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(blob)


# ---------------------------------------------------------------------------------- the bed

def _udp_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def up(guests=GUESTS, nics=2) -> dict:
    """Boots the guests and waits until each reports all its RDMA ports ACTIVE."""
    guests = _int("GUESTS", guests, GUESTS, GUESTS)
    nics = _int("NICS", nics, 1, MAX_NICS)
    why = why_unavailable()
    if why:
        raise VmUsageError(why) if os.geteuid() != 0 else VmError(why)
    down()
    base = _port_base()
    ports = [base + 2 * k + g for k in range(nics) for g in range(guests)]
    busy = [p for p in ports if not _udp_free(p)]
    if busy:
        raise VmError(f"UDP port(s) {busy} on 127.0.0.1 are taken (set TB_VM_PORT)")
    vmlinuz, release = _kernel()
    d = _dir()
    os.makedirs(d, exist_ok=True)
    _initrd(os.path.join(d, "initrd.gz"), release)
    st = {"guests": guests, "nics": nics, "kernel": vmlinuz, "port_base": base, "pids": []}
    common = common_dir()
    os.makedirs(common, exist_ok=True)
    for g in range(guests):
        share = os.path.join(d, f"g{g}")
        os.makedirs(os.path.join(share, "cmd"), exist_ok=True)
        with open(os.path.join(share, "agent.sh"), "w") as f:
            f.write(_AGENT.format(g=g, host=g + 1, nics=nics))
        argv = [_tool("qemu-system-x86_64"), "-accel", "tcg,thread=multi", "-cpu", "max", "-m", str(MEMORY_MB),
                "-smp", "1", "-no-reboot", "-display", "none", "-kernel", vmlinuz, "-initrd", os.path.join(d, "initrd.gz"),
                "-append", "console=ttyS0 quiet panic=-1",
                "-fsdev", "local,id=root,path=/,security_model=none,readonly=on",
                "-device", "virtio-9p-pci,fsdev=root,mount_tag=hostroot",
                "-fsdev", f"local,id=share,path={share},security_model=none",
                "-device", "virtio-9p-pci,fsdev=share,mount_tag=share",
                "-fsdev", f"local,id=common,path={common},security_model=none",
                "-device", "virtio-9p-pci,fsdev=common,mount_tag=common",
                "-serial", f"file:{share}/serial.log", "-monitor", f"unix:{share}/monitor.sock,server,nowait",
                "-daemonize", "-pidfile", f"{share}/qemu.pid"]
        for k in range(nics):
            me, peer = base + 2 * k + g, base + 2 * k + (1 - g)
            argv += ["-netdev", f"socket,id=n{k},udp=127.0.0.1:{peer},localaddr=127.0.0.1:{me}",
                     "-device", f"virtio-net-pci,netdev=n{k},mac=52:54:00:72:{k:02x}:{g:02x}"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            down()
            raise VmError(f"qemu for guest {g}: {' '.join(p.stderr.split())[:400]}")
        with open(f"{share}/qemu.pid") as f:
            st["pids"].append(int(f.read().strip()))
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump(st, f)
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    for g in range(guests):
        ready = os.path.join(d, f"g{g}", "ready")
        while not os.path.exists(ready):
            if time.monotonic() > deadline or not _alive(st["pids"][g]):
                tail = _serial_tail(g)
                down()
                raise VmError(f"guest {g} not ready within {BOOT_TIMEOUT_S:g} s; its console ends: {tail}")
            time.sleep(0.2)
        with open(ready) as f:
            active = f.read().strip()
        if active != str(nics):
            down()
            raise VmError(f"guest {g}: {active or 0} of {nics} Soft-RoCE ports became ACTIVE")
    return st


def _serial_tail(g: int) -> str:
    try:
        with open(os.path.join(_dir(), f"g{g}", "serial.log"), errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-30:])[-4000:] or "(empty)"
    except OSError:
        return "(no console log)"


def down() -> list[int]:
    """Ends our guests and removes the state folder; returns the PIDs ended."""
    st = _load(required=False)
    ended = []
    for pid in (st or {}).get("pids", []):
        if not _alive(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        ended.append(pid)
    if os.path.isdir(_dir()):
        # The guests' consoles outlive the bed (a guest kernel's oops is read after the test
        # that met it has torn the bed down): <state folder>.last/g<G>.console.
        last = _dir().rstrip("/") + ".last"
        shutil.rmtree(last, ignore_errors=True)
        for log in glob.glob(os.path.join(_dir(), "g*", "serial.log")):
            os.makedirs(last, exist_ok=True)
            shutil.copy(log, os.path.join(last, os.path.basename(os.path.dirname(log)) + ".console"))
        shutil.rmtree(_dir(), ignore_errors=True)
    return ended


_ids = iter(range(1, 1 << 62))


def submit(guest, cmd: str, timeout: float = 60.0) -> str:
    """Starts shell text `cmd` in the guest; returns its id for wait()."""
    st = _load()
    g = _guest(st, guest)
    if not 0 < timeout <= 3600:
        raise VmUsageError(f"timeout must be 0 < S <= 3600, not {timeout}")
    cid = f"c{os.getpid()}-{next(_ids)}"
    d = os.path.join(_dir(), f"g{g}", "cmd")
    tmp = os.path.join(d, f".{cid}.tmp")
    with open(tmp, "w") as f:
        f.write(f"# timeout {int(timeout + 0.999)}\n{cmd}\n")
    os.rename(tmp, os.path.join(d, f"{cid}.sh"))
    return cid


def wait(guest, cid: str, timeout: float = 60.0) -> tuple[int, str]:
    """(exit status, output) of a submitted command; VmError if it is not done in time (the
    guest ends it by its own timeout)."""
    st = _load()
    g = _guest(st, guest)
    d = os.path.join(_dir(), f"g{g}", "cmd")
    deadline = time.monotonic() + timeout + 10
    while not os.path.exists(os.path.join(d, f"{cid}.rc")):
        if time.monotonic() > deadline:
            raise VmError(f"guest {g}: command {cid} not done within {timeout:g} s (is the guest alive?)")
        if not _alive(st["pids"][g]):
            raise VmError(f"guest {g} is gone (its console ends: {_serial_tail(g)})")
        time.sleep(0.05)
    with open(os.path.join(d, f"{cid}.rc")) as f:
        rc = int(f.read().strip() or 255)
    with open(os.path.join(d, f"{cid}.out"), errors="replace") as f:
        return rc, f.read()


def run(guest, cmd: str, timeout: float = 60.0) -> tuple[int, str]:
    """Runs shell text `cmd` in the guest; (exit status, output)."""
    return wait(guest, submit(guest, cmd, timeout), timeout)


def _monitor(g: int, line: str) -> None:
    path = os.path.join(_dir(), f"g{g}", "monitor.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5.0)
    try:
        s.connect(path)
        s.recv(4096)                      # the monitor's banner
        s.sendall(line.encode() + b"\n")
        time.sleep(0.2)
        out = s.recv(65536).decode(errors="replace")
    except OSError as e:
        raise VmError(f"guest {g}'s monitor ({path}): {e}") from None
    finally:
        s.close()
    if "Error" in out or "not found" in out:
        raise VmError(f"guest {g}'s monitor refused {line!r}: {' '.join(out.split())[-200:]}")


def _set_link(guest, nic, on: bool) -> None:
    st = _load()
    g = _guest(st, guest)
    k = _int("NIC", nic, 0, st["nics"] - 1)
    _monitor(g, f"set_link n{k} {'on' if on else 'off'}")


def fail(guest, nic) -> None:
    _set_link(guest, nic, False)


def heal(guest, nic) -> None:
    _set_link(guest, nic, True)


def flap(guest, nic, down_ms, up_ms, count) -> None:
    """Carrier off for down_ms, on for up_ms, `count` times (from outside; returns when done,
    the NIC up)."""
    down_s = _int("DOWN_MS", down_ms, 1, 60000) / 1000
    up_s = _int("UP_MS", up_ms, 1, 60000) / 1000
    for _ in range(_int("COUNT", count, 1, 1000)):
        fail(guest, nic)
        time.sleep(down_s)
        heal(guest, nic)
        time.sleep(up_s)


def _tc(guest, nic, what: str) -> None:
    st = _load()
    g = _guest(st, guest)
    k = _int("NIC", nic, 0, st["nics"] - 1)
    rc, out = run(g, f"tc qdisc del dev eth{k} root 2>/dev/null; {what.format(dev=f'eth{k}')}", 30)
    if rc != 0:
        raise VmError(f"guest {g} NIC {k}: tc failed ({rc}): {' '.join(out.split())[-300:]}")


def blackhole(guest, nic) -> None:
    """From inside the guest: the NIC keeps its carrier and its RDMA port stays ACTIVE, but
    every packet it sends is dropped (netem loss 100%)."""
    _tc(guest, nic, "tc qdisc add dev {dev} root netem loss 100%")


def degrade(guest, nic, rate: str) -> None:
    """From inside the guest: the NIC sends at most RATE (tc's units: 10mbit), or `base`: no
    limit, no loss (also ends a black hole)."""
    if rate == "base":
        _tc(guest, nic, "true")
        return
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?[kmg]?bit", str(rate)):
        raise VmUsageError(f"RATE must be like 10mbit or base, not {rate!r}")
    _tc(guest, nic, f"tc qdisc add dev {{dev}} root netem rate {rate}")


def status() -> dict:
    st = _load(required=False)
    if not st:
        return {"up": False}
    return {"up": True, "guests": st["guests"], "nics": st["nics"], "kernel": st["kernel"],
            "pids": st["pids"], "alive": [_alive(p) for p in st["pids"]],
            "addresses": [[f"198.18.{k}.{g + 1}" for k in range(st["nics"])] for g in range(st["guests"])]}


# ---------------------------------------------------------------------------------- CLI

def main(argv: list[str]) -> int:
    """`jax-r2ccl testbed vm SUBCOMMAND ...`; returns the exit status."""
    usage = f"usage: up GUESTS NICS | down | run [--timeout S] GUEST [--] CMD... | fail GUEST NIC | " \
            f"heal GUEST NIC | flap GUEST NIC DOWN_MS UP_MS COUNT | blackhole GUEST NIC | " \
            f"degrade GUEST NIC RATE|base | status (see {PROG} help)"
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if os.geteuid() != 0:
            raise VmUsageError("must run as root (emulated guests, their monitors)")
        if cmd == "up" and len(rest) == 2:
            st = up(*rest)
            print(f"{PROG}: up: {st['guests']} guests x {st['nics']} NICs (Soft-RoCE), PIDs {st['pids']}")
        elif cmd == "down" and not rest:
            print(f"{PROG}: down ({', '.join(map(str, down())) or 'no guests of ours'})")
        elif cmd in ("fail", "heal") and len(rest) == 2:
            (fail if cmd == "fail" else heal)(*rest)
            print(f"{PROG}: guest {rest[0]} NIC {rest[1]} {'down' if cmd == 'fail' else 'up'}")
        elif cmd == "flap" and len(rest) == 5:
            flap(*rest)
            print(f"{PROG}: guest {rest[0]} NIC {rest[1]} flapped {rest[4]} times")
        elif cmd == "blackhole" and len(rest) == 2:
            blackhole(*rest)
            print(f"{PROG}: guest {rest[0]} NIC {rest[1]} black-holed (tc netem loss 100%)")
        elif cmd == "degrade" and len(rest) == 3:
            degrade(*rest)
            print(f"{PROG}: guest {rest[0]} NIC {rest[1]} {rest[2]}")
        elif cmd == "status" and not rest:
            print(json.dumps(status(), indent=1))
        elif cmd == "run" and rest:
            timeout = 60.0
            if rest[0] == "--timeout" and len(rest) > 1:
                try:
                    timeout = float(rest[1])
                except ValueError:
                    raise VmUsageError(f"--timeout must be seconds, not {rest[1]!r}") from None
                rest = rest[2:]
            if len(rest) < 2 or (rest[1] == "--" and len(rest) < 3):
                raise VmUsageError("run: GUEST and CMD are needed (run GUEST [--] CMD...)")
            guest, words = rest[0], rest[2:] if rest[1] == "--" else rest[1:]
            rc, out = run(guest, shlex.join(words), timeout)
            sys.stdout.write(out)
            return rc
        else:
            raise VmUsageError(usage)
    except VmUsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except (VmError, OSError, subprocess.SubprocessError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
