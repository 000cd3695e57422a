"""Pieces every benchmark shares: message sizes ("4KiB,16MiB,256MiB"), nccl-tests style
tables, JSON results, the jax.distributed rendezvous (key-value exchange, barriers) and a
timed fault trigger. Nothing here knows a particular benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

# ---------------------------------------------------------------- sizes

_UNITS = {"": 1, "b": 1,
          "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
          "m": 1 << 20, "mib": 1 << 20, "mb": 1000 ** 2,
          "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3}


def parse_size(text: str) -> int:
    """'4KiB' -> 4096. K/M/G and KiB/MiB/GiB are binary, KB/MB/GB decimal, B or none bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 4096, 4KiB, 16MiB, 1GB)")
    n = float(m.group(1)) * _UNITS[unit]
    if n != int(n) or n < 0:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a whole number of bytes")
    return int(n)


def parse_sizes(text: str) -> list[int]:
    """'4KiB,16MiB,256MiB' -> [4096, 16777216, 268435456] (order kept, duplicates dropped)."""
    out: list[int] = []
    for part in text.split(","):
        if part.strip():
            n = parse_size(part)
            if n not in out:
                out.append(n)
    if not out:
        raise argparse.ArgumentTypeError("no sizes given")
    return out


def format_size(n: int) -> str:
    """4096 -> '4KiB'; sizes that are not a whole binary unit stay in bytes ('1000B')."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


# ---------------------------------------------------------------- tables


@dataclasses.dataclass(frozen=True)
class Column:
    """One table column: its header, the row key it shows, and how (a format spec or a function)."""
    header: str
    key: str
    fmt: str | Callable[[Any], str] = ""
    align: str = ">"


def _cell(col: Column, row: dict) -> str:
    v = row.get(col.key)
    if v is None:
        return "-"
    if callable(col.fmt):
        return col.fmt(v)
    if isinstance(v, str):
        return v
    return format(v, col.fmt)


def format_table(columns: Sequence[Column], rows: Sequence[dict], note_key: str = "note") -> str:
    """Fixed-width text table (nccl-tests style: one header line, '#'-prefixed). A row with
    `note_key` set prints the note after its cells (e.g. 'mptcp unavailable: ...')."""
    cells = [[_cell(c, r) for c in columns] for r in rows]
    widths = [max([len(c.header)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    def line(items):
        return "  ".join(format(s, f"{c.align}{w}") for s, c, w in zip(items, columns, widths))
    out = ["# " + line([c.header for c in columns])]
    for r, row in zip(rows, cells):
        text = "  " + line(row)
        if r.get(note_key):
            text += "  # " + str(r[note_key])
        out.append(text)
    return "\n".join(out)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- JSON


def stall_count(rails: Any) -> int:
    """Rails the core declared stalled (acks stopped) and failed over, summed over `rails`
    (a list of rail_stats dicts)."""
    return sum(int(r.get("stalls", 0)) for r in rails if isinstance(r, dict))


def write_json(path: str, obj: Any) -> None:
    """Writes obj as indented JSON, atomically (temporary file, then rename)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- command line


def add_common_args(p: argparse.ArgumentParser, *, default_sizes: str = "4KiB,16MiB,256MiB") -> None:
    """Arguments every multi-process benchmark takes."""
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT",
                   help="jax.distributed coordinator address (process 0 serves it)")
    p.add_argument("--num-processes", type=int, required=True, metavar="N")
    p.add_argument("--process-id", type=int, required=True, metavar="I")
    p.add_argument("--nics", default=None,
                   help="comma-separated NICs (interface names or IPv4 addresses); default R2CCL_NICS")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes(default_sizes),
                   help=f"message sizes, e.g. {default_sizes}")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size")
    p.add_argument("--json", default=None, metavar="PATH", help="write results as JSON (process 0)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="bound on every wait: bootstrap, each transfer, barriers")


# ---------------------------------------------------------------- rendezvous


class Dist:
    """jax.distributed on CPU plus small helpers over its key-value store. Every process
    calls the same sequence of barrier()/exchange() (names must match)."""

    def __init__(self, coordinator: str, num_processes: int, process_id: int, timeout: float):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax  # after JAX_PLATFORMS is set
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id,
                                   initialization_timeout=max(10, int(timeout)),
                                   shutdown_timeout_seconds=max(10, int(timeout)))
        from ..._compat.jax_kv import distributed_client
        self._jax = jax
        self.client = distributed_client()
        self.rank, self.world = process_id, num_processes
        self.timeout_ms = int(timeout * 1000)

    def set_json(self, key: str, value: Any) -> None:
        self.client.key_value_set(f"bench/{key}", json.dumps(value))

    def get_json(self, key: str, timeout: float | None = None) -> Any:
        ms = self.timeout_ms if timeout is None else int(timeout * 1000)
        return json.loads(self.client.blocking_key_value_get(f"bench/{key}", ms))

    def barrier(self, name: str) -> None:
        self.client.wait_at_barrier(f"bench/{name}", self.timeout_ms)

    def gather(self, key: str, value: Any) -> list[Any] | None:
        """Every process contributes value; process 0 gets the list by rank, others None."""
        self.set_json(f"{key}/{self.rank}", value)
        if self.rank != 0:
            return None
        return [self.get_json(f"{key}/{r}") for r in range(self.world)]

    def shutdown(self) -> None:
        try:
            self._jax.distributed.shutdown()
        except Exception as e:  # noqa: BLE001 - leaving anyway
            print(f"bench: jax.distributed.shutdown: {e}", file=sys.stderr)


