"""The one lowering of every jax_r2ccl collective (and of jax.lax's, under the swap): the
communicator of the mesh axes, this device's (group, rank) and a per-module op id, then
the flat "r2ccl_collective" FFI custom call with the data movement around it in HLO.

Communicator. In a shard_map the mesh is concrete (`ctx.module_context.axis_context` is an
SPMDAxisContext with `.mesh`). The devices are arranged as (other mesh axes..., reduced
axes...) and reshaped to (G, n): row g is group g, column r is rank r (= jax.lax.axis_index
of the reduced axes, in the order the user named them; the group index runs over the other
axes in mesh order). groups[g][r] is that device's process index; the communicator id is a
hash of the device ids in that layout and the axes, so every process derives the same id.

Group and rank of the running device are not operands of the primitive: the lowering
computes them from `partition_id` through two constant tables (flat mesh position -> group,
rank), exactly as jax's own axis_index lowering does with division and remainder. Keeping
the primitives single-operand lets them carry jax.lax's own AD and vmap rules unchanged, and
the lowering swap needs the same thing anyway (jax.lax's primitives have only `x`).

Op id. Collectives are matched across processes by (comm, group, run id, op id, k-th
execution), so the op id must be equal on every process for the same op and distinct among
the collectives of one compiled module. It is a counter kept in the module's
`cached_primitive_lowerings` dict (one dict per module, shared by every sub-context
`ModuleContext.replace` makes): lowering visits a jaxpr in the same order on every process,
so the n-th collective lowered gets op id n everywhere. Two things could give two call sites
one op id, and both are prevented:
  * MLIR's per-equation lowering cache (identical equations lowered once, called twice): our
    primitives and the swapped jax.lax ones are registered with cacheable=False;
  * functions shared by call sites (a nested jax.jit called twice, closed_call, shard_map
    without Shardy): `guard_shared_functions` wraps those lowerings; when r2ccl collectives
    were lowered inside, the functions just cached are forgotten, so the next call site
    lowers its own copy with fresh op ids. Independent call sites may run concurrently and
    in a different order on each process, so sharing an op id would mix their data.
Loop bodies (scan, fori_loop, while) are lowered once and run their iterations in order: the
k-th execution counter of the runtime tells the iterations apart.

Unused results. Every process of a group must join a collective, so none may be dropped: the
custom call is emitted with has_side_effect=True (XLA neither deletes nor merges it) and our
primitives have a DCE rule that keeps them (jaxapi.keep_when_unused; jax.lax's collectives
have none, so an unused jax.lax.psum disappears on every process alike). Not an effect: an
effect at the top of a jitted function would send every call through JAX's Python dispatch.

Matching by run id assumes every process runs the same compiled program: XLA's RunId differs
between processes whose programs differ in any way (even outside the collectives), and such
collectives then never meet and fail at R2CCL_TIMEOUT. jax.lax's gloo collectives do not
have this restriction.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from . import runtime
from .. import _core
from ..errors import R2cclError
from .._compat import jaxapi
from .._compat.jaxapi import hlo, ir, mlir

# The custom call's `kind` and `reduce_op` attributes are indices into the core's enums, so
# they are read from the core's own name lists (csrc/coll), never written out here.
_NAMES = _core.names()
KIND = {name: i for i, name in enumerate(_NAMES["kinds"])}
REDUCE = {name: i for i, name in enumerate(_NAMES["reduce_ops"])}
DTYPE_NAMES = tuple(_NAMES["dtypes"])


def _np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:   # bfloat16: numpy knows it only through ml_dtypes (a dependency of jax)
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))


SUPPORTED_DTYPES = frozenset(_np_dtype(d) for d in DTYPE_NAMES)
# The lowering platforms every jax_r2ccl collective (and the swap) registers a rule for; the
# FFI target "r2ccl_collective" has a handler on each (csrc/ffi/cpu_collectives.cc and, when
# the CUDA part is built, csrc/ffi/cuda_collectives.cc).
PLATFORMS = ("cpu", "cuda")


def partly_manual(axis_ctx) -> bool:
    """A shard_map manual over only some axes of its concrete mesh (axis_names=, or what jax.vmap
    of a shard_map may make): its values are still sharded automatically over the rest."""
    mesh = jaxapi.concrete_mesh(getattr(axis_ctx, "mesh", None))
    return (isinstance(axis_ctx, jaxapi.SPMDAxisContext) and mesh is not None and bool(axis_ctx.manual_axes)
            and frozenset(axis_ctx.manual_axes) != frozenset(mesh.axis_names))


def _slice_dims(params, nd_in: int):
    """{input dimension: output dimension} that a collective treats slice by slice (a slice of
    its input along it gives that slice of its output), read from the parameters jax.lax's
    collectives and jax_r2ccl's own share; {} for anything else."""
    dims = range(nd_in)
    if "all_gather_dimension" in params:
        d = params["all_gather_dimension"]
        return {e: e if params["tiled"] or e < d else e + 1 for e in dims if e != d}
    if "scatter_dimension" in params:
        d = params["scatter_dimension"]
        return {e: e if params["tiled"] or e < d else e - 1 for e in dims if e != d}
    if "split_axis" in params:
        return {e: e for e in dims if e not in (params["split_axis"], params["concat_axis"])}
    if "perm" in params:
        return {e: e for e in dims}
    if "axes" in params:   # psum, pmax, pmin: positional (vmap) axes are reduced away
        pos = sorted(a for a in params["axes"] if isinstance(a, int))
        return {e: e - sum(p < e for p in pos) for e in dims if e not in pos}
    return {}


