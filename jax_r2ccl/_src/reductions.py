"""psum, pmean, pmax, pmin: all-reduce over mesh axes, typed, differentiated and batched as
jax.lax's are.

Primitives (each mirrors one of jax.lax's, with the same parameters and typing rule):
  r2ccl_psum            like psum_p: no varying-axes checks (shard_map check_vma=False);
                        transpose = psum of the cotangent (psum is psum + pbroadcast);
  r2ccl_psum_invariant  like psum_invariant_p (check_vma=True): varying -> invariant over the
                        axes; transpose = pvary of the cotangent (no communication);
  r2ccl_pmax, r2ccl_pmin  like pmax_p/pmin_p; like jax.lax, no differentiation rule.
An input not varying over the axes is first cast to varying (pvary, what
jax.lax.pcast(x, axes, to="varying") does), as jax.lax.psum does, so psum of an invariant value
is n * x.
"""

from __future__ import annotations

import numpy as np
from jax import tree_util

from ..errors import R2cclError
from .._compat import jaxapi
from . import lowering
from .._compat.jaxapi import ad, batching




def _impl(name):
    def impl(*args, **params):
        raise R2cclError(f"jax_r2ccl.{name} must be called inside jax.shard_map (under jax.jit)")
    return impl


r2ccl_psum_p = jaxapi.Primitive("r2ccl_psum")
r2ccl_psum_invariant_p = jaxapi.Primitive("r2ccl_psum_invariant")
r2ccl_pmax_p = jaxapi.Primitive("r2ccl_pmax")
r2ccl_pmin_p = jaxapi.Primitive("r2ccl_pmin")
_OP = {r2ccl_psum_p: "sum", r2ccl_psum_invariant_p: "sum", r2ccl_pmax_p: "max", r2ccl_pmin_p: "min"}
_NAME = {r2ccl_psum_p: "psum", r2ccl_psum_invariant_p: "psum", r2ccl_pmax_p: "pmax", r2ccl_pmin_p: "pmin"}


def _check_aval(aval, name):
    lowering.check_dtype(aval.dtype, f"jax_r2ccl.{name}")


def _psum_abstract_eval(aval, *, axes):
    _check_aval(aval, "psum")
    return (jaxapi.allreduce_abstract_eval(aval, axes=axes, axis_index_groups=None))


def _psum_invariant_abstract_eval(aval, *, axes):
    _check_aval(aval, "psum")
    return (jaxapi.psum_invariant_abstract_eval("psum", aval, axes=axes))


def _pminmax_abstract_eval(name):
    def rule(aval, *, axes):
        _check_aval(aval, name)
        return (jaxapi.pmin_pmax_abstract_eval(name, aval, axes=axes, axis_index_groups=None))
    return rule


r2ccl_psum_p.def_effectful_abstract_eval(_psum_abstract_eval)
r2ccl_psum_invariant_p.def_effectful_abstract_eval(_psum_invariant_abstract_eval)
r2ccl_pmax_p.def_effectful_abstract_eval(_pminmax_abstract_eval("pmax"))
r2ccl_pmin_p.def_effectful_abstract_eval(_pminmax_abstract_eval("pmin"))
jaxapi.keep_when_unused(r2ccl_psum_p, r2ccl_psum_invariant_p, r2ccl_pmax_p, r2ccl_pmin_p)   # never removed when unused

for _p in _OP:
    _p.def_impl(_impl(_NAME[_p]))

    def _lower(ctx, x, *, axes, _p=_p):
        return lowering.lower_all_reduce(ctx, x, axes=axes, op=_OP[_p], what=f"jax_r2ccl.{_NAME[_p]}")
    lowering.register(_p, _lower)


# ---------------------------------------------------------------------------- autodiff

def _psum_transpose(cts, arg, *, axes):
    # psum_p's rule: psum is psum + pbroadcast, so the transpose reduces again.
    if type(cts) is ad.Zero:
        return (ad.Zero(arg.aval),)
    return (r2ccl_psum_p.bind(cts, axes=axes),)


def _psum_invariant_transpose(cts, arg, *, axes):
    # psum_invariant_p's rule: the cotangent of an invariant value is pvary'd.
    assert ad.is_undefined_primal(arg)
    if type(cts) is ad.Zero:
        return (ad.Zero(arg.aval),)
    return (jaxapi.pvary(cts, axis_name=axes),)


ad.deflinear2(r2ccl_psum_p, _psum_transpose)
ad.deflinear2(r2ccl_psum_invariant_p, _psum_invariant_transpose)
# pmax / pmin: no JVP, as in jax.lax (differentiating them raises the same kind of error).


# ---------------------------------------------------------------------------- vmap

