"""The process's jax_r2ccl runtime: one `Runtime` object, reached through `current()`.
`initialize()` opens the multi-rail endpoint (addresses and the job secret go through
jax.distributed's key-value store), starts the collective executor and the health monitor,
and registers the XLA FFI custom call; `shutdown()` undoes all of it, after which
`initialize()` may run again. Communicators are registered here when a collective is
lowered for a mesh. JAX tier: knows the transport tier below, nothing of the tools."""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import threading
import time
from typing import Sequence

from .. import _core
from ..config import Config
from ..errors import R2cclError
from ..transport.endpoint import Endpoint
from ..transport.health import HealthMonitor

FFI_TARGET = "r2ccl_collective"
RAGGED_FFI_TARGET = "r2ccl_ragged_all_to_all"   # jax.lax.ragged_all_to_all (CPU)


@dataclasses.dataclass
class Runtime:
    """What one initialize() opened: a handle to the process's communicator (_core's
    Communicator, which owns the executor, the monitor and the collective runtime over the
    endpoint, and closes them in order). `generation` numbers initialize/shutdown cycles, so
    a later cycle's bootstrap keys never collide with an earlier one's."""
    endpoint: Endpoint
    comm: object                     # _core.Communicator
    monitor: HealthMonitor | None    # None when R2CCL_MONITOR_MS=0
    rank: int
    world: int
    config: Config
    generation: int

    @property
    def executor(self):
        """The collective executor (_core.Collectives) the custom calls run on."""
        return self.comm.executor

    def last_plan(self) -> dict:
        return self.comm.executor.last_plan()

    def close(self, timeout: float | None = None) -> None:
        """Waits, at most `timeout` s (R2CCL_TIMEOUT), for this process's work in flight, then
        closes the communicator: the runtime, the monitor, the executor and the endpoint, in
        that order (peers are told on every rail and fail at once what they still wanted
        from this process). What is still in flight at the deadline fails with cause
        `closed`, naming the collective; nothing is left pending.

        The work waited for: every computation whose result is still alive (jit dispatch is
        asynchronous, so a training loop's last steps are usually still queued: their
        collectives have not started yet), and every jax_r2ccl collective already started
        (a custom call whose completion XLA has not got). jax.effects_barrier() waits for
        neither: the collectives carry no JAX effect (see lowering.py)."""
        deadline = time.monotonic() + (self.config.timeout_s if timeout is None else timeout)
        _wait_for_live_arrays(deadline)
        self.comm.drain(max(0.0, deadline - time.monotonic()))
        if self.monitor is not None:
            self.monitor.mark_closed()
        self.comm.close()
        self.endpoint.close()            # the Python side's part (the C++ endpoint is closed)


def _wait_for_live_arrays(deadline: float) -> None:
    """Waits until every live jax.Array is computed (or failed), at most until `deadline`.
    Polls Array.is_ready() instead of blocking: a computation blocked for good (a peer that
    never comes) must not hold shutdown past its deadline (closing the runtime then fails its
    collective, and so ends it), and no helper thread is left blocked behind it at exit."""
    import jax
    try:
        arrays = jax.live_arrays()
    except Exception:  # noqa: BLE001 - no backend: nothing was computed
        return
    for a in arrays:
        while True:
            try:
                if a.is_ready():
                    break
            except Exception:  # noqa: BLE001 - a failed computation has ended; its caller sees why
                break
            if time.monotonic() > deadline:
                return
            time.sleep(0.0005)


_lock = threading.Lock()
_current: Runtime | None = None
_generation = 0
_ffi_registered = False
_atexit_registered = False


def current() -> Runtime:
    """The runtime of this process; R2cclError when initialize() has not been called."""
    rt = _current
    if rt is None:
        raise R2cclError("jax_r2ccl.initialize() has not been called in this process")
    return rt


def is_initialized() -> bool:
    return _current is not None