def _auto_specs(ctx, params, auto: tuple, ways: int):
    """(in spec, out spec) of the nested fully-manual shard_map: the automatic axes shard the
    largest dimension the collective treats slice by slice and that they divide, so each of
    their coordinates moves only its slice (the bytes jax's own lowering moves); with none,
    the value is replicated over them (every coordinate moves all of it)."""
    aval_in, aval_out = ctx.avals_in[0], ctx.avals_out[0]
    best = None
    for e, e_out in _slice_dims(params, len(aval_in.shape)).items():
        n = aval_in.shape[e]
        if n % ways == 0 and n >= ways and e_out < len(aval_out.shape) and aval_out.shape[e_out] == n:
            if best is None or n > aval_in.shape[best[0]]:
                best = (e, e_out)
    spec_in, spec_out = [None] * len(aval_in.shape), [None] * len(aval_out.shape)
    if best is not None:
        spec_in[best[0]] = spec_out[best[1]] = auto
    return spec_in, spec_out


def _through_full_manual(rule):
    """In a partly-manual shard_map the same bind is lowered again inside a shard_map that is
    also manual over the automatic axes: there every device knows its (group, rank) from
    partition_id, which XLA refuses to partition in a partly-manual region. The automatic axes
    stay jax's, before and after: each of their coordinates runs the collective among its own
    manual-axis devices on its slice of the value (_auto_specs)."""
    @functools.wraps(rule)
    def wrapped(ctx, *args, **params):
        axis_ctx = ctx.module_context.axis_context
        if not partly_manual(axis_ctx):
            return rule(ctx, *args, **params)
        prim, mesh = ctx.primitive, axis_ctx.mesh
        auto = tuple(a for a in mesh.axis_names if a not in axis_ctx.manual_axes)
        spec_in, spec_out = ([], [])   # several operands: each replicated over the automatic axes
        if len(ctx.avals_in) == 1 and len(ctx.avals_out) == 1:
            spec_in, spec_out = _auto_specs(ctx, params, auto, axis_size(mesh, auto))

        def again(*a):
            out = prim.bind(*a, **params)
            return list(out) if prim.multiple_results else [out]
        return jaxapi.full_manual_lowering(ctx, again, args, mesh, spec_in, spec_out)
    return wrapped


def register(prim, rule) -> None:
    """Registers `rule` as `prim`'s lowering on every platform of PLATFORMS (in a partly-manual
    shard_map, through a nested fully-manual one: _through_full_manual)."""
    for platform in PLATFORMS:
        mlir.register_lowering(prim, _through_full_manual(rule), platform=platform, cacheable=False)
_OPID_KEY = ("jax_r2ccl", "op_id_counter")


def _supported(dtype) -> bool:
    return np.dtype(dtype).name in DTYPE_NAMES


def check_dtype(dtype, what: str) -> None:
    """Trace-time dtype check (the custom call would only fail at run time)."""
    if not _supported(dtype):
        raise R2cclError(f"{what}: dtype {np.dtype(dtype).name} is not supported by jax_r2ccl (supported: "
                         f"{', '.join(DTYPE_NAMES)})")


