"""jax_r2ccl's collectives for JAX: drop-in replacements of jax.lax's, with the same names,
arguments and semantics, that run over jax_r2ccl's fault-tolerant multi-NIC transport.

    jax_r2ccl.psum(x, axis_name)                      pmean, pmax, pmin: same arguments
    jax_r2ccl.all_gather(x, axis_name, *, axis=0, tiled=False)
    jax_r2ccl.psum_scatter(x, axis_name, *, scatter_dimension=0, tiled=False)
    jax_r2ccl.all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False)

Use them inside jax.shard_map (fully manual, concrete Mesh) under jax.jit, after
jax.distributed.initialize() and jax_r2ccl.initialize(), on the CPU or CUDA platform. `x` may be a
pytree; `axis_name` a mesh axis or a tuple of them (ranks in jax.lax.axis_index order; a
collective over some axes of a larger mesh runs in one group per index of the other axes).
Supported dtypes: float32, float64, float16, bfloat16, int8, uint8, int32, uint32, int64,
uint64, bool (psum sums bools as int32, like jax.lax; psum_scatter refuses bool); any other
dtype is an R2cclError when the function is traced. `axis_index_groups` is not supported
(NotImplementedError).

Typing under shard_map(check_vma=True) is jax.lax's: psum/pmax/pmin give a value invariant over
the axes, all_gather/psum_scatter/all_to_all a varying one; an input that does not vary over
the axes is cast to varying first (so psum of an invariant x is n * x). Autodiff and vmap
follow jax.lax's rules: psum is linear (its transpose is a cast to varying with check_vma,
psum without), all_gather and psum_scatter transpose into each other, all_to_all into itself
with the axes swapped; pmax/pmin have no derivative, as in jax.lax. vmap over an unnamed axis
runs the same collective on the batched array.

Data-parallel gradients, a JAX subtlety: with check_vma=True (shard_map's default), the
gradient with respect to an input that is invariant over "data" (in_specs P()) is already
summed over "data" by JAX itself — the transpose of the implicit cast to varying is jax.lax's
psum, which XLA runs, not jax_r2ccl — and pmean of that sum returns the sum, not the mean.
For per-device gradients averaged by jax_r2ccl, cast the parameters to varying before
differentiating (params = jax.lax.pcast(params, "data", to="varying"); then
jax_r2ccl.pmean(grads, "data")), or use check_vma=False, or run the step inside
jax_r2ccl.enabled(), which routes JAX's own gradient all-reduce through jax_r2ccl too.

`enabled()`, `install()`, `uninstall()`: the lowering swap (see jax_r2ccl._src.swap): plain
jax.lax collectives inside shard_map lower to jax_r2ccl for functions traced while it is on.
Collectives the SPMD partitioner inserts on its own are never rerouted; a bind the swap cannot
serve keeps jax's own lowering, counted in `swap_fallbacks()` (never an exception).

How a collective is lowered (communicator, op id, data movement): jax_r2ccl._src.lowering.
"""

from . import lowering as _lowering
from .all_to_all import all_to_all, r2ccl_all_to_all_p
from .gather_scatter import all_gather, psum_scatter, r2ccl_all_gather_p, r2ccl_reduce_scatter_p
from .reductions import (pmax, pmean, pmin, psum, r2ccl_pmax_p, r2ccl_pmin_p, r2ccl_psum_invariant_p,
                              r2ccl_psum_p)
from .swap import enabled, install, installed, uninstall
from .swap import fallbacks as swap_fallbacks

SUPPORTED_DTYPES = _lowering.SUPPORTED_DTYPES
_lowering.install_guards()

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "enabled", "install",
           "uninstall", "installed", "swap_fallbacks", "SUPPORTED_DTYPES"]
