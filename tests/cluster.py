"""Multi-host mode of the test suite: when R2CCL_COORDINATOR, R2CCL_NUM_PROCESSES and
R2CCL_PROCESS_ID are set (or SLURM's variables, which jax.distributed reads itself), each
host runs the same pytest command and the multi-process tests run their ranks on those
hosts instead of spawning local processes: this process is rank R2CCL_PROCESS_ID, NICs come
from R2CCL_NICS, ranks meet through jax.distributed's key-value store, and every rank's
result is shared with every host so each host's assertions see all of them.

Every host must select the same tests in the same order (calls are numbered). Tests that
need more hosts than the run has, or local control of processes (killing one, the
network-namespace test bed, per-rank NIC lists, a JAX test whose device count differs from
this host's), are skipped with the reason."""

from __future__ import annotations

import json
import os

import pytest

_state: dict = {}


def active() -> bool:
    return bool(os.environ.get("R2CCL_COORDINATOR") or
                (os.environ.get("SLURM_JOB_ID") and os.environ.get("R2CCL_USE_SLURM")))


def _init():
    if _state:
        return _state
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    jax.config.update("jax_enable_x64", True)
    if os.environ.get("R2CCL_COORDINATOR"):
        jax.distributed.initialize(coordinator_address=os.environ["R2CCL_COORDINATOR"],
                                   num_processes=int(os.environ["R2CCL_NUM_PROCESSES"]),
                                   process_id=int(os.environ["R2CCL_PROCESS_ID"]), initialization_timeout=300)
    else:
        jax.distributed.initialize()   # SLURM: jax reads the job's variables
    from jax_r2ccl._compat.jax_kv import JaxStore, process_index_and_count
    rank, size = process_index_and_count()
    _state.update(rank=rank, size=size, store=JaxStore(), calls=0, jax_ready=False)
    return _state


def runtime_timeout() -> float:
    """R2CCL_TIMEOUT of the one jax_r2ccl runtime this multi-host run shares between tests."""
    from jax_r2ccl._src import runtime
    return float(runtime.current().config.timeout_s)


def _next_prefix(kind: str) -> str:
    st = _init()
    st["calls"] += 1
    return f"r2ccl-test/{kind}/{st['calls']}"


def _share(prefix: str, world: int, mine: dict | None, timeout: float) -> list[dict]:
    st = _state
    if mine is not None:
        st["store"].set(f"{prefix}/result/{st['rank']}", json.dumps(mine).encode())
    return [json.loads(st["store"].get(f"{prefix}/result/{r}", timeout).decode()) for r in range(world)]


def _check(results: list[dict], expect_fail: bool, func: str):
    if not expect_fail:
        bad = [(i, r) for i, r in enumerate(results) if not r.get("ok")]
        if bad:
            raise AssertionError("\n".join(f"rank {i} ({func}): {r.get('cause')}: {r.get('error')}" for i, r in bad))
    return results


def run_ranks(func: str, world: int, *, config: dict, args: dict, timeout: float, expect_fail: bool,
              unsupported: str | None) -> list[dict]:
    """tests/harness.run_ranks on the cluster's hosts (same return value)."""
    st = _init()
    if unsupported:
        pytest.skip(f"multi-host mode: {unsupported}")
    if world > st["size"]:
        pytest.skip(f"needs {world} hosts; this multi-host run has {st['size']}")
    prefix = _next_prefix("transport")
    mine = None
    if st["rank"] < world:
        from jax_r2ccl.transport import bootstrap
        from jax_r2ccl.config import Config
        from jax_r2ccl.errors import R2cclError
        import workers
        cfg = dict(config)
        ep = None
        try:
            ep = bootstrap.connect(st["store"], st["rank"], world, config=Config.from_env(**cfg), prefix=prefix)
            mine = {"ok": True, "result": getattr(workers, func)(ep, st["rank"], world, **args)}
        except R2cclError as e:
            mine = {"ok": False, "error": str(e), "cause": e.cause, "peer": e.peer}
        except Exception as e:  # noqa: BLE001 - reported to every host
            mine = {"ok": False, "error": f"{type(e).__name__}: {e}", "cause": "python", "peer": -1}
        finally:
            if ep is not None:
                ep.close()
        mine["output"] = ""
    return _check(_share(prefix, world, mine, timeout), expect_fail, func)


def run_jax_ranks(func: str, world: int, *, local: int, args: dict, config: dict, timeout: float,
                  expect_fail: bool, platform: str = "cpu") -> list[dict]:
    """tests/jax_rank_main.run_jax_ranks on the cluster's hosts: every host takes part."""
    st = _init()
    import jax
    if jax.default_backend() != {"cuda": "gpu"}.get(platform, platform):
        pytest.skip(f"a {platform} test; this run's JAX platform is {jax.default_backend()} (set JAX_PLATFORMS)")
    if world != st["size"] or local != jax.local_device_count():
        pytest.skip(f"needs {world} hosts x {local} devices; this run has {st['size']} x "
                    f"{jax.local_device_count()}")
    if not st["jax_ready"]:
        import jax_r2ccl
        from jax_r2ccl.config import Config
        jax_r2ccl.initialize(config=Config.from_env(**config))
        st["jax_ready"] = True
    prefix = _next_prefix("jax")
    import jax_workers
    try:
        mine = {"ok": True, "result": getattr(jax_workers, func)(st["rank"], world, local, **args)}
    except Exception as e:  # noqa: BLE001 - reported to every host
        mine = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    mine["output"] = ""
    return _check(_share(prefix, world, mine, timeout), expect_fail, func)