def as_axes(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


# ----------------------------------------------------------------------------- op ids

def _counter(ctx) -> list:
    d = ctx.module_context.cached_primitive_lowerings
    c = d.get(_OPID_KEY)
    if c is None:
        c = d[_OPID_KEY] = [0]
    return c


def next_op_id(ctx) -> int:
    c = _counter(ctx)
    c[0] += 1
    return c[0]


def guard_shared_functions(rule):
    """Wraps the lowering of a call-like primitive (see the module docstring)."""
    @functools.wraps(rule)
    def guarded(ctx, *args, **params):
        d = ctx.module_context.cached_primitive_lowerings
        c = _counter(ctx)
        n0, len0 = c[0], len(d)
        out = rule(ctx, *args, **params)
        if c[0] != n0:   # r2ccl collectives were lowered inside: forget what was cached meanwhile
            for k in list(itertools.islice(d.keys(), len0, None)):
                if k != _OPID_KEY:
                    del d[k]
        return out
    guarded.r2ccl_guard = True
    return guarded


def install_guards() -> None:
    for platform in PLATFORMS:
        for prim in jaxapi.call_primitives():
            specific, generic = jaxapi.lowering_rule(prim, platform)
            entry = specific or generic
            if entry is None or getattr(entry.rule, "r2ccl_guard", False):
                continue
            # A platform-specific rule takes precedence over the generic one.
            mlir.register_lowering(prim, guard_shared_functions(entry.rule), platform=platform, inline=entry.inline,
                                   cacheable=not jaxapi.is_uncacheable(prim))


# ----------------------------------------------------------------------------- communicators

class Comm:
    """A communicator over `axes` of a concrete mesh, and this mesh's lookup tables."""

    def __init__(self, mesh, axes, dest=(), index_groups=()):
        names = tuple(mesh.axis_names)
        devs = np.asarray(mesh.devices)
        others = [a for a in names if a not in axes]
        perm = [names.index(a) for a in others] + [names.index(a) for a in axes]
        self.n = axis_size(mesh, axes)
        self.G = devs.size // self.n
        arranged = devs.transpose(perm).reshape(self.G, self.n)
        pos = np.arange(devs.size).reshape(devs.shape).transpose(perm).reshape(self.G, self.n)
        if index_groups:
            # axis_index_groups: each row splits into its groups, rank = place in the group's list
            # (jax.lax's replica groups: [row[i] for i in group] for each row, each group).
            sel = np.asarray(index_groups, np.int64)
            self.G, self.n = self.G * sel.shape[0], sel.shape[1]
            arranged = arranged[:, sel].reshape(self.G, self.n)
            pos = pos[:, sel].reshape(self.G, self.n)
        self.group_of = np.empty(devs.size, np.int32)
        self.rank_of = np.empty(devs.size, np.int32)
        for g in range(self.G):
            for r in range(self.n):
                self.group_of[pos[g, r]] = g
                self.rank_of[pos[g, r]] = r
        self.groups = [[int(d.process_index) for d in row] for row in arranged]
        self.name = "/".join(map(str, axes)) + " of mesh " + ",".join(f"{a}={mesh.shape[a]}" for a in names)
        self.key = ("r2ccl-comm|" + ",".join(map(str, axes)) + "|" + ",".join(f"{a}={mesh.shape[a]}" for a in names)
                    + "|" + ",".join(str(d.id) for d in arranged.flat))
        if index_groups:
            text = ";".join(",".join(map(str, g)) for g in index_groups)
            self.key += "|groups:" + text
            self.name += " in axis_index_groups " + text
        # A permute's communicator: each rank's destination (-1: none), the same in every group.
        self.perm = tuple(int(d) for d in dest)
        if self.perm:
            self.key += "|perm:" + ",".join(map(str, self.perm))
            self.name = "ppermute over " + self.name

    def register(self) -> int:
        return runtime.register_groups(self.groups, self.name, self.key, self.perm)


@functools.lru_cache(maxsize=256)
def _comm(mesh, axes, perm=(), index_groups=()) -> Comm:
    return Comm(mesh, axes, perm, index_groups)


def axis_size(mesh, axes) -> int:
    return int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))


def index_groups_problem(n: int, index_groups) -> str | None:
    """Why jax_r2ccl cannot serve these axis_index_groups over an axis of size n, or None: they
    must split the n indices into groups of one size (what jax requires on TPU; jax's own
    lowering serves the rest)."""
    flat = [i for g in index_groups for i in g]
    if sorted(flat) != list(range(n)):
        return f"axis_index_groups that do not cover the {n} indices once each"
    if len({len(g) for g in index_groups}) != 1:
        return "axis_index_groups of unequal sizes"
    return None


def canonical_groups(index_groups) -> tuple:
    return tuple(tuple(int(i) for i in g) for g in index_groups) if index_groups is not None else ()


