"""One process of a multi-process JAX test, and the launcher that starts them.

`run_jax_ranks(func, world, local=...)` starts `world` processes, each with `local` CPU
devices (XLA_FLAGS=--xla_force_host_platform_device_count), joined by jax.distributed
(coordinator on 127.0.0.1 at a free port) and by jax_r2ccl (rails on 127.0.0.1 and
127.0.0.2); each runs tests/jax_workers.py:`func`(rank, world, local, **args) and returns
its JSON result. Bounded in time: processes still running at the deadline are killed by
process group. JAX's own collectives across the processes use gloo (JAX's CPU default).
"""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# R2CCL_TEST_RAILS overrides them (bench/gpu_check.sh, where a sandboxed network stack refuses
# to bind 127.0.0.2: two rails on 127.0.0.1 then, still two rails).
RAILS = os.environ.get("R2CCL_TEST_RAILS", "127.0.0.1,127.0.0.2").split(",")
# Fast failure detection; R2CCL_TIMEOUT (timeout_s) bounds a collective whose peers never come.
FAST = dict(timeout_s=20.0, bootstrap_timeout_s=60.0, heartbeat_ms=100, stall_ms=500, reprobe_ms=100,
            connect_timeout_ms=2000)
if os.environ.get("R2CCL_SANITIZED_RUN"):   # instrumented: the detector's clock scaled (harness.py)
    FAST.update(heartbeat_ms=200, stall_ms=1000, reprobe_ms=200)   # (silences declared under 1 s: test_shutdown)


from harness import RankFailed, wait_all  # noqa: E402  (one launcher for both kinds of test)


def _free_port() -> int:
    """The coordinator's port: one picked below the ephemeral range (see coordinator_port)."""
    from jax_r2ccl.tools.launch import coordinator_port
    return coordinator_port()


def _package_parent() -> str:
    import jax_r2ccl
    return os.path.dirname(os.path.dirname(os.path.abspath(jax_r2ccl.__file__)))


# jax.distributed's coordinator could not be reached at start (its port, picked free a moment
# before, was taken meanwhile, or the 2 cores were too busy to answer): nothing of the test ran.
_STARTUP_FAILURES = ("CoordinationService/RegisterTask", "Failed to bind", "Address already in use",
                     "Failed to start RPC server", "Failed to add port")


