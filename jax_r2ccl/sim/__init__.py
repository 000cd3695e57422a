"""The large-scale simulator (issue 6), pure Python + numpy, no network. So far: the cluster
model, the collective cost model (the all-reduce plans' costs come from the planner itself,
csrc/coll/plan.cc through jax_r2ccl._core: one source of truth), and calibration against the
test bed's benchmark JSON (`python -m jax_r2ccl sim calibrate`). Not yet: failure traces,
workloads, policies, the `sim` run command (see the issue)."""

from .cluster import Cluster, parse_rate
from .costs import allreduce_seconds

__all__ = ["Cluster", "parse_rate", "allreduce_seconds"]
