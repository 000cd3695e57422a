"""all_to_all: typed, differentiated (its own transpose, split and concat swapped) and
batched as jax.lax's all_to_all_p, with the same parameters."""

from __future__ import annotations

from jax import tree_util

from ..errors import R2cclError
from .._compat import jaxapi
from . import lowering
from .._compat.jaxapi import ad, batching
from .reductions import _as_array, _no_groups

r2ccl_all_to_all_p = jaxapi.Primitive("r2ccl_all_to_all")




def _impl(*args, **params):
    raise R2cclError("jax_r2ccl.all_to_all must be called inside jax.shard_map (under jax.jit)")


def _abstract_eval(x_aval, *, split_axis, concat_axis, axis_name, tiled):
    lowering.check_dtype(x_aval.dtype, "jax_r2ccl.all_to_all")
    return (jaxapi.all_to_all_abstract_eval(x_aval, axis_name=axis_name, split_axis=split_axis,
                                           concat_axis=concat_axis, axis_index_groups=None, tiled=tiled))


def _lower(ctx, x, *, split_axis, concat_axis, axis_name, tiled):
    return lowering.lower_all_to_all(ctx, x, split_axis=split_axis, concat_axis=concat_axis, axis_name=axis_name,
                                     what="jax_r2ccl.all_to_all")


r2ccl_all_to_all_p.def_impl(_impl)
r2ccl_all_to_all_p.def_effectful_abstract_eval(_abstract_eval)
jaxapi.keep_when_unused(r2ccl_all_to_all_p)   # never removed when unused
lowering.register(r2ccl_all_to_all_p, _lower)


def _transpose(cts, x, *, split_axis, concat_axis, axis_name, tiled):
    if type(cts) is ad.Zero:
        return (ad.Zero(x.aval),)
    cts = jaxapi.insert_collective_pvary(axis_name, cts)
    return (r2ccl_all_to_all_p.bind(cts, split_axis=concat_axis, concat_axis=split_axis, axis_name=axis_name,
                                    tiled=tiled),)


ad.deflinear2(r2ccl_all_to_all_p, _transpose)


def _batched(axis_data, vals_in, dims_in, *, split_axis, concat_axis, axis_name, tiled):
    """jax.lax's _all_to_all_batched_collective for the cases without the vmap axis among
    the axes; with it, the jax.lax rule (data movement only) when it is the only axis."""
    (x,), (d,) = vals_in, dims_in
    axis_size, frame_name = axis_data.size, axis_data.name
    if frame_name not in axis_name:
        if d is None:
            return r2ccl_all_to_all_p.bind(x, split_axis=split_axis, concat_axis=concat_axis, axis_name=axis_name,
                                           tiled=tiled), None
        out = r2ccl_all_to_all_p.bind(x, split_axis=split_axis + (d <= split_axis),
                                      concat_axis=concat_axis + (d <= concat_axis), axis_name=axis_name, tiled=tiled)
        return out, d
    if len(axis_name) > 1:
        raise NotImplementedError("jax_r2ccl.all_to_all over a vmap axis together with mesh axes")
    from jax import lax
    if d is None:
        x = lax.broadcast(x, (axis_size, *x.shape))
        d = 0
    if split_axis == concat_axis:
        axis = split_axis + (d <= split_axis)
        d_pre_split = d
        x = jaxapi.splitaxis(axis, axis_size, x)
        d += (axis <= d)
        return jaxapi.foldaxis(axis, jaxapi.moveaxes(x, (d, axis), (axis, d))), d_pre_split
    x_concat = jaxapi.foldaxis(concat_axis, jaxapi.moveaxis(d, concat_axis, x))
    return jaxapi.splitaxis(split_axis, axis_size, x_concat), split_axis


batching.fancy_primitive_batchers[r2ccl_all_to_all_p] = _batched


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Like jax.lax.all_to_all: split `split_axis` into n blocks, send block j to device j,
    concatenate what arrives along `concat_axis` (a new axis when tiled=False)."""
    _no_groups("all_to_all", axis_index_groups)
    axes = lowering.as_axes(axis_name)
    import jax
    n = jax.lax.psum(1, axes)

    def bind(leaf, split_axis=split_axis, concat_axis=concat_axis):
        from jax import lax
        leaf = _as_array(leaf)
        lowering.check_dtype(leaf.dtype, "jax_r2ccl.all_to_all")
        if tiled:
            if leaf.shape[split_axis] % n != 0:
                raise ValueError(f"The size of all_to_all split_axis ({leaf.shape[split_axis]}) has to be divisible "
                                 f"by the size of the named axis {axis_name} ({n})")
        else:
            if n != leaf.shape[split_axis]:
                raise ValueError(f"all_to_all requires the size of the mapped axis axis_name to equal "
                                 f"x.shape[split_axis], but they are {n} and {leaf.shape[split_axis]} respectively.")
            if split_axis < concat_axis:
                concat_axis += 1
                leaf = lax.expand_dims(leaf, (concat_axis,))
            elif split_axis == concat_axis:
                pass
            else:
                leaf = lax.expand_dims(leaf, (concat_axis,))
                split_axis += 1
        leaf = jaxapi.insert_collective_pvary(axes, leaf)
        out = r2ccl_all_to_all_p.bind(leaf, split_axis=split_axis, concat_axis=concat_axis, axis_name=axes,
                                      tiled=tiled)
        if not tiled and split_axis != concat_axis:
            out = lax.squeeze(out, (split_axis,))
        return out
    return tree_util.tree_map(bind, x)
