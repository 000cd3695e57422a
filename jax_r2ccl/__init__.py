"""jax_r2ccl: fault-tolerant multi-NIC collective communication for JAX.

    jax.distributed.initialize()
    jax_r2ccl.initialize()                      # opens the rails, registers the custom call
    ... jax_r2ccl.psum(x, "data") inside jax.shard_map ...   # pmean, pmax, pmin, all_gather,
                                                # psum_scatter, all_to_all: as jax.lax's
    with jax_r2ccl.enabled(): ...               # plain jax.lax collectives lower to jax_r2ccl
    jax_r2ccl.health(); jax_r2ccl.on_event(fn)  # NICs, rails, weights, bandwidth; fault events

The transport (jax_r2ccl.transport), its bootstrap (jax_r2ccl.bootstrap) and configuration
(jax_r2ccl.config) are importable without JAX; the JAX-facing names are loaded on first use."""

from .config import SETTINGS, Config
from .errors import R2cclError

__version__ = "0.1.0"

_RUNTIME = ("initialize", "shutdown")
_HEALTH = ("health", "events", "on_event")
_OPS = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "enabled", "install",
        "uninstall")

__all__ = ["Config", "R2cclError", "SETTINGS", "__version__", *_RUNTIME, *_HEALTH, *_OPS]


def __getattr__(name):
    # Lazy: importing jax_r2ccl must not import jax (the transport tools run without it).
    if name in _RUNTIME:
        from . import runtime
        return getattr(runtime, name)
    if name in _HEALTH:
        from . import monitor
        return getattr(monitor, name)
    if name in _OPS:
        from . import ops
        return getattr(ops, name)
    raise AttributeError(f"module 'jax_r2ccl' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
