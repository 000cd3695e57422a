"""jax_r2ccl: fault-tolerant multi-NIC collective communication for JAX.

This release holds the transport layer: a lossless multi-rail channel over TCP
(jax_r2ccl.transport), its bootstrap (jax_r2ccl.bootstrap) and configuration
(jax_r2ccl.config). The collectives and JAX integration build on it."""

from .config import SETTINGS, Config
from .errors import R2cclError

__version__ = "0.1.0"
__all__ = ["Config", "R2cclError", "SETTINGS", "__version__"]