# ---------------------------------------------------------------- faults


class FaultTrigger:
    """Runs a shell command (and/or a Python callable) `delay` seconds after arm(), once,
    on a thread; remembers when it fired and what the command said."""

    def __init__(self, delay: float, cmd: str | None = None, action: Callable[[], None] | None = None):
        self.delay, self.cmd, self.action = delay, cmd, action
        self.fired_unix: float | None = None
        self.rc: int | None = None
        self.output = ""
        self.error = ""
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="bench-fault", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        time.sleep(self.delay)
        self.fired_unix = time.time()
        print(f"bench: fault at +{self.delay:.3f} s: {self.cmd or ''}", file=sys.stderr, flush=True)
        try:
            if self.action is not None:
                self.action()
            if self.cmd:
                p = subprocess.run(self.cmd, shell=True, capture_output=True, text=True)
                self.rc, self.output = p.returncode, (p.stdout + p.stderr).strip()
        except Exception as e:  # noqa: BLE001 - reported in the results
            self.error = f"{type(e).__name__}: {e}"

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def summary(self) -> dict:
        return {"delay_s": self.delay, "cmd": self.cmd, "armed": self._thread is not None,
                "fired_unix": self.fired_unix, "rc": self.rc, "output": self.output[-2000:],
                "error": self.error}


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads: thread id -> (role, CPU seconds so far, user + system). The role
    is the name the thread gave itself with trailing digits dropped ("r2ccl-io3" -> "r2ccl-io",
    "r2ccl-engine"); threads named by no one go under "other". Linux's /proc; {} elsewhere."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tasks = os.listdir("/proc/self/task")
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return out
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                stat = f.read()
        except OSError:
            continue            # the thread ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()   # fields[0] is stat's 3rd field (state)
        role = name.rstrip("0123456789") if name.startswith("r2ccl-") else "other"
        out[int(t)] = (role, (int(fields[11]) + int(fields[12])) / tick)   # utime, stime
    return out


def thread_cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                     acc: dict[str, list[float]]) -> None:
    """Adds each role's CPU seconds between two thread_cpu() snapshots to acc[role] =
    [seconds, threads seen, busiest thread's seconds]."""
    per: dict[str, list[float]] = {}
    for tid, (role, cpu) in after.items():
        d = cpu - before.get(tid, (role, 0.0))[1]
        e = per.setdefault(role, [0.0, 0, 0.0])
        e[0] += d
        e[1] += 1
        e[2] = max(e[2], d)
    for role, (sec, n, top) in per.items():
        a = acc.setdefault(role, [0.0, 0, 0.0])
        a[0] += sec
        a[1] = max(a[1], n)
        a[2] += top


def per_gb(cpu: Sequence[float] | None, nbytes: float) -> float | None:
    """CPU seconds (user + system) per GB (1e9 bytes) moved."""
    return (cpu[0] + cpu[1]) / (nbytes / 1e9) if cpu and nbytes else None


def nic_ipv4(nic: str) -> str:
    """The IPv4 address of an interface name; an address is returned as is."""
    import ipaddress
    try:
        ipaddress.IPv4Address(nic)
        return nic
    except ValueError:
        pass
    import fcntl
    import socket
    import struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        r = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", nic.encode()[:15]))  # SIOCGIFADDR
        return socket.inet_ntoa(r[20:24])
    finally:
        s.close()
