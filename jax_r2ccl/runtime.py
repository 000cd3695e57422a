"""The process's jax_r2ccl runtime: `initialize()` opens the multi-rail endpoint (addresses
and the job secret go through jax.distributed's key-value store), starts the collective
executor, and registers the XLA FFI custom call. Communicators are registered here too,
when a collective is lowered for a mesh."""

from __future__ import annotations

import hashlib
import threading
from typing import Sequence

from . import _core
from .config import Config
from .errors import R2cclError

FFI_TARGET = "r2ccl_collective"
_lock = threading.Lock()
_state: dict = {}
_generation = [0]   # initialize/shutdown cycles: barrier names must not repeat


def initialize(*, nics: Sequence[str] | None = None, config: Config | None = None, timeout: float | None = None):
    """Call once per process after jax.distributed.initialize() (a single process needs no
    jax.distributed). Idempotent. Returns the transport Endpoint."""
    import jax
    from . import bootstrap
    from ._compat.jax_kv import process_index_and_count
    with _lock:
        if _state:
            return _state["endpoint"]
        config = config or Config.from_env()
        try:
            rank, world = process_index_and_count()
        except Exception:  # noqa: BLE001 - jax.distributed not initialized
            rank, world = 0, 1
        _generation[0] += 1
        if world > 1:
            ep = bootstrap.connect_jax(nics=nics, config=config, prefix=f"r2ccl/runtime/{_generation[0]}",
                                       timeout=timeout)
        else:
            from .transport import Endpoint
            ep = Endpoint(0, 1, nics=nics or ["127.0.0.1"], secret=Endpoint.new_secret(), config=config)
        ex = _core.Collectives(ep._ep, rank)
        _core.runtime_install(ep._ep, ex, rank, float(config.timeout_s))
        monitor = None
        if config.monitor_ms > 0:
            from .monitor import HealthMonitor
            monitor = HealthMonitor(ep)
            ex.set_capacity_source(monitor._mon)   # the all-reduce planner's input
        if not _state.get("ffi_registered"):
            for name, capsule in _core.ffi_targets().items():
                jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        _state.update(endpoint=ep, executor=ex, monitor=monitor, rank=rank, world=world, config=config,
                      ffi_registered=True)
        return ep


def last_plan() -> dict:
    """The plan (and every process's capacity) the last large all-reduce of this process ran
    with: {"plan", "shares", "capacities", "processes", "bytes", "serial"}."""
    if "executor" not in _state:
        raise R2cclError("jax_r2ccl.initialize() has not been called in this process")
    return _state["executor"].last_plan()


def is_initialized() -> bool:
    return "endpoint" in _state


def shutdown(timeout: float | None = None) -> None:
    """Waits for this process's dispatched computations (jax.effects_barrier) and for every
    process to get here, then stops the runtime. Idempotent."""
    with _lock:
        if "endpoint" not in _state:
            return
        import jax
        try:
            jax.effects_barrier()
        except Exception:  # noqa: BLE001 - a failed collective was already reported to its caller
            pass
        if _state.get("world", 1) > 1:
            try:
                from ._compat.jax_kv import distributed_client
                wait_s = _state["config"].timeout_s if timeout is None else timeout
                distributed_client().wait_at_barrier(f"r2ccl/runtime/shutdown/{_generation[0]}", int(wait_s * 1000))
            except Exception:  # noqa: BLE001 - a peer that is gone must not hold this one
                pass
        _core.runtime_uninstall()
        if _state.get("monitor") is not None:
            _state["executor"].set_capacity_source(None)
            _state["monitor"].close()
        _state["executor"].close()
        _state["endpoint"].close()
        for k in ("endpoint", "executor", "monitor", "rank", "world", "config"):
            _state.pop(k, None)


def process_index() -> int:
    return _state["rank"] if _state else 0


def register_groups(groups: list[list[int]], name: str, key: str) -> int:
    """Registers a communicator (groups[g][r] = process of rank r of group g) under an id
    derived from `key` (identical on every process for the same mesh and axes)."""
    if not is_initialized():
        raise R2cclError("jax_r2ccl.initialize() must be called before a jax_r2ccl collective is compiled")
    comm_id = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)
    _core.register_comm(comm_id, groups, name)
    return comm_id
