"""Starting the processes of a local multi-process run (the demos, the benchmarks' local
mode): the command that runs the `jax-r2ccl` command line in a child, and a launcher that
waits for every child with a deadline and ends only its own children on timeout."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from typing import Mapping, Sequence


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where it picks the local port of an
    outgoing connection and of a bind to port 0)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    """Whether a listener could bind `port` on every address, as jax's coordinator does
    ('[::]', dual stack: any IPv4 socket on the port refuses it)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", port))
        return True
    except OSError:
        pass
    try:   # no IPv6 here: the IPv4 wildcard is what a listener gets
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False


def coordinator_port() -> int:
    """A free port for a local run's jax.distributed coordinator, picked at random below the
    kernel's ephemeral range. A port picked by binding port 0 lies inside that range, where
    between the pick and the coordinator's bind any outgoing connection (our rails dial
    hundreds) may take it as its local port: jax then fails with "Failed to start RPC server"
    and the other processes wait out their connect timeout. Below the range only another
    listener can take it."""
    low = _ephemeral_low()
    lo, hi = max(1024, low - 12000), low
    if hi - lo >= 1000:
        for _ in range(64):
            port = random.randrange(lo, hi)
            if _bindable(port):
                return port
    with socket.socket() as s:     # a kernel with an ephemeral range that starts low
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_argv(*args: str) -> list[str]:
    """argv of a child that runs `jax-r2ccl ARGS` with this interpreter."""
    return [sys.executable, "-m", "jax_r2ccl", *map(str, args)]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: PYTHONSAFEPATH=1 keeps the current folder off its sys.path,
    so a child started inside a source checkout imports the installed package."""
    out = dict(os.environ if env is None else env)
    out["PYTHONSAFEPATH"] = "1"
    return out


def launch(cmds: Sequence[Sequence[str]], env: Mapping[str, str] | None, timeout_s: float,
           prefixes: Sequence[Sequence[str]] | None = None) -> list[int] | None:
    """Starts one process per command (each behind its prefix, e.g. the test bed's run-as-host
    argv) and waits for all. On the deadline ends the ones still running (ours, by PID) and
    returns None; else the exit codes."""
    import time
    env = child_env(env)
    procs = [subprocess.Popen([*(prefixes[i] if prefixes else ()), *c], env=env) for i, c in enumerate(cmds)]
    deadline = time.monotonic() + timeout_s
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            for q in procs:
                q.wait()
            print(f"jax-r2ccl: timed out after {timeout_s:g} s", file=sys.stderr)
            return None
    return codes
