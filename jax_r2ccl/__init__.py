"""jax_r2ccl: fault-tolerant multi-NIC collective communication for JAX.

    jax.distributed.initialize()
    jax_r2ccl.initialize()                      # opens the rails, registers the custom call
    ... jax_r2ccl.psum(x, "data") inside jax.shard_map ...   # pmean, pmax, pmin, all_gather,
                                                # psum_scatter, all_to_all: as jax.lax's
    with jax_r2ccl.enabled(): ...               # plain jax.lax collectives lower to jax_r2ccl
    jax_r2ccl.health(); jax_r2ccl.on_event(fn)  # NICs, rails, weights, bandwidth; fault events

The package by tier (an import never runs back up a tier):
  core        errors, config, _compat (private JAX APIs), _core (the compiled C++ core)
  transport   jax_r2ccl.transport: Endpoint, bootstrap, host_collectives, health — no JAX
  JAX         jax_r2ccl._src: primitives, lowering, the lowering swap, the runtime
  monitoring  jax_r2ccl.monitoring: health(), events(), on_event(), metrics
  tools       jax_r2ccl.tools: the `jax-r2ccl` command line, doctor, demos, bench, sim, testbed
Importing jax_r2ccl imports neither jax nor the compiled core; the names below load on
first use."""

from .errors import R2cclError

__version__ = "0.1.0"

_LAZY = {
    "Config": "config", "SETTINGS": "config",
    "initialize": "_src.runtime", "shutdown": "_src.runtime", "last_plan": "_src.runtime",
    "nccl_env": "transport.nccl",
    "health": "monitoring", "events": "monitoring", "on_event": "monitoring",
    **{name: "_src.ops" for name in ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter",
                                     "all_to_all", "enabled", "install", "uninstall")},
    "metrics": "monitoring.metrics",
    "swap_fallbacks": "_src.ops",
}

__all__ = ["R2cclError", "__version__", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jax_r2ccl' has no attribute {name!r}")
    import importlib
    mod = importlib.import_module(f"{__name__}.{module}")
    return mod if name == module.rsplit(".", 1)[-1] else getattr(mod, name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
