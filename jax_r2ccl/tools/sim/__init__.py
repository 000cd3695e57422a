"""The large-scale simulator, pure Python + numpy, no network (docs/sim.md): the cluster model,
collective costs (the all-reduce plans' costs come from the planner itself, csrc/coll/plan.cc
through jax_r2ccl._core: one source of truth), failure traces (Poisson, published rates, files),
Megatron-style training and LLM serving workloads, fault-handling policies (crash-restart, NCCL
port failover, AdapCC-like, DejaVu-like, R2CCL, jax_r2ccl), an event-driven engine, and the
commands `python -m jax_r2ccl sim [run]|paper|plans|calibrate`."""

from .cluster import Cluster, parse_rate
from .costs import allreduce_seconds

__all__ = ["Cluster", "parse_rate", "allreduce_seconds"]