def communicator(ctx, axes, what: str, perm=(), index_groups=None) -> Comm:
    axis_ctx = ctx.module_context.axis_context
    if not isinstance(axis_ctx, jaxapi.SPMDAxisContext):
        raise R2cclError(f"{what} over {axes}: jax_r2ccl collectives run inside jax.shard_map (this is a "
                         f"{type(axis_ctx).__name__}; pmap is not supported)")
    mesh = jaxapi.concrete_mesh(axis_ctx.mesh)
    if mesh is None:
        raise R2cclError(f"{what}: the shard_map mesh is abstract; jax_r2ccl needs a concrete jax.sharding.Mesh "
                         f"(pass mesh= to shard_map or use jax.set_mesh)")
    names = tuple(mesh.axis_names)
    for a in axes:
        if a not in names:
            raise R2cclError(f"{what}: axis {a!r} is not an axis of the mesh {names}")
    # (a partly-manual shard_map never gets here: register()'s _through_full_manual)
    assert frozenset(axis_ctx.manual_axes) == frozenset(names), (axis_ctx.manual_axes, names)
    groups = canonical_groups(index_groups)
    if groups:
        why = index_groups_problem(axis_size(mesh, axes), groups)
        if why:
            raise R2cclError(f"{what} over {axes}: {why}: {[list(g) for g in groups]}")
    return _comm(mesh, tuple(axes), tuple(perm), groups)


# ----------------------------------------------------------------------------- HLO helpers

def _ttype(shape, dtype):
    return ir.RankedTensorType.get(list(shape), mlir.dtype_to_ir_type(np.dtype(dtype)))


def _reshape(x, shape, dtype):
    return hlo.reshape(_ttype(shape, dtype), x)


def _transpose(x, perm):
    if list(perm) == list(range(len(perm))):
        return x
    return hlo.transpose(x, mlir.dense_int_array(list(perm)))


def _lookup(table: np.ndarray, pid):
    if not table.any():
        return mlir.ir_constant(np.int32(0))
    t = mlir.ir_constant(np.asarray(table, np.int32))
    s = hlo.dynamic_slice(t, [pid], mlir.dense_int_array([1]))
    return hlo.reshape(_ttype((), np.int32), s)


def _group_rank(comm: Comm):
    """This device's group and rank in `comm`, from partition_id (HLO values)."""
    pid = hlo.convert(_ttype((), np.int32), hlo.partition_id())
    return _lookup(comm.group_of, pid), _lookup(comm.rank_of, pid)


def _custom_call(ctx, x, in_shape, out_shape, dtype, comm: Comm, kind: str, op: str = "sum"):
    comm_id = comm.register()
    group, rank = _group_rank(comm)
    scalar = jaxapi.ShapedArray((), np.int32)
    sub = ctx.replace(avals_in=[jaxapi.ShapedArray(tuple(in_shape), dtype), scalar, scalar],
                      avals_out=[jaxapi.ShapedArray(tuple(out_shape), dtype)])
    import jax
    rule = jax.ffi.ffi_lowering(runtime.FFI_TARGET, has_side_effect=True)
    out, = rule(sub, x, group, rank, comm_id=int(comm_id), op_id=int(next_op_id(ctx)), kind=int(KIND[kind]),
                reduce_op=int(REDUCE[op]), root=0)
    return out


def _check(ctx, what):
    aval = ctx.avals_in[0]
    check_dtype(aval.dtype, what)
    return aval, tuple(aval.shape), np.dtype(aval.dtype)


# ----------------------------------------------------------------------------- the collectives

def lower_all_reduce(ctx, x, *, axes, op: str, what: str, index_groups=None):
    aval, shape, dtype = _check(ctx, what)
    comm = communicator(ctx, axes, what, index_groups=index_groups)
    if comm.n == 1:
        return [x]
    return [_custom_call(ctx, x, shape, shape, dtype, comm, "all_reduce", op)]


def lower_all_gather(ctx, x, *, all_gather_dimension, axis_name, axis_size, tiled, what="all_gather",
                     index_groups=None):
    aval, s, dtype = _check(ctx, what)
    comm = communicator(ctx, as_axes(axis_name), what, index_groups=index_groups)
    n, d = comm.n, all_gather_dimension
    assert n == axis_size, (n, axis_size)
    if n == 1:
        return [x if tiled else _reshape(x, s[:d] + (1,) + s[d:], dtype)]
    # flat result: every rank's input in rank order, (n,) + s; move the rank axis to d
    y = _custom_call(ctx, x, s, (n,) + s, dtype, comm, "all_gather")
    y = _transpose(y, list(range(1, d + 1)) + [0] + list(range(d + 1, len(s) + 1)))
    if tiled:        # (.., n, s[d], ..) -> (.., n * s[d], ..)
        y = _reshape(y, s[:d] + (n * s[d],) + s[d + 1:], dtype)
    return [y]


