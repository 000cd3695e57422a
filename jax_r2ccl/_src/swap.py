"""The lowering swap: plain jax.lax collectives inside jax.shard_map lower to jax_r2ccl.

`install()` registers, for the "cpu" and "cuda" platforms, a lowering of jax.lax's own collective
primitives (psum_p, psum_invariant_p, pmax_p, pmin_p, all_gather_p, all_gather_invariant_p,
reduce_scatter_p, all_to_all_p, and on CPU ppermute_p and ragged_all_to_all_p) that emits the "r2ccl_collective"
(ragged: "r2ccl_ragged_all_to_all") custom call instead of
XLA's collective; `uninstall()` puts the previous rules back; `enabled()` does both around a
block. Platform-specific rules take precedence over jax's generic ones, and the swapped
primitives are registered cacheable=False so that each collective gets its own op id.

What this reroutes: every bind of those primitives that is lowered while the swap is on —
jax.lax.psum/pmean/pmax/pmin/all_gather/psum_scatter/all_to_all/ppermute (each pytree leaf is its own
bind; with check_vma on, psum binds psum_invariant_p), and the collectives JAX itself binds
while differentiating in a shard_map (with check_vma on, the transpose of pvary — the
gradient all-reduce of an invariant parameter — is psum_invariant_p).

axis_index_groups that split the axis into groups of one size become sub-communicators
(lowering.Comm); a shard_map manual over only some mesh axes (axis_names=, jax.vmap of a
shard_map) is served through a nested fully-manual one (lowering._through_full_manual).

The swap never makes a program fail that runs without it: a bind it cannot serve goes to
jax's own lowering (a fallback), counted by (operation, reason) in fallbacks() and logged once
per pair at R2CCL_DEBUG=INFO. The reasons: axis_index_groups of unequal sizes or that do not
cover the axis once each; an abstract mesh; an axis that is no mesh axis; a vmap axis together
with mesh axes (all_gather, psum_scatter, all_to_all, ppermute); a dtype jax_r2ccl does not
move; ppermute and ragged_all_to_all on a GPU (the staged path does not run them yet).

What it does not reroute:
  * collectives the SPMD partitioner (Shardy/GSPMD) inserts on its own: jit on sharded
    arrays outside shard_map, resharding between shardings, reductions over sharded
    dimensions, a shard_map's in/out_specs transfers. They never pass through these
    primitives;
  * pmap outside shard_map's machinery (its collectives keep XLA's lowering), the fallbacks
    above, pbroadcast, psend/precv (jax runs them on GPUs only), the *_start/*_done async
    collectives;
  * code already lowered: jax.jit caches the lowering and the executable of a function per
    argument signature, so a function traced and compiled before the swap keeps XLA's
    collectives, and one compiled inside keeps r2ccl's afterwards. Trace a function for the
    first time inside the block (or call jax.clear_caches() on entering it).
"""

from __future__ import annotations

import contextlib
import threading

from .._compat import jaxapi
from . import lowering
from .._compat.jaxapi import mlir

_lock = threading.Lock()
_saved: dict = {}        # prim -> ({platform: previous entry or None}, was uncacheable)
_depth = [0]
_fallbacks: dict = {}    # (operation, reason) -> binds lowered by jax's own rule


def fallbacks() -> dict:
    """{(operation, reason): count} of collectives the swap left to jax's own lowering since the
    process started (counted per lowering, not per run: a jit cache hit lowers nothing)."""
    with _lock:
        return dict(_fallbacks)


def _unserved(ctx, axes, axis_index_groups=None, positional_ok=False):
    """Why jax_r2ccl cannot lower this bind (jax's rule then does), or None. (A partly-manual
    shard_map's binds arrive here lowered again in a fully-manual one: lowering.register.)"""
    axis_ctx = ctx.module_context.axis_context
    mesh = jaxapi.concrete_mesh(axis_ctx.mesh)
    if mesh is None:
        return "an abstract mesh"
    names = tuple(mesh.axis_names)
    named = [a for a in axes if not isinstance(a, int)]
    if len(named) < len(axes) and not positional_ok:
        return "a vmap axis together with mesh axes" if named else "a vmap axis"
    if any(a not in names for a in named):
        return "an axis that is no mesh axis"
    if axis_index_groups is not None:
        why = lowering.index_groups_problem(lowering.axis_size(mesh, named), axis_index_groups)
        if why:
            return why
    dtype = ctx.avals_in[0].dtype
    if not lowering._supported(dtype):
        return f"dtype {dtype}"
    return None