def initialize(*, nics: Sequence[str] | None = None, config: Config | None = None,
               timeout: float | None = None, nccl: bool = False) -> Endpoint:
    """Call once per process after jax.distributed.initialize() (a single process needs no
    jax.distributed). Idempotent while initialized; may be called again after shutdown().
    Returns the transport Endpoint.

    nccl=True also puts every collective XLA runs in NCCL (GPU: what `jit` over sharded arrays
    inserts) on the NCCL net plugin: it sets jax_r2ccl.nccl_env() in this process's environment,
    which NCCL reads when XLA creates its first communicator. That must happen before JAX
    initializes its backends (the first jax.devices() or computation); later, it refuses."""
    global _current, _generation, _ffi_registered, _atexit_registered
    import jax
    from ..transport import bootstrap
    from .._compat.jax_kv import process_index_and_count
    if nccl:
        from ..transport import nccl as nccl_plugin
        from .._compat.jaxapi import backends_initialized
        if backends_initialized():
            raise R2cclError("initialize(nccl=True) came after JAX initialized its backends: NCCL may already have "
                             "read its environment. Call it before the first jax.devices() or computation (right "
                             "after jax.distributed.initialize()), or export the variables of "
                             "jax_r2ccl.nccl_env() in the job's launcher.")
        nccl_plugin.apply_env()
    with _lock:
        if _current is not None:
            return _current.endpoint
        config = config or Config.from_env()
        try:
            rank, world = process_index_and_count()
        except Exception:  # noqa: BLE001 - jax.distributed not initialized
            rank, world = 0, 1
        _generation += 1
        if world > 1:
            ep = bootstrap.connect_jax(nics=nics, config=config, prefix=f"r2ccl/runtime/{_generation}",
                                       timeout=timeout)
        else:
            ep = Endpoint(0, 1, nics=nics or ["127.0.0.1"], secret=Endpoint.new_secret(), config=config)
        comm = _core.Communicator(ep._ep, rank)   # installs the runtime the custom calls reach
        monitor = HealthMonitor(ep, comm.monitor) if comm.monitor is not None else None
        if not _ffi_registered:   # XLA keeps a registration for the life of the process
            for name, capsule in _core.ffi_targets().items():
                jax.ffi.register_ffi_target(name, capsule, platform="cpu")
            # The same target on the GPU platform, when the CUDA part was built (accepted by
            # XLA with no GPU backend present; it only runs where a GPU program calls it).
            for name, capsule in _core.ffi_targets_cuda().items():
                jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            _ffi_registered = True
        _current = Runtime(endpoint=ep, comm=comm, monitor=monitor, rank=rank, world=world, config=config,
                           generation=_generation)
        try:
            _prepare_gpus(jax)
        except BaseException:
            rt, _current = _current, None
            rt.close(0.0)
            raise
        if not _atexit_registered:
            # Runs before jax's own exit handlers (registered at import, so called later): the
            # runtime closes while the backends that run its computations still exist.
            atexit.register(shutdown)
            _atexit_registered = True
        return ep


def _prepare_gpus(jax) -> None:
    """Makes this process's GPUs' streams and pinned staging now, so that no collective
    allocates (or frees) pinned memory inside XLA's launch: nothing to do without the CUDA
    part, without a visible GPU, or where JAX runs on another platform."""
    # JAX's devices first: a process on CPU makes no CUDA call at all.
    ordinals = [d.local_hardware_id for d in jax.local_devices() if d.platform == "gpu"]
    if ordinals and _core.cuda_info()["built"]:
        _core.cuda_prepare(ordinals)   # logs each GPU's staging at INFO (R2CCL_DEBUG)


def shutdown(timeout: float | None = None) -> None:
    """Waits, at most `timeout` s (default R2CCL_TIMEOUT), for this process's computations and
    collectives in flight, then stops the runtime (Runtime.close). Idempotent; also runs at
    interpreter exit, and safe at any moment (work still in flight at the deadline fails with
    cause `closed`)."""
    global _current
    with _lock:
        if _current is None:
            return
        rt, _current = _current, None
        rt.close(timeout)


def last_plan() -> dict:
    """The plan (and every process's capacity) the last large all-reduce of this process ran
    with: {"plan", "shares", "capacities", "processes", "bytes", "serial"}."""
    return current().last_plan()


def register_groups(groups: list[list[int]], name: str, key: str, perm=()) -> int:
    """Registers a communicator (groups[g][r] = process of rank r of group g) under an id
    derived from `key` (identical on every process for the same mesh and axes). `perm`: a
    permute's destinations per rank (-1: none), part of `key`."""
    if _current is None:
        raise R2cclError("jax_r2ccl.initialize() must be called before a jax_r2ccl collective is compiled")
    comm_id = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)
    _core.register_comm(comm_id, groups, name, list(perm))
    return comm_id