def lower_reduce_scatter(ctx, x, *, scatter_dimension, axis_name, axis_size, tiled, op="sum",
                         what="psum_scatter", index_groups=None):
    aval, s, dtype = _check(ctx, what)
    comm = communicator(ctx, as_axes(axis_name), what, index_groups=index_groups)
    n, d = comm.n, scatter_dimension
    assert n == axis_size, (n, axis_size)
    if tiled:
        m = s[d] // n
        split = s[:d] + (n, m) + s[d + 1:]
        y = _reshape(x, split, dtype)
        out = s[:d] + (m,) + s[d + 1:]
    else:
        split = s
        y = x
        out = s[:d] + s[d + 1:]
    if n == 1:
        return [_reshape(y, out, dtype)]
    perm = [d] + [i for i in range(len(split)) if i != d]
    y = _transpose(y, perm)
    return [_custom_call(ctx, y, tuple(split[i] for i in perm), out, dtype, comm, "reduce_scatter", op)]


def lower_all_to_all(ctx, x, *, split_axis, concat_axis, axis_name, what="all_to_all", index_groups=None, **_):
    aval, s, dtype = _check(ctx, what)
    comm = communicator(ctx, as_axes(axis_name), what, index_groups=index_groups)
    n, sa, ca = comm.n, split_axis, concat_axis
    if n == 1:
        return [x]
    m = s[sa] // n
    split = s[:sa] + (n, m) + s[sa + 1:]
    y = _reshape(x, split, dtype)
    perm = [sa] + [i for i in range(len(split)) if i != sa]
    y = _transpose(y, perm)
    blocks = tuple(split[i] for i in perm)          # (n,) + s with s[sa] -> m
    y = _custom_call(ctx, y, blocks, blocks, dtype, comm, "all_to_all")
    sp = blocks[1:]                                  # one block's shape
    # block i came from rank i: put the block axis just before concat_axis and merge it in
    perm2 = list(range(1, ca + 1)) + [0] + list(range(ca + 1, len(sp) + 1))
    y = _transpose(y, perm2)
    out = sp[:ca] + (n * sp[ca],) + sp[ca + 1:]
    return [_reshape(y, out, dtype)]


def lower_permute(ctx, x, *, axis_name, perm, what="ppermute"):
    """jax.lax.ppermute: the input of the rank at axis index a goes to the rank at b for every
    (a, b) in `perm`; a rank no pair sends to gets zeros (jax.lax's semantics)."""
    aval, s, dtype = _check(ctx, what)
    axes = as_axes(axis_name)
    n = communicator(ctx, axes, what).n
    dest = [-1] * n
    for a, b in perm:
        if not (0 <= a < n and 0 <= b < n) or dest[a] != -1 or b in dest:
            raise R2cclError(f"{what}: {list(map(tuple, perm))} is no permutation of the {n} ranks of {axes}")
        dest[a] = b
    if n == 1:
        return [x if dest[0] == 0 else mlir.full_like_aval(ctx, 0, aval)]
    comm = communicator(ctx, axes, what, perm=dest)
    return [_custom_call(ctx, x, s, s, dtype, comm, "permute")]


def lower_ragged_all_to_all(ctx, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                            axis_name, what="ragged_all_to_all", index_groups=None):
    """jax.lax.ragged_all_to_all: its own custom call ("r2ccl_ragged_all_to_all") with the
    output operand aliased to the result, which so starts as the output; the slices are rows of
    the operand's leading axis (csrc/coll: kind ragged_all_to_all)."""
    aval, s, dtype = _check(ctx, what)
    if not s:
        raise R2cclError(f"{what}: the operand needs a leading axis (its rows are what moves)")
    comm = communicator(ctx, as_axes(axis_name), what, index_groups=index_groups)
    comm_id = comm.register()
    group, rank = _group_rank(comm)
    scalar = jaxapi.ShapedArray((), np.int32)
    sub = ctx.replace(avals_in=list(ctx.avals_in) + [scalar, scalar])
    import jax
    rule = jax.ffi.ffi_lowering(runtime.RAGGED_FFI_TARGET, has_side_effect=True, operand_output_aliases={1: 0})
    out, = rule(sub, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, group, rank,
                comm_id=int(comm_id), op_id=int(next_op_id(ctx)))
    return [out]
