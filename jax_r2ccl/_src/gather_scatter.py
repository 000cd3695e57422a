"""all_gather and psum_scatter: each other's transpose, typed and batched as jax.lax's
all_gather_p and reduce_scatter_p (same parameters, same abstract evaluation: the result
varies over the axes; an input that does not is cast to varying first, as in jax.lax)."""

from __future__ import annotations

import numpy as np
from jax import tree_util

from ..errors import R2cclError
from .._compat import jaxapi
from . import lowering
from .._compat.jaxapi import ad, batching
from .reductions import _as_array, _no_groups

r2ccl_all_gather_p = jaxapi.Primitive("r2ccl_all_gather")
r2ccl_reduce_scatter_p = jaxapi.Primitive("r2ccl_reduce_scatter")




def _impl(name):
    def impl(*args, **params):
        raise R2cclError(f"jax_r2ccl.{name} must be called inside jax.shard_map (under jax.jit)")
    return impl


r2ccl_all_gather_p.def_impl(_impl("all_gather"))
r2ccl_reduce_scatter_p.def_impl(_impl("psum_scatter"))


def _all_gather_abstract_eval(x_aval, *, all_gather_dimension, axis_name, axis_size, tiled):
    lowering.check_dtype(x_aval.dtype, "jax_r2ccl.all_gather")
    return (jaxapi.all_gather_abstract_eval(
        x_aval, all_gather_dimension=all_gather_dimension, axis_name=axis_name, axis_index_groups=None,
        axis_size=axis_size, tiled=tiled))


def _reduce_scatter_abstract_eval(x_aval, *, scatter_dimension, axis_name, axis_size, tiled):
    lowering.check_dtype(x_aval.dtype, "jax_r2ccl.psum_scatter")
    _check_bool(x_aval.dtype)
    return (jaxapi.reduce_scatter_abstract_eval(
        x_aval, axis_name=axis_name, scatter_dimension=scatter_dimension, axis_index_groups=None,
        axis_size=axis_size, tiled=tiled))


def _check_bool(dtype):
    if np.dtype(dtype) == np.bool_:
        raise R2cclError("jax_r2ccl.psum_scatter: bool is not supported (jax.lax.psum_scatter of bool does not "
                         "sum either); convert to an integer type first")


r2ccl_all_gather_p.def_effectful_abstract_eval(_all_gather_abstract_eval)
r2ccl_reduce_scatter_p.def_effectful_abstract_eval(_reduce_scatter_abstract_eval)
jaxapi.keep_when_unused(r2ccl_all_gather_p, r2ccl_reduce_scatter_p)   # never removed when unused


def _lower_all_gather(ctx, x, **params):
    return lowering.lower_all_gather(ctx, x, what="jax_r2ccl.all_gather", **params)


def _lower_reduce_scatter(ctx, x, **params):
    return lowering.lower_reduce_scatter(ctx, x, what="jax_r2ccl.psum_scatter", **params)


lowering.register(r2ccl_all_gather_p, _lower_all_gather)
lowering.register(r2ccl_reduce_scatter_p, _lower_reduce_scatter)


# ---------------------------------------------------------------------------- autodiff

def _all_gather_transpose(cts, x, *, all_gather_dimension, axis_name, axis_size, tiled):
    if type(cts) is ad.Zero:
        return (ad.Zero(x.aval),)
    return (psum_scatter(cts, axis_name, scatter_dimension=all_gather_dimension, tiled=tiled),)


def _reduce_scatter_transpose(cts, x, *, scatter_dimension, axis_name, axis_size, tiled):
    if type(cts) is ad.Zero:
        return (ad.Zero(x.aval),)
    return (all_gather(cts, axis_name, axis=scatter_dimension, tiled=tiled),)


ad.deflinear2(r2ccl_all_gather_p, _all_gather_transpose)
ad.deflinear2(r2ccl_reduce_scatter_p, _reduce_scatter_transpose)


# ---------------------------------------------------------------------------- vmap (jax.lax's rules)

