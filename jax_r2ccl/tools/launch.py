"""Starting the processes of a local multi-process run (the demos, the benchmarks' local
mode): the command that runs the `jax-r2ccl` command line in a child, and a launcher that
waits for every child with a deadline and ends only its own children on timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping, Sequence


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