def _platform_env(platform: str, local: int, world: int) -> dict:
    """The environment of one test process: `local` CPU devices, or the GPUs with a share of
    their memory (processes that share a GPU must not each take 75% of it)."""
    if platform == "cpu":
        return {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={local}"}
    return {"JAX_PLATFORMS": platform, "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{max(0.05, 0.8 / world):.2f}"}


def run_jax_ranks(func: str, world: int, *, local: int = 1, args: dict | None = None, config: dict | None = None,
                  timeout: float = 120.0, expect_fail: bool = False, platform: str = "cpu",
                  xla_collectives: bool = True) -> list[dict]:
    """_run_jax_ranks, started once more on a fresh port when jax.distributed itself failed
    to start (see _STARTUP_FAILURES); any other failure is reported as it is.

    platform "cuda": every process sees the machine's GPUs (`local` must be their number,
    usually 1: several processes then share one GPU, each with a slice of its memory).
    xla_collectives=False: jax's multi-process helpers (jax.experimental.multihost_utils:
    process_allgather, assert_equal, which jax.device_put of a global array runs,
    broadcast_one_to_all, sync_global_devices) raise instead of running an XLA collective
    across the processes: on a GPU that is NCCL, which refuses two processes on one GPU. The
    GPU tests' workers run so on CPU to show they need none."""
    # R2CCL_TEST_RANK_TIMEOUT caps every launch (bench/gpu_check.sh: below pytest's per-test
    # timeout, so that a hung rank's stacks and output reach the test's report).
    cap = float(os.environ.get("R2CCL_TEST_RANK_TIMEOUT") or "inf")
    kw = dict(local=local, args=args, config=config, timeout=min(timeout, cap), expect_fail=expect_fail,
              platform=platform, xla_collectives=xla_collectives)
    try:
        return _run_jax_ranks(func, world, **kw)
    except RankFailed as e:
        if not any(m in str(e) for m in _STARTUP_FAILURES):
            raise
        print(f"run_jax_ranks({func}): jax.distributed did not start; once more on another port", file=sys.stderr)
        return _run_jax_ranks(func, world, **kw)


def _run_jax_ranks(func: str, world: int, *, local: int = 1, args: dict | None = None, config: dict | None = None,
                   timeout: float = 120.0, expect_fail: bool = False, platform: str = "cpu",
                   xla_collectives: bool = True) -> list[dict]:
    """Returns one dict per process: {"ok": True, "result": ..., "seconds": {...}} or
    {"ok": False, "error": str}. Raises RankFailed on a crash, a timeout, or (unless
    expect_fail) a worker exception."""
    cfg = dict(FAST)
    cfg.update(config or {})
    import cluster
    if cluster.active():
        return cluster.run_jax_ranks(func, world, local=local, args=args or {}, config=cfg, timeout=timeout,
                                     expect_fail=expect_fail, platform=platform)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="r2ccl-jax-") as tmp:
        procs = []
        for rank in range(world):
            spec = {"func": func, "rank": rank, "world": world, "local": local, "port": port, "config": cfg,
                    "args": args or {}, "out": os.path.join(tmp, f"out{rank}.json"), "platform": platform,
                    "xla_collectives": xla_collectives, "deadline_s": timeout}
            path = os.path.join(tmp, f"spec{rank}.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_parent(), HERE, env.get("PYTHONPATH", "")]))
            env.update(_platform_env(platform, local, world))
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            procs.append((subprocess.Popen([sys.executable, os.path.join(HERE, "jax_rank_main.py"), path],
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True), spec))
        outputs = wait_all([p for p, _ in procs], timeout, func)
        results = []
        for i, (p, spec) in enumerate(procs):
            try:
                with open(spec["out"]) as f:
                    results.append(json.load(f))
            except FileNotFoundError:
                raise RankFailed(f"{func}: process {i} exited with {p.returncode} and no result\n"
                                 f"{outputs[i][-4000:]}") from None
            results[-1]["output"] = outputs[i]
        if not expect_fail:
            bad = [(i, r) for i, r in enumerate(results) if not r["ok"]]
            if bad:
                raise RankFailed("\n".join(f"process {i}: {r['error']}\n{r['output'][-3000:]}" for i, r in bad))
        return results


def _refuse_xla_collectives() -> None:
    from jax.experimental import multihost_utils

    def refuse(name):
        def f(*a, **k):
            raise RuntimeError(f"jax.experimental.multihost_utils.{name} runs an XLA collective across the processes "
                               "(NCCL on a GPU machine, which refuses two processes on one GPU); build inputs "
                               "with jax.make_array_from_callback")
        return f
    for name in ("process_allgather", "assert_equal", "broadcast_one_to_all", "sync_global_devices"):
        setattr(multihost_utils, name, refuse(name))


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    # A crash prints every thread's stack; a process still running 10 s before the launcher's
    # deadline prints them too (and goes on): a hang shows where it hangs, not only that it did.
    faulthandler.enable()
    if spec.get("deadline_s"):
        faulthandler.dump_traceback_later(max(5.0, float(spec["deadline_s"]) - 10.0), exit=False)
    rank, world, local = spec["rank"], spec["world"], spec["local"]
    os.environ.update(_platform_env(spec.get("platform", "cpu"), local, world))
    out = {"ok": False, "error": ""}
    t0 = time.monotonic()
    client = None
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        if not spec.get("xla_collectives", True):
            _refuse_xla_collectives()
        coordinator = spec.get("coordinator") or f"127.0.0.1:{spec['port']}"   # the verbs guests give theirs
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=world,
                                   process_id=rank, initialization_timeout=60)
        from jax_r2ccl._compat.jax_kv import distributed_client
        client = distributed_client()
        import jax_r2ccl
        from jax_r2ccl.config import Config
        jax_r2ccl.initialize(nics=spec.get("nics") or RAILS, config=Config.from_env(**spec["config"]))
        t1 = time.monotonic()
        import jax_workers
        res = getattr(jax_workers, spec["func"])(rank, world, local, **spec["args"])
        out = {"ok": True, "result": res,
               "seconds": {"start": round(t1 - t0, 2), "work": round(time.monotonic() - t1, 2)}}
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out.update(error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        with open(spec["out"] + ".tmp", "w") as f:
            json.dump(out, f)
        os.rename(spec["out"] + ".tmp", spec["out"])
        faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    # Leave together: a process that exits first takes the coordination service (process 0)
    # or its heartbeats away from the others.
    if client is not None:
        try:
            client.wait_at_barrier("r2ccl-test-exit", 30_000)
        except Exception:  # noqa: BLE001
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