def _all_gather_batched(axis_data, vals_in, dims_in, *, all_gather_dimension, axis_name, axis_size, tiled):
    (x,), (d,) = vals_in, dims_in
    kw = dict(axis_name=axis_name, axis_size=axis_size, tiled=tiled)
    if axis_data.name not in axis_name:
        if d is None:
            return r2ccl_all_gather_p.bind(x, all_gather_dimension=all_gather_dimension, **kw), None
        if d <= all_gather_dimension:
            all_gather_dimension += 1
        elif not tiled:
            d += 1
        return r2ccl_all_gather_p.bind(x, all_gather_dimension=all_gather_dimension, **kw), d
    # gathering over the vmap axis itself: no communication (jax.lax's rule)
    if len(axis_name) > 1:
        raise NotImplementedError("jax_r2ccl.all_gather over a vmap axis together with mesh axes")
    from jax import lax
    if d is None:
        out_shape = list(np.shape(x))
        out_shape.insert(all_gather_dimension, axis_size)
        y = lax.broadcast_in_dim(x, out_shape, [i for i in range(len(out_shape)) if i != all_gather_dimension])
    else:
        y = jaxapi.moveaxis(d, all_gather_dimension, x)
    if tiled:
        y = jaxapi.foldaxis(all_gather_dimension, y)
    return y, None


def _reduce_scatter_batched(axis_data, vals_in, dims_in, *, scatter_dimension, axis_name, axis_size, tiled):
    (x,), (d,) = vals_in, dims_in
    kw = dict(axis_name=axis_name, axis_size=axis_size, tiled=tiled)
    if axis_data.name not in axis_name:
        if d is None:
            return r2ccl_reduce_scatter_p.bind(x, scatter_dimension=scatter_dimension, **kw), None
        if d <= scatter_dimension:
            scatter_dimension += 1
        elif not tiled:
            d += 1
        return r2ccl_reduce_scatter_p.bind(x, scatter_dimension=scatter_dimension, **kw), d
    if len(axis_name) > 1:
        raise NotImplementedError("jax_r2ccl.psum_scatter over a vmap axis together with mesh axes")
    from jax import lax
    if d is None:
        y, dy = x * axis_size, scatter_dimension
    else:
        y, dy = lax.reduce_sum(x, (d,)), scatter_dimension
    if tiled:
        y = jaxapi.splitaxis(dy, axis_size, y)
    return y, dy


batching.fancy_primitive_batchers[r2ccl_all_gather_p] = _all_gather_batched
batching.fancy_primitive_batchers[r2ccl_reduce_scatter_p] = _reduce_scatter_batched


# ---------------------------------------------------------------------------- public functions

def _axis_size(axes) -> int:
    import jax
    return jax.lax.psum(1, axes)


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False):
    """Like jax.lax.all_gather: every device's `x`, stacked along a new axis `axis`
    (tiled=False) or concatenated along `axis` (tiled=True), in axis_index order."""
    _no_groups("all_gather", axis_index_groups)
    axes = lowering.as_axes(axis_name)
    if not axes:
        return x
    n = _axis_size(axes)

    def bind(leaf):
        leaf = _as_array(leaf)
        lowering.check_dtype(leaf.dtype, "jax_r2ccl.all_gather")
        leaf = jaxapi.insert_collective_pvary(axes, leaf)
        ndim = np.ndim(leaf)
        dim = _canonical(axis, ndim if tiled else ndim + 1)
        return r2ccl_all_gather_p.bind(leaf, all_gather_dimension=dim, axis_name=axes, axis_size=n, tiled=tiled)
    return tree_util.tree_map(bind, x)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Like jax.lax.psum_scatter: psum, of which device r keeps the r-th block along
    `scatter_dimension` (tiled=True) or the r-th slice, that dimension removed (tiled=False)."""
    _no_groups("psum_scatter", axis_index_groups)
    axes = lowering.as_axes(axis_name)
    if not axes:
        return x
    n = _axis_size(axes)

    def bind(leaf):
        leaf = _as_array(leaf)
        lowering.check_dtype(leaf.dtype, "jax_r2ccl.psum_scatter")
        _check_bool(leaf.dtype)
        leaf = jaxapi.insert_collective_pvary(axes, leaf)
        dim = _canonical(scatter_dimension, np.ndim(leaf))
        return r2ccl_reduce_scatter_p.bind(leaf, scatter_dimension=dim, axis_name=axes, axis_size=n, tiled=tiled)
    return tree_util.tree_map(bind, x)


def _canonical(axis, ndim):
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of bounds for an array of {ndim} dimensions")
    return axis % ndim
