"""The transport tier: a multi-rail endpoint over several NICs (`Endpoint`), its bootstrap
(`bootstrap`: address and secret exchange through a key-value store), process-level
collectives over numpy buffers (`host_collectives`) and the per-endpoint health monitor
(`health`). Importable without JAX; knows nothing of the JAX tier above it."""

from .endpoint import FAULTS, Endpoint, Request

__all__ = ["Endpoint", "Request", "FAULTS"]
