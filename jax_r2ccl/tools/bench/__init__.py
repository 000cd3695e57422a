"""Benchmarks of jax_r2ccl, run as `python -m jax_r2ccl bench <name>`: p2p (the multi-rail
transport, with single-rail and MPTCP baselines). Shared pieces (sizes, tables, JSON,
the jax.distributed rendezvous) live in bench.common."""

BENCHMARKS = ("p2p",)
