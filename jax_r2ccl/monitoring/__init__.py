"""Health and metrics of this process's runtime: `jax_r2ccl.health()` (a snapshot of every NIC
and rail), `jax_r2ccl.events()` / `jax_r2ccl.on_event(fn)` (link, failure, recovery and
degradation events as they happen) and `metrics` (Prometheus). They read the monitor that
`jax_r2ccl.initialize()` started (unless R2CCL_MONITOR_MS=0); for an endpoint of your own,
use jax_r2ccl.transport.health.HealthMonitor."""

from __future__ import annotations

from typing import Callable

from .._src import runtime
from ..errors import R2cclError
from ..transport import nccl
from ..transport.health import HealthMonitor, Subscription


def runtime_monitor() -> HealthMonitor:
    """The runtime's health monitor, or an R2cclError that says why there is none."""
    mon = runtime.current().monitor
    if mon is None:
        raise R2cclError("the health monitor is off (R2CCL_MONITOR_MS=0)")
    return mon


def health() -> dict:
    """A snapshot of this process's NICs and rails (see HealthMonitor.snapshot). When NCCL
    loaded the net plugin into this process, "nccl_plugin" holds the plugin's own snapshot: its
    rails per NCCL connection, its NICs and its latest events (transport.nccl.plugin_health)."""
    snap = runtime_monitor().snapshot()
    plugin = nccl.plugin_health()
    if plugin is not None:
        snap["nccl_plugin"] = plugin
    return snap


def events(after: int = 0, timeout: float = 0.0) -> list[dict]:
    """This process's health events with seq > after (see HealthMonitor.events)."""
    return runtime_monitor().events(after, timeout)


def on_event(fn: Callable[[dict], None]) -> Subscription:
    """Calls fn(event) for every health event of this process from now on."""
    return runtime_monitor().on_event(fn)
