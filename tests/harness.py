"""Runs a worker function on N local processes connected by jax_r2ccl (FileStore bootstrap),
each rank in its own process, bounded in time; returns each rank's result or error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPBACK4 = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]

# Fast failure detection for tests; every test bounds itself with these.
# Set by tests/test_sanitizers.py for the suites it runs again under ASan/UBSan or TSan: the
# instrumented core is several times slower, so assertions about rates and times are left
# to the plain run (tests marked `timing`, and the rate checks inside fault tests).
SANITIZED = bool(os.environ.get("R2CCL_SANITIZED_RUN"))

FAST = dict(timeout_s=10.0, bootstrap_timeout_s=30.0, heartbeat_ms=100, stall_ms=200, reprobe_ms=100, connect_timeout_ms=1000,
            crc=True)
# Instrumented processes (tests/test_sanitizers.py) run several times slower and start slower
# still: under TSan a process descheduled for 300 ms at its start read as a dead rail ("silent
# for 3xx ms (3 heartbeats missed)") and failed tests that count rail failures. The failure
# detector's clock scales with them, as the emulated guests' does (test_verbs.GUEST_TIMERS).
SANITIZED_TIMERS = dict(heartbeat_ms=300, stall_ms=600, reprobe_ms=300)
if SANITIZED:
    FAST.update(SANITIZED_TIMERS)


def _package_parent() -> str:
    import jax_r2ccl
    return os.path.dirname(os.path.dirname(os.path.abspath(jax_r2ccl.__file__)))


class RankFailed(AssertionError):
    pass


def _kill_groups(procs: list) -> None:
    for q in procs:
        if q.poll() is None:
            try:
                os.killpg(q.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_all(procs: list, timeout: float, func: str, stopped=()) -> list[str]:
    """Waits for every process (each in its own session) and returns their outputs; on the
    deadline kills the ones still running, by process group, and raises RankFailed.
    `stopped`: indices of processes that stop themselves (SIGSTOP) and never finish: they are
    killed, by process group, once every other process has exited.
    On any other way out (pytest-timeout's exception, Ctrl-C) the processes still running are
    killed by process group too: they never outlive the test. Where R2CCL_TEST_PIDFILE is set,
    each process's group id is appended to it first (bench/gpu_check.sh kills what is left of
    those groups when a whole pytest is killed)."""
    pidfile = os.environ.get("R2CCL_TEST_PIDFILE")
    if pidfile:
        with open(pidfile, "a") as f:
            f.writelines(f"{p.pid}\n" for p in procs)
    deadline = time.monotonic() + timeout
    outputs = [""] * len(procs)
    order = [i for i in range(len(procs)) if i not in stopped] + [i for i in range(len(procs)) if i in stopped]
    try:
        for i in order:
            p = procs[i]
            if i in stopped and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            try:
                outputs[i] = p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0].decode(errors="replace")
            except subprocess.TimeoutExpired:
                _kill_groups(procs)
                for j, q in enumerate(procs):
                    outputs[j] = outputs[j] or q.communicate()[0].decode(errors="replace")
                raise RankFailed(f"{func}: processes still running after {timeout} s (killed)\n" +
                                 "\n".join(f"--- process {j}\n{o[-4000:]}" for j, o in enumerate(outputs))) from None
    except BaseException:
        _kill_groups(procs)
        raise
    return outputs


def run_ranks(func: str, world: int, *, nics=None, config: dict | None = None, args: dict | None = None,
              timeout: float = 60.0, per_rank_nics: list | None = None, env: dict | None = None,
              netns: list | None = None, expect_fail: bool = False, may_die=(),
              rank_config: list | None = None, stopped=()) -> list[dict]:
    """Starts `world` processes running tests/workers.py:`func`(ep, rank, world, **args).

    Returns one dict per rank: {"ok": True, "result": ...} or {"ok": False, "error": str,
    "cause": str, "peer": int}. Raises RankFailed when a process crashes or runs past
    `timeout` (it is then killed by PID), or when a rank fails and expect_fail is False.
    `netns`: per-rank command prefix (e.g. the test bed's run_prefix(host)), optional.
    `rank_config`: per-rank settings laid over `config` (a list of dicts, one per rank).
    `stopped`: ranks that stop themselves (SIGSTOP): killed once the others have exited, and
    reported like ranks in `may_die`.
    """
    cfg = dict(FAST)
    cfg.update(config or {})
    import cluster
    if cluster.active():
        why = ("kills a rank" if may_die or stopped else "uses the local network-namespace test bed" if netns else
               "needs per-rank NIC lists" if per_rank_nics else
               "needs per-rank settings" if rank_config else None)
        return cluster.run_ranks(func, world, config=cfg, args=args or {}, timeout=timeout, expect_fail=expect_fail,
                                 unsupported=why)
    with tempfile.TemporaryDirectory(prefix="r2ccl-test-") as tmp:
        procs = []
        for rank in range(world):
            spec = {"func": func, "rank": rank, "world": world, "kv": os.path.join(tmp, "kv"),
                    "nics": (per_rank_nics[rank] if per_rank_nics else (nics or LOOPBACK4)),
                    "config": {**cfg, **(rank_config[rank] if rank_config else {})}, "args": args or {},
                    "out": os.path.join(tmp, f"out{rank}.json")}
            path = os.path.join(tmp, f"spec{rank}.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            cmd = [sys.executable, os.path.join(ROOT, "tests", "rank_main.py"), path]
            if netns:
                cmd = list(netns[rank]) + cmd
            e = dict(os.environ)   # jax_r2ccl comes from wherever this pytest imports it
            e["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_parent(), e.get("PYTHONPATH", "")]))
            e.update(env or {})
            procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           env=e, start_new_session=True), spec))
        outputs = wait_all([p for p, _ in procs], timeout, func, stopped=stopped)
        may_die = set(may_die) | set(stopped)
        results = []
        for i, (p, spec) in enumerate(procs):
            try:
                with open(spec["out"]) as f:
                    results.append(json.load(f))
            except FileNotFoundError:
                if i in may_die:
                    results.append({"ok": False, "died": True, "returncode": p.returncode, "error": "",
                                    "cause": "died", "peer": -1})
                    results[-1]["output"] = outputs[i]
                    continue
                shown = outputs[i] if os.environ.get("R2CCL_TEST_FULL_OUTPUT") else outputs[i][-3000:]
                raise RankFailed(f"{func}: rank {i} exited with {p.returncode} and no result\n{shown}") from None
            results[-1]["output"] = outputs[i]
        if not expect_fail:
            bad = [(i, r) for i, r in enumerate(results) if not r["ok"] and not r.get("died")]
            if bad:
                raise RankFailed("\n".join(f"rank {i}: {r['cause']}: {r['error']}\n{r['output'][-2000:]}"
                                           for i, r in bad))
        return results


def run_ranks_vm(func: str, *, nics: list, config: dict | None = None, args: dict | None = None,
                 timeout: float = 120.0, expect_fail: bool = False, may_die=(), on_file: dict | None = None,
                 env: dict | None = None) -> list[dict]:
    """run_ranks across the verbs test bed (jax_r2ccl/tools/testbed_vm.py): rank g runs in
    guest g, with `nics`[g] (a list per rank), bootstrapping through the guests' common share.
    `on_file`: {name: callable} run on the host (once, in a thread) when a rank creates the
    file `name` in the job's shared folder; a worker's fault_cmd can `touch` it, so the host
    cuts a NIC from outside at the moment the worker chooses. {SHARED} in a string of `args`
    is that folder's path in the guests."""
    import threading
    import uuid
    from jax_r2ccl.tools import testbed_vm as vm
    world = len(nics)
    cfg = dict(FAST)
    cfg.update(config or {})
    tag = f"job-{uuid.uuid4().hex[:12]}"
    host_dir = os.path.join(vm.common_dir(), tag)
    guest_dir = f"{vm.GUEST_COMMON}/{tag}"
    os.makedirs(host_dir)
    a = json.loads(json.dumps(args or {}).replace("{SHARED}", guest_dir))
    ids = []
    for rank in range(world):
        spec = {"func": func, "rank": rank, "world": world, "kv": f"{guest_dir}/kv", "nics": nics[rank],
                "config": cfg, "args": a, "out": f"{guest_dir}/out{rank}.json"}
        with open(os.path.join(host_dir, f"spec{rank}.json"), "w") as f:
            json.dump(spec, f)
        envs = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        cmd = (f"cd {ROOT}/tests && {envs} PYTHONPATH={_package_parent()} {sys.executable} "
               f"{ROOT}/tests/rank_main.py {guest_dir}/spec{rank}.json")
        ids.append(vm.submit(rank, cmd, timeout))
    stop = threading.Event()
    fired = {}

    def watch():
        while not stop.is_set():
            for name, fn in (on_file or {}).items():
                if name not in fired and os.path.exists(os.path.join(host_dir, name)):
                    fired[name] = time.time()
                    fn()
            stop.wait(0.005)
    w = threading.Thread(target=watch, daemon=True)
    w.start()
    outputs = []
    try:
        for rank in range(world):
            outputs.append(vm.wait(rank, ids[rank], timeout)[1])
    finally:
        stop.set()
        w.join()
    results = []
    for i in range(world):
        try:
            with open(os.path.join(host_dir, f"out{i}.json")) as f:
                results.append(json.load(f))
        except FileNotFoundError:
            if i in may_die:
                results.append({"ok": False, "died": True, "error": "", "cause": "died", "peer": -1})
            else:
                raise RankFailed(f"{func}: rank {i} (guest {i}) left no result\n{outputs[i][-3000:]}") from None
        results[-1]["output"] = outputs[i]
        results[-1]["fired"] = fired
    if not expect_fail:
        bad = [(i, r) for i, r in enumerate(results) if not r["ok"] and not r.get("died")]
        if bad:
            raise RankFailed("\n".join(f"rank {i}: {r['cause']}: {r['error']}\n{r['output'][-2000:]}" for i, r in bad))
    return results