def _fall_back(ctx, what, why, args, params):
    key = (what, why)
    with _lock:
        first = key not in _fallbacks
        _fallbacks[key] = _fallbacks.get(key, 0) + 1
    if first:
        from .. import _core
        _core.log(2, f"lowering swap: {what} with {why} is lowered by jax itself, not jax_r2ccl (counted in "
                     f"jax_r2ccl.swap_fallbacks())")
    return _original(ctx, *args, **params)


def _positional_then(ctx, arg, axes, pos_fn, what, op, index_groups=None):
    """jax's _allreduce_lowering for positional axes (vmap), then r2ccl over the named ones."""
    named = tuple(a for a in axes if not isinstance(a, int))
    pos = tuple(a for a in axes if isinstance(a, int))
    if pos:
        import numpy as np
        aval_in, = ctx.avals_in
        reducer = mlir.lower_fun(pos_fn, multiple_results=False)
        aval_out = aval_in.update(shape=np.delete(np.array(aval_in.shape, dtype=np.int64), pos))
        out, = reducer(ctx.replace(primitive=None, avals_in=[aval_in], avals_out=[aval_out]), arg, axes=pos)
        arg = out
        ctx = ctx.replace(avals_in=[aval_out])
    if not named:
        return [arg]
    return lowering.lower_all_reduce(ctx, arg, axes=named, op=op, what=what, index_groups=index_groups)


def _allreduce_rule(op, pos_fn, name):
    def rule(ctx, arg, *, axes, axis_index_groups=None):
        what = f"jax.lax.{name}"
        why = _unserved(ctx, tuple(axes), axis_index_groups, positional_ok=True)
        if why:
            return _fall_back(ctx, what, why, (arg,), dict(axes=axes, axis_index_groups=axis_index_groups))
        return _positional_then(ctx, arg, axes, pos_fn, what + " (via jax_r2ccl)", op, axis_index_groups)
    return rule


def _psum_invariant_rule(ctx, arg, *, axes):
    why = _unserved(ctx, tuple(axes), positional_ok=True)
    if why:
        return _fall_back(ctx, "jax.lax.psum", why, (arg,), dict(axes=axes))
    return lowering.lower_all_reduce(ctx, arg, axes=tuple(axes), op="sum", what="jax.lax.psum (via jax_r2ccl)")


def _all_gather_rule(ctx, x, *, all_gather_dimension, axis_name, axis_size, tiled, axis_index_groups=None, **rest):
    why = _unserved(ctx, lowering.as_axes(axis_name), axis_index_groups)
    if why:
        return _fall_back(ctx, "jax.lax.all_gather", why, (x,),
                          dict(all_gather_dimension=all_gather_dimension, axis_name=axis_name, axis_size=axis_size,
                               tiled=tiled, axis_index_groups=axis_index_groups, **rest))
    return lowering.lower_all_gather(ctx, x, all_gather_dimension=all_gather_dimension,
                                     axis_name=lowering.as_axes(axis_name), axis_size=axis_size, tiled=tiled,
                                     what="jax.lax.all_gather (via jax_r2ccl)", index_groups=axis_index_groups)


def _reduce_scatter_rule(ctx, x, *, scatter_dimension, axis_name, axis_index_groups, axis_size, tiled):
    why = _unserved(ctx, lowering.as_axes(axis_name), axis_index_groups)
    if why:
        return _fall_back(ctx, "jax.lax.psum_scatter", why, (x,),
                          dict(scatter_dimension=scatter_dimension, axis_name=axis_name,
                               axis_index_groups=axis_index_groups, axis_size=axis_size, tiled=tiled))
    return lowering.lower_reduce_scatter(ctx, x, scatter_dimension=scatter_dimension,
                                         axis_name=lowering.as_axes(axis_name), axis_size=axis_size, tiled=tiled,
                                         what="jax.lax.psum_scatter (via jax_r2ccl)", index_groups=axis_index_groups)


def _all_to_all_rule(ctx, x, *, split_axis, concat_axis, axis_name, axis_index_groups, tiled):
    why = _unserved(ctx, lowering.as_axes(axis_name), axis_index_groups)
    if why:
        return _fall_back(ctx, "jax.lax.all_to_all", why, (x,),
                          dict(split_axis=split_axis, concat_axis=concat_axis, axis_name=axis_name,
                               axis_index_groups=axis_index_groups, tiled=tiled))
    return lowering.lower_all_to_all(ctx, x, split_axis=split_axis, concat_axis=concat_axis,
                                     axis_name=lowering.as_axes(axis_name), what="jax.lax.all_to_all (via jax_r2ccl)",
                                     index_groups=axis_index_groups)