def _batcher(prim, if_unmapped):
    """jax.lax's _batched_reduction_collective for named axes: a vmap axis that is not
    reduced keeps its place; a reduced vmap axis (vmap with axis_name) is reduced locally
    and the remaining mesh axes go through r2ccl."""
    def rule(axis_data, vals_in, dims_in, *, axes):
        (v,), (d,) = vals_in, dims_in
        if axis_data.name not in axes:
            return prim.bind(v, axes=axes), d
        rest = tuple(a for a in axes if a != axis_data.name)
        if d is None:
            out = if_unmapped(v, axis_data.size)
        else:
            out = _local_reduce(prim, v, d)
        if rest:
            out = prim.bind(out, axes=rest)
        return out, None
    return rule


def _local_reduce(prim, v, d):
    from jax import lax
    if prim in (r2ccl_pmax_p,):
        return lax.reduce_max(v, (d,))
    if prim in (r2ccl_pmin_p,):
        return lax.reduce_min(v, (d,))
    return lax.reduce_sum(v, (d,))


batching.fancy_primitive_batchers[r2ccl_psum_p] = _batcher(r2ccl_psum_p, lambda v, n: n * v)
batching.fancy_primitive_batchers[r2ccl_psum_invariant_p] = _batcher(r2ccl_psum_invariant_p, lambda v, n: n * v)
batching.fancy_primitive_batchers[r2ccl_pmax_p] = _batcher(r2ccl_pmax_p, lambda v, n: v)
batching.fancy_primitive_batchers[r2ccl_pmin_p] = _batcher(r2ccl_pmin_p, lambda v, n: v)


# ---------------------------------------------------------------------------- public functions

def _no_groups(name, axis_index_groups):
    if axis_index_groups is not None:
        raise NotImplementedError(f"jax_r2ccl.{name}: axis_index_groups is not supported (use a mesh axis for "
                                  f"the groups instead: a collective over one axis of a 2-D mesh runs in groups)")


def _named_axes(name, axis_name):
    axes = lowering.as_axes(axis_name)
    for a in axes:
        if isinstance(a, int):
            raise R2cclError(f"jax_r2ccl.{name}: positional (integer) axes are not supported, got {axes}")
    return axes


def _is_tracer(x):
    return isinstance(x, jaxapi.Tracer)


def psum(x, axis_name, *, axis_index_groups=None):
    """Like jax.lax.psum: all-reduce sum of every leaf of `x` over the mesh axis (or tuple of
    axes) `axis_name` inside jax.shard_map, through jax_r2ccl. Booleans are summed as int32."""
    _no_groups("psum", axis_index_groups)
    axes = _named_axes("psum", axis_name)
    if not axes:
        return x
    leaves, treedef = tree_util.tree_flatten(x)
    if not any(_is_tracer(leaf) for leaf in leaves):
        import jax
        return jax.lax.psum(x, axes)     # constants: n * x, no communication (as jax.lax)
    out = []
    for leaf in leaves:
        leaf = _as_array(leaf)
        if leaf.dtype == np.bool_:
            leaf = leaf.astype(np.int32)
        lowering.check_dtype(leaf.dtype, "jax_r2ccl.psum")
        if jaxapi.check_vma():
            if jaxapi.auto_pcast() and (names := set(axes) - jaxapi.typeof(leaf).mat.varying):
                leaf = jaxapi.pvary(leaf, tuple(a for a in axes if a in names))
            out.append(r2ccl_psum_invariant_p.bind(leaf, axes=axes))
        else:
            out.append(r2ccl_psum_p.bind(leaf, axes=axes))
    return tree_util.tree_unflatten(treedef, out)


def _as_array(leaf):
    import jax.numpy as jnp
    return leaf if hasattr(leaf, "dtype") and hasattr(leaf, "shape") else jnp.asarray(leaf)


def pmean(x, axis_name, *, axis_index_groups=None):
    """Like jax.lax.pmean: psum divided by the number of devices on the axes."""
    _no_groups("pmean", axis_index_groups)
    import jax
    x = psum(x, axis_name)
    n = jax.lax.psum(1, lowering.as_axes(axis_name))
    return tree_util.tree_map(lambda v: v / n, x)


def _pminmax(prim, name, x, axis_name, axis_index_groups):
    _no_groups(name, axis_index_groups)
    axes = _named_axes(name, axis_name)

    def bind(leaf):
        leaf = _as_array(leaf)
        lowering.check_dtype(leaf.dtype, f"jax_r2ccl.{name}")
        leaf = jaxapi.insert_collective_pvary(axes, leaf)
        return prim.bind(leaf, axes=axes)
    return tree_util.tree_map(bind, x)


def pmax(x, axis_name, *, axis_index_groups=None):
    """Like jax.lax.pmax: all-reduce max over the mesh axes, through jax_r2ccl."""
    return _pminmax(r2ccl_pmax_p, "pmax", x, axis_name, axis_index_groups)


def pmin(x, axis_name, *, axis_index_groups=None):
    """Like jax.lax.pmin: all-reduce min over the mesh axes, through jax_r2ccl."""
    return _pminmax(r2ccl_pmin_p, "pmin", x, axis_name, axis_index_groups)