def _ppermute_rule(ctx, x, *, axis_name, perm):
    why = _unserved(ctx, lowering.as_axes(axis_name))
    if not why and "cpu" not in ctx.module_context.platforms:
        why = "a GPU (the staged path does not run ppermute yet)"
    if why:
        return _fall_back(ctx, "jax.lax.ppermute", why, (x,), dict(axis_name=axis_name, perm=perm))
    return lowering.lower_permute(ctx, x, axis_name=axis_name, perm=perm, what="jax.lax.ppermute (via jax_r2ccl)")


def _ragged_all_to_all_rule(ctx, operand, output, *offsets_and_sizes, axis_name, axis_index_groups):
    why = _unserved(ctx, lowering.as_axes(axis_name), axis_index_groups)
    if not why and "cpu" not in ctx.module_context.platforms:
        why = "a GPU (the staged path does not run ragged_all_to_all yet)"
    if why:
        return _fall_back(ctx, "jax.lax.ragged_all_to_all", why, (operand, output, *offsets_and_sizes),
                          dict(axis_name=axis_name, axis_index_groups=axis_index_groups))
    return lowering.lower_ragged_all_to_all(ctx, operand, output, *offsets_and_sizes,
                                            axis_name=lowering.as_axes(axis_name),
                                            what="jax.lax.ragged_all_to_all (via jax_r2ccl)",
                                            index_groups=axis_index_groups)


def _original(ctx, *args, **params):
    """The rule jax.lax uses for this primitive: the platform's own if it had one before the
    swap, else jax's generic one (contexts r2ccl does not serve: pmap, the fallbacks)."""
    prim = ctx.primitive
    saved = _saved.get(prim, ({}, False))[0]
    for platform in ctx.module_context.platforms:
        entry = saved.get(platform)
        if entry is not None:
            return entry.rule(ctx, *args, **params)
    return jaxapi.lowering_rule(prim, "cpu")[1].rule(ctx, *args, **params)


def _spmd_only(rule):
    """Outside shard_map (pmap), jax.lax's own lowering."""
    def wrapped(ctx, *args, **params):
        if not isinstance(ctx.module_context.axis_context, jaxapi.SPMDAxisContext):
            return _original(ctx, *args, **params)
        return rule(ctx, *args, **params)
    return wrapped


def _rules():
    from jax import lax
    rules = {
        jaxapi.psum_p: _allreduce_rule("sum", lax.reduce_sum, "psum"),
        jaxapi.psum_invariant_p: _psum_invariant_rule,
        jaxapi.pmax_p: _allreduce_rule("max", lax.reduce_max, "pmax"),
        jaxapi.pmin_p: _allreduce_rule("min", lax.reduce_min, "pmin"),
        jaxapi.all_gather_p: _all_gather_rule,
        jaxapi.reduce_scatter_p: _reduce_scatter_rule,
        jaxapi.all_to_all_p: _all_to_all_rule,
        jaxapi.ppermute_p: _ppermute_rule,
    }
    if jaxapi.all_gather_invariant_p is not None:
        rules[jaxapi.all_gather_invariant_p] = _all_gather_rule
    if jaxapi.ragged_all_to_all_p is not None:
        rules[jaxapi.ragged_all_to_all_p] = _ragged_all_to_all_rule
    return {p: _spmd_only(r) for p, r in rules.items()}


def install() -> None:
    """Makes jax.lax's collectives inside shard_map lower to jax_r2ccl from now on (until
    uninstall()). Functions compiled before keep what they were compiled with."""
    with _lock:
        _depth[0] += 1
        if _depth[0] > 1:
            return
        lowering.install_guards()
        for prim, rule in _rules().items():
            _saved[prim] = ({p: jaxapi.lowering_rule(prim, p)[0] for p in lowering.PLATFORMS},
                            jaxapi.is_uncacheable(prim))
            lowering.register(prim, rule)


def uninstall() -> None:
    """Undoes one install() (they nest); the last one restores jax.lax's own lowerings."""
    with _lock:
        if _depth[0] == 0:
            return
        _depth[0] -= 1
        if _depth[0] > 0:
            return
        for prim, (entries, uncacheable) in _saved.items():
            for platform, entry in entries.items():
                jaxapi.set_platform_lowering(prim, platform, entry)
            if not uncacheable:
                jaxapi.set_cacheable(prim)
        _saved.clear()


def installed() -> bool:
    return _depth[0] > 0


@contextlib.contextmanager
def enabled():
    """Inside the block, plain jax.lax.psum / pmean / pmax / pmin / all_gather / psum_scatter /
    all_to_all inside jax.shard_map lower to jax_r2ccl (for functions traced inside it)."""
    install()
    try:
        yield
    finally:
        uninstall()


__all__ = ["enabled", "install", "uninstall", "installed", "fallbacks"]
