"""Worker functions of the multi-process JAX tests (run by tests/jax_rank_main.py): each gets
its process index, the number of processes and the local device count, runs after
jax.distributed.initialize() and jax_r2ccl.initialize(), and returns JSON.

Every r2ccl program is compared with the same program written with jax.lax (JAX's own
collectives, gloo across processes) in a separate jitted function, on the same inputs. The
"exact" inputs are small integers (halves for floats) whose sums are exact in every dtype,
so the two must agree bit for bit whatever the summation order; random floats are checked
against an exact reference within a stated bound. Per-device digests of results that must be
identical inside a group come back to the test, which compares them across processes."""

from __future__ import annotations

import hashlib
import re
import threading
import time

import numpy as np

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64", "bool"]
ROWS, COLS = 12, 5      # per-device block: 12 divides every axis size used (1, 2, 3, 4, 6)


def _jax():
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    return jax, jnp, Mesh, NamedSharding, P


def np_dtype(name):
    import jax.numpy as jnp
    return np.dtype(jnp.bfloat16) if name == "bfloat16" else np.dtype(name)


def make_mesh(world, local):
    jax, jnp, Mesh, NamedSharding, P = _jax()
    devs = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    if local == 1:
        return Mesh(devs, ("p",)), ("p",)
    return Mesh(devs.reshape(world, local), ("p", "l")), ("p", "l")


def exact_block(pos, dtype_name, seed=0, shape=(ROWS, COLS)):
    rng = np.random.default_rng(1000 * seed + 17 * pos + DTYPES.index(dtype_name))
    dt = np_dtype(dtype_name)
    if dtype_name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype_name.startswith("float") or dtype_name == "bfloat16":
        return (rng.integers(-8, 9, shape) * 0.5).astype(dt)
    if dtype_name.startswith("uint"):
        return rng.integers(0, 11, shape).astype(dt)
    return rng.integers(-5, 6, shape).astype(dt)


def global_array(mesh, axes, blocks):
    """A global array whose block at flat mesh position p (rows p*R..) is blocks[p]."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    R = blocks[0].shape[0]
    shape = (R * len(blocks),) + blocks[0].shape[1:]
    full = np.concatenate(blocks)
    return jax.make_array_from_callback(shape, NamedSharding(mesh, P(axes)), lambda idx: full[idx])


def per_device(arr):
    """{flat mesh position: numpy block} of this process's shards of an output whose leading
    dimension is the flat mesh position (out_specs P(all axes), one row per device)."""
    out = {}
    for s in arr.addressable_shards:
        start = s.index[0].start or 0
        out[int(start)] = np.asarray(s.data)[0]
    return out


def digest(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.sha1(a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:16]


def group_of(mesh, pos, axes):
    """The index of the group of the device at flat position `pos` for a collective over
    `axes` (position along the other mesh axes)."""
    names = list(mesh.axis_names)
    coords = np.unravel_index(pos, mesh.devices.shape)
    others = [i for i, a in enumerate(names) if a not in axes]
    g = 0
    for i in others:
        g = g * mesh.devices.shape[i] + int(coords[i])
    return g


def _ops(M, v, axes, n, dt):
    """Every collective of the API on one block, through module M (jax_r2ccl or jax.lax)."""
    out = {
        "psum": M.psum(v, axes),
        "pmean": M.pmean(v, axes),
        "pmax": M.pmax(v, axes),
        "pmin": M.pmin(v, axes),
        "all_gather": M.all_gather(v, axes, axis=1),
        "all_gather_tiled": M.all_gather(v, axes, axis=0, tiled=True),
        "all_to_all": M.all_to_all(v.reshape(n, -1), axes, 0, 1),
        "all_to_all_tiled": M.all_to_all(v, axes, 0, 1, tiled=True),
    }
    if dt != "bool":   # jax.lax.psum_scatter refuses bool too
        out["psum_scatter"] = M.psum_scatter(v.reshape(n, -1), axes)
        out["psum_scatter_tiled"] = M.psum_scatter(v, axes, scatter_dimension=0, tiled=True)
    return out


# Results every member of a group must hold identically.
REPLICATED = ("psum", "pmean", "pmax", "pmin", "all_gather", "all_gather_tiled")


def _compare_programs(mesh, all_axes, cases, inputs, check_vma=True):
    """cases: [(label, axes, dtype)]; runs r2ccl's and jax.lax's programs on `inputs`
    ({dtype: global array}); returns (mismatches, digests, seconds)."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    dts = sorted(inputs)

    def program(M):
        def body(*vs):
            vals = dict(zip(dts, vs))
            outs = {}
            for label, axes, dt in cases:
                n = jax.lax.psum(1, axes)
                for op, o in _ops(M, vals[dt], axes, n, dt).items():
                    outs[f"{label}:{op}"] = o[None]
            return outs
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(P(all_axes) for _ in dts),
                                     out_specs=P(all_axes), check_vma=check_vma))

    args = [inputs[d] for d in dts]
    t0 = time.monotonic()
    r = program(jax_r2ccl)(*args)
    jax.block_until_ready(r)
    t1 = time.monotonic()
    ref = program(jax.lax)(*args)
    jax.block_until_ready(ref)
    t2 = time.monotonic()
    bad, digests = [], {}
    for key in sorted(r):
        label, op = key.split(":")
        axes = next(c[1] for c in cases if c[0] == label)
        got, want = per_device(r[key]), per_device(ref[key])
        for pos in got:
            a, b = got[pos], want[pos]
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                bad.append({"case": key, "device": pos, "r2ccl": f"{a.dtype}{a.shape}", "lax": f"{b.dtype}{b.shape}",
                            "r2ccl_head": np.asarray(a).ravel()[:6].astype(float).tolist(),
                            "lax_head": np.asarray(b).ravel()[:6].astype(float).tolist()})
            if op in REPLICATED:
                digests.setdefault(key, {})[str(pos)] = [group_of(mesh, pos, axes), digest(a)]
    return bad, digests, {"r2ccl_compile_and_run": round(t1 - t0, 2), "lax_compile_and_run": round(t2 - t1, 2)}


def matrix(rank, world, local, dtypes=DTYPES, sub_dtypes=("float32", "bfloat16", "int64"), random_floats=True):
    """Every op x dtype over all devices; on a 2-D mesh also over each axis alone and over
    both axes in reverse order (groups, rank order), for a few dtypes; random floats."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    mesh, all_axes = make_mesh(world, local)
    N = mesh.devices.size
    used = sorted(set(dtypes) | (set(sub_dtypes) if local > 1 else set()))
    inputs = {dt: global_array(mesh, all_axes, [exact_block(p, dt) for p in range(N)]) for dt in used}
    cases = [(f"all/{dt}", all_axes, dt) for dt in dtypes]
    if local > 1:
        for dt in sub_dtypes:
            cases += [(f"p/{dt}", ("p",), dt), (f"l/{dt}", ("l",), dt), (f"lp/{dt}", ("l", "p"), dt)]
    bad, digests, secs = _compare_programs(mesh, all_axes, cases, inputs)
    res = {"bad": bad, "digests": digests, "seconds": secs, "cases": len(cases), "devices": N}
    if random_floats:
        res["random"] = _random_floats(mesh, all_axes)
        # past 64 KiB: the owner exchange (and, from 3 processes on, the planner)
        res["random_large"] = _random_floats(mesh, all_axes, size=40_000)
    return res


def _random_floats(mesh, all_axes, size=4096):
    """psum/pmean of random normal floats over all devices: r2ccl and jax.lax both within
    N * eps * sum|x| of the exact sum (computed here in extended precision from every
    device's input), r2ccl identical on every device; bit-equality with jax.lax reported."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    N = mesh.devices.size
    names = ["float32", "float64", "float16", "bfloat16"]
    blocks = {dt: [np.random.default_rng(7 + 31 * p + i).standard_normal((1, size)).astype(np_dtype(dt))
                   for p in range(N)] for i, dt in enumerate(names)}
    inputs = [global_array(mesh, all_axes, blocks[dt]) for dt in names]

    def program(M):
        def body(*vs):
            return {dt: M.psum(v, all_axes) for dt, v in zip(names, vs)}
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(P(all_axes) for _ in names),
                                     out_specs=P(all_axes)))
    r = program(jax_r2ccl)(*inputs)
    ref = program(jax.lax)(*inputs)
    out = {}
    for dt in names:
        xs = np.stack([b[0].astype(np.longdouble) for b in blocks[dt]])
        exact = xs.sum(0)
        eps = float(jnp.finfo(np_dtype(dt)).eps)
        bound = N * eps * np.abs(xs).sum(0) + float(jnp.finfo(np_dtype(dt)).tiny)
        got, want = per_device(r[dt]), per_device(ref[dt])
        worst_r = max(float(np.max(np.abs(g.astype(np.longdouble) - exact) / bound)) for g in got.values())
        worst_l = max(float(np.max(np.abs(w.astype(np.longdouble) - exact) / bound)) for w in want.values())
        out[dt] = {"r2ccl_err_over_bound": worst_r, "lax_err_over_bound": worst_l,
                   "digests": {str(p): digest(g) for p, g in got.items()},
                   "bit_equal_to_lax": all(got[p].tobytes() == want[p].tobytes() for p in got)}
    return out


# ----------------------------------------------------------------------------- misc checks

def _rail_tx_bytes():
    from jax_r2ccl._src import runtime
    ep = runtime.current().endpoint
    total = 0
    for peer in ep.peers:
        for s in ep.rail_stats(peer):
            total += int(s["tx_bytes"])
    return total


def misc(rank, world, local):
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from jax_r2ccl.errors import R2cclError
    mesh, all_axes = make_mesh(world, local)
    N = mesh.devices.size
    res = {}
    timing = {}
    blocks = [exact_block(p, "float64", seed=3) for p in range(N)]
    x = global_array(mesh, all_axes, blocks)
    spec = P(all_axes)

    def smap(f, check_vma=True, in_specs=None, out_specs=None):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs if in_specs is not None else spec,
                                     out_specs=out_specs if out_specs is not None else spec, check_vma=check_vma))

    def same(a, b):
        ga, gb = per_device(a), per_device(b)
        return all(ga[p].dtype == gb[p].dtype and ga[p].tobytes() == gb[p].tobytes() for p in ga)

    # -- loops: psum inside lax.scan and fori_loop (the fori body's psum does not depend on
    #    the carry: unrolled copies would be independent), with grad, check_vma=False.
    t = time.monotonic()

    def loop_loss(M, w, v):
        def step(c, k):
            return c + M.psum(v * w * k, all_axes), None
        c, _ = jax.lax.scan(step, jnp.zeros_like(v), jnp.arange(1.0, 4.0))
        c = jax.lax.fori_loop(0, 4, lambda i, c: c * 0.5 + M.psum(v * i, all_axes), c)
        return jnp.sum(c * c)

    def loop_prog(M):
        return smap(lambda w, v: (loop_loss(M, w, v)[None], jax.grad(loop_loss, argnums=(1, 2))(M, w, v)[0][None],
                                  jax.grad(loop_loss, argnums=(1, 2))(M, w, v)[1][None]),
                    check_vma=False, in_specs=(P(), spec), out_specs=(spec, spec, spec))
    w = jnp.float64(0.5)
    a, b = loop_prog(jax_r2ccl)(w, x), loop_prog(jax.lax)(w, x)
    res["scan_fori_grad"] = {"equal": all(same(u, v) for u, v in zip(a, b)),
                             "loss": float(per_device(a[0])[min(per_device(a[0]))])}
    timing["scan_fori_grad"] = time.monotonic() - t

    # -- the same step with check_vma=True and an invariant parameter, under the lowering swap:
    #    JAX's own gradient all-reduce (the transpose of pvary) goes through r2ccl as well.
    t = time.monotonic()

    def vma_prog():
        return smap(lambda w, v: (loop_loss(jax.lax, w, v)[None], jax.grad(loop_loss, argnums=1)(jax.lax, w, v)[None]),
                    check_vma=True, in_specs=(P(), spec), out_specs=(spec, spec))
    ref = vma_prog()(w, x)
    with jax_r2ccl.enabled():
        f = vma_prog()
        text = f.lower(w, x).as_text()
        got = f(w, x)
    res["swap_vma_grad"] = {"equal": all(same(u, v) for u, v in zip(got, ref)),
                            "r2ccl_calls": len(re.findall(r"r2ccl_collective", text)),
                            "xla_collectives": len(re.findall(r"stablehlo\.(all_reduce|all_gather|reduce_scatter|"
                                                              r"all_to_all)", text))}
    timing["swap_vma_grad"] = time.monotonic() - t

    # -- two psums whose results are unused: both run (rail bytes), one used psum for scale
    t = time.monotonic()
    big = global_array(mesh, all_axes, [np.full((1, 1 << 20), p + 1.0, np.float32) for p in range(N)])
    one = smap(lambda v: jax_r2ccl.psum(v, all_axes) + 0)
    two_unused = smap(lambda v: (jax_r2ccl.psum(v, all_axes), jax_r2ccl.psum(v * 2, all_axes), v)[2])
    jax.block_until_ready(one(big))
    jax.block_until_ready(two_unused(big))
    deltas = {}
    for name, f in (("one_used", one), ("two_unused", two_unused)):
        _barrier(f"{name}-before")
        b0 = _rail_tx_bytes()
        jax.block_until_ready(f(big))
        _barrier(f"{name}-after")
        time.sleep(0.05)
        deltas[name] = _rail_tx_bytes() - b0
    res["unused"] = {"tx_bytes": deltas,
                     "custom_calls_in_executable": len(re.findall(r"r2ccl_collective",
                                                                  two_unused.lower(big).compile().as_text()))}
    # A jitted program with collectives carries no effect at its top level: an effect would
    # take every call off jit's C++ dispatch path (tens of microseconds per call).
    res["unused"]["top_level_effects"] = sorted(str(e) for e in jax.make_jaxpr(two_unused)(big).effects)
    timing["unused"] = time.monotonic() - t

    # -- 40 independent psums in one program
    t = time.monotonic()
    forty = smap(lambda v: sum(jax_r2ccl.psum(v * (k + 1), all_axes) for k in range(40)))
    lax40 = smap(lambda v: 820 * jax.lax.psum(v, all_axes))
    res["forty"] = {"equal": same(forty(x), lax40(x)),
                    "custom_calls": len(re.findall(r"r2ccl_collective", forty.lower(x).as_text()))}
    timing["forty"] = time.monotonic() - t

    # -- grad through psum, both typing modes, against jax.lax
    t = time.monotonic()

    def gloss(M, w, v):
        return jnp.sum(M.psum(v * w, all_axes) ** 2) + jnp.sum(M.pmean(jnp.sin(w) * v, all_axes))
    g = {}
    for cv in (True, False):
        progs = [smap(lambda w, v, M=M: [a[None] for a in jax.grad(gloss, argnums=(1, 2))(M, w, v)], check_vma=cv)
                 for M in (jax_r2ccl, jax.lax)]
        ga, gb = progs[0](x, x), progs[1](x, x)
        g[str(cv)] = {"equal": all(same(u, v) for u, v in zip(ga, gb)),
                      "max_abs_diff": max(float(np.max(np.abs(per_device(u)[p] - per_device(v)[p])))
                                          for u, v in zip(ga, gb) for p in per_device(u))}
    # grad of a function that calls a shard_map (differentiation outside the shard_map)
    outer = [jax.jit(jax.grad(lambda v, M=M: jnp.sum(jax.shard_map(lambda u: M.psum(u * u, all_axes), mesh=mesh,
                                                                   in_specs=spec, out_specs=P())(v))))
             for M in (jax_r2ccl, jax.lax)]
    g["outer"] = {"equal": same(outer[0](x), outer[1](x))}
    res["grad"] = g
    timing["grad"] = time.monotonic() - t

    # -- vmap over a non-named axis
    t = time.monotonic()
    vm = {}
    ops = {
        "psum": lambda M, r: M.psum(r, all_axes),
        "pmax": lambda M, r: M.pmax(r, all_axes),
        "all_gather": lambda M, r: M.all_gather(r, all_axes, axis=0, tiled=True),
        "psum_scatter": lambda M, r: M.psum_scatter(r, all_axes, scatter_dimension=0, tiled=True),
        "all_to_all": lambda M, r: M.all_to_all(r, all_axes, 0, 0, tiled=True),
    }
    for name, op in ops.items():
        progs = [smap(lambda v, M=M, op=op: jax.vmap(lambda r: op(M, r), in_axes=1, out_axes=1)(v)[None])
                 for M in (jax_r2ccl, jax.lax)]
        vm[name] = same(progs[0](x), progs[1](x))
    res["vmap"] = vm
    timing["vmap"] = time.monotonic() - t

    # -- pytree, mixed dtypes
    tree = {"a": x, "b": global_array(mesh, all_axes, [exact_block(p, "int32") for p in range(N)])}
    progs = [smap(lambda t, M=M: M.psum(t, all_axes), in_specs=({"a": spec, "b": spec},),
                  out_specs={"a": P(), "b": P()}) for M in (jax_r2ccl, jax.lax)]
    pa, pb = progs[0](tree), progs[1](tree)
    res["pytree"] = all(np.asarray(pa[k]).tobytes() == np.asarray(pb[k]).tobytes() for k in ("a", "b"))

    # -- a nested jax.jit called twice: its two calls get their own op ids
    @jax.jit
    def inner(v):
        return jax_r2ccl.psum(v, all_axes)
    nested = smap(lambda v: inner(v) + inner(v * 3))
    nested_text = nested.lower(x).as_text()
    ref_nested = smap(lambda v: 4 * jax.lax.psum(v, all_axes))
    res["nested_jit"] = {"equal": same(nested(x), ref_nested(x)),
                         "op_ids": sorted(int(i) for i in re.findall(r"op_id = (\d+)", nested_text))}

    # -- errors at trace time
    errs = {}
    x16 = global_array(mesh, all_axes, [np.ones((2, 3), np.int16) for _ in range(N)])
    for name, fn in (("psum_int16", lambda v: jax_r2ccl.psum(v, all_axes)),
                     ("all_gather_int16", lambda v: jax_r2ccl.all_gather(v, all_axes)),
                     ("psum_complex", lambda v: jax_r2ccl.psum(v.astype(jnp.complex64), all_axes)),
                     ("groups", lambda v: jax_r2ccl.psum(v, all_axes, axis_index_groups=[[0], [1]]))):
        try:
            jax.make_jaxpr(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))(x16)
            errs[name] = {"raised": False}
        except Exception as e:  # noqa: BLE001 - recorded for the test
            errs[name] = {"raised": True, "type": type(e).__name__, "r2ccl": isinstance(e, R2cclError),
                          "message": str(e)[:300]}
    res["trace_errors"] = errs

    # -- typing under check_vma: the type (shape, dtype, varying axes) of every op's result on
    #    a varying and on an invariant input, over all axes and over the first axis alone
    t = time.monotonic()
    types = {}
    sub = [all_axes] + ([(all_axes[0],)] if len(all_axes) > 1 else [])
    typing_ops = {
        "psum": lambda M, v, a: M.psum(v, a), "pmean": lambda M, v, a: M.pmean(v, a),
        "pmax": lambda M, v, a: M.pmax(v, a), "pmin": lambda M, v, a: M.pmin(v, a),
        "all_gather": lambda M, v, a: M.all_gather(v, a, axis=1),
        "all_gather_tiled": lambda M, v, a: M.all_gather(v, a, axis=0, tiled=True),
        "psum_scatter": lambda M, v, a: M.psum_scatter(v, a, scatter_dimension=0, tiled=True),
        "all_to_all": lambda M, v, a: M.all_to_all(v, a, 0, 1, tiled=True),
    }

    def typing_body(v, w):
        for M in (jax_r2ccl, jax.lax):
            for a in sub:
                for name, op in typing_ops.items():
                    for kind, inp in (("varying", v), ("invariant", w)):
                        key = f"{name}/{'+'.join(a)}/{kind}"
                        aval = jax.typeof(op(M, inp, a))
                        types.setdefault(key, {})[M.__name__] = f"{aval} varying={sorted(aval.mat.varying)}"
        return v
    w_inv = jax.device_put(np.asarray(exact_block(0, "float32")), NamedSharding(mesh, P()))
    jax.make_jaxpr(jax.shard_map(typing_body, mesh=mesh, in_specs=(spec, P()), out_specs=spec))(x, w_inv)
    res["typing"] = {k: v for k, v in types.items()}
    # psum of an invariant value is n * x (pvary first, as jax.lax does)
    progs = [smap(lambda w, M=M: [M.psum(w, all_axes)[None], M.all_gather(w, all_axes)[None]], in_specs=(P(),))
             for M in (jax_r2ccl, jax.lax)]
    res["invariant_input"] = all(same(u, v) for u, v in zip(progs[0](w_inv), progs[1](w_inv)))
    timing["typing"] = time.monotonic() - t

    # -- the lowering swap, check_vma on: plain jax.lax collectives lower to r2ccl
    t = time.monotonic()

    def lax_body(v):
        n = jax.lax.psum(1, all_axes)
        outs = [jax.lax.psum(v, all_axes), jax.lax.pmean(v, all_axes), jax.lax.pmax(v, all_axes),
                jax.lax.pmin(v, all_axes), jax.lax.all_gather(v, all_axes, axis=1),
                jax.lax.psum_scatter(v, all_axes, scatter_dimension=0, tiled=True),
                jax.lax.all_to_all(v.reshape(n, -1), all_axes, 0, 1)]
        return [o[None] for o in outs]
    ref = smap(lax_body)(x)
    with jax_r2ccl.enabled():
        f = smap(lax_body)
        text_in = f.lower(x).as_text()
        got = f(x)
    after = smap(lambda v: lax_body(v))     # traced after the block: jax.lax's lowering again
    text_after = after.lower(x).as_text()
    jax_r2ccl.install()
    jax_r2ccl.install()
    jax_r2ccl.uninstall()                   # nested: still installed
    text_nested = smap(lambda v: [jax.lax.psum(v, all_axes)[None]]).lower(x).as_text()
    jax_r2ccl.uninstall()
    xla_re = r"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all)"
    res["swap"] = {"equal": all(same(u, v) for u, v in zip(got, ref)),
                   "r2ccl_calls_inside": len(re.findall("r2ccl_collective", text_in)),
                   "xla_collectives_inside": len(re.findall(xla_re, text_in)),
                   "r2ccl_calls_after": len(re.findall("r2ccl_collective", text_after)),
                   "xla_collectives_after": len(re.findall(xla_re, text_after)),
                   "nested_install_r2ccl_calls": len(re.findall("r2ccl_collective", text_nested))}
    timing["swap"] = time.monotonic() - t
    res["seconds"] = {k: round(v, 2) for k, v in timing.items()}
    return res


XLA_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all",
                   "stablehlo.collective_permute")


def against_jax(progs: dict) -> dict:
    """Each program {name: (jitted f, arg)} run by jax alone, then with the lowering swap on
    (traced afresh): per name, whether every addressable shard of the result is equal bit for
    bit (dtype and bytes), how many r2ccl custom calls and XLA collectives its lowering holds,
    or what it raised. Then the swap's fallbacks, named."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    res = {}
    for name, (f, arg) in progs.items():
        ref = f(arg)
        ref_shards = {s.device.id: np.asarray(s.data) for s in jax.tree.leaves(ref)[0].addressable_shards}
        jax.clear_caches()
        out = {}
        try:
            with jax_r2ccl.enabled():
                text = f.lower(arg).as_text()
                got = f(arg)
            got_shards = {s.device.id: np.asarray(s.data) for s in jax.tree.leaves(got)[0].addressable_shards}
            out["equal"] = got_shards.keys() == ref_shards.keys() and all(
                got_shards[k].dtype == v.dtype and got_shards[k].tobytes() == v.tobytes() for k, v in ref_shards.items())
            out["r2ccl_calls"] = text.count("r2ccl_collective")
            out["xla_collectives"] = sum(text.count(c) for c in XLA_COLLECTIVES)
            if not out["equal"]:
                out["shardings"] = [str(jax.tree.leaves(a)[0].sharding) for a in (ref, got)]
                out["shapes"] = [sorted((k, v.shape) for k, v in d.items()) for d in (ref_shards, got_shards)]
        except Exception as e:   # the defect under test: the swap raised where jax alone runs
            out["raised"] = f"{type(e).__name__}: {e}"
        jax.clear_caches()
        res[name] = out
    res["fallbacks"] = sorted(f"{op}: {why}" for (op, why) in jax_r2ccl.swap_fallbacks())
    return res


def swap_transparent(rank, world, local):
    """Programs the lowering swap cannot serve on jax_r2ccl, each beside a collective it does
    serve in the same program (axis_index_groups that are not equal blocks, a dtype jax_r2ccl
    does not move, an abstract mesh): with the swap on every one runs, equals jax's own result bit
    for bit, keeps jax's lowering for what falls back (named in jax_r2ccl.swap_fallbacks()) and
    r2ccl's for the rest."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    devs = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    N = devs.size
    flat = Mesh(devs, ("i",))
    blocks = [exact_block(p, "float32", seed=5) for p in range(N)]
    xf = global_array(flat, ("i",), blocks)
    uneven = [[0], list(range(1, N))]

    def on(mesh, f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))

    progs = {
        "uneven_groups": (on(flat, lambda v: jax.lax.psum(v, "i", axis_index_groups=uneven) + jax.lax.psum(v, "i")), xf),
        "complex_psum": (on(flat, lambda v: jnp.real(jax.lax.psum(v.astype(jnp.complex64) * (1 + 1j), "i"))
                            + jax.lax.psum(v, "i")), xf),
        "abstract_mesh": (on(flat.abstract_mesh, lambda v: jax.lax.psum(v, "i")), xf),
    }
    res = against_jax(progs)
    for name, n in {"uneven_groups": 1, "complex_psum": 1, "abstract_mesh": 0}.items():
        res[name]["expect_r2ccl"] = n
    return res


def ppermute_cases(rank, world, local):
    """jax.lax.ppermute under the lowering swap against jax's own, bit for bit: rings both
    ways, shifts, pairs, partial permutations (zeros where nothing arrives), a fixed point,
    over one axis and over both axes of a 2-D mesh, several dtypes, a pytree, inside
    lax.scan, under grad (the transpose is the inverse permutation) and vmap; every program
    lowered with r2ccl custom calls and no collective_permute left."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    devs = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    N = devs.size
    flat = Mesh(devs, ("i",))
    rows = world if world > 1 else 2     # (one process: two rows of its devices)
    grid = Mesh(devs.reshape(rows, N // rows), ("p", "l"))
    xs = {dt: global_array(flat, ("i",), [exact_block(p, dt, seed=9) for p in range(N)])
          for dt in ("float32", "bfloat16", "int64", "bool")}
    xg = global_array(grid, ("p", "l"), [exact_block(p, "float32", seed=9) for p in range(N)])
    fwd = [(j, (j + 1) % N) for j in range(N)]
    back = [(j, (j - 1) % N) for j in range(N)]
    shift2 = [(j, (j + 2) % N) for j in range(N)]
    pairs = [(j, j ^ 1) for j in range(N)]
    partial = [(0, N - 1), (N - 1, 1)] if N > 2 else [(0, 1)]
    fixed = [(1, 1), (0, 2)] if N > 2 else [(1, 1)]

    def on(mesh, axes, f, check_vma=True):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(axes), out_specs=P(axes), check_vma=check_vma))

    def scan_body(v):
        def step(c, _):
            return jax.lax.ppermute(c, "i", fwd) * 0.5 + c, None
        return jax.lax.scan(step, v, None, length=3)[0]

    x = xs["float32"]
    progs = {
        "ring_fwd": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", fwd)), x),
        "ring_back": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", back)), x),
        "shift2": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", shift2)), x),
        "pairs": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", pairs)), x),
        "partial": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", partial)), x),
        "fixed_point": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", fixed)), x),
        "bfloat16": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", fwd)), xs["bfloat16"]),
        "int64": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", back)), xs["int64"]),
        "bool": (on(flat, "i", lambda v: jax.lax.ppermute(v, "i", pairs)), xs["bool"]),
        "pytree": (on(flat, "i", lambda v: sum(jax.lax.ppermute({"a": v, "b": v * 3}, "i", fwd).values())), x),
        "grid_p": (on(grid, ("p", "l"), lambda v: jax.lax.ppermute(v, "p", [(j, (j + 1) % rows) for j in range(rows)])),
                   xg),
        "grid_pl": (on(grid, ("p", "l"), lambda v: jax.lax.ppermute(v, ("p", "l"), back)), xg),
        "scan": (on(flat, "i", scan_body), x),
        "grad": (jax.jit(jax.grad(lambda w: jnp.sum(on(flat, "i", lambda v: jax.lax.ppermute(v * v, "i", shift2))(w)
                                                  * jnp.arange(w.size, dtype=w.dtype).reshape(w.shape)))), x),
        "vmap": (jax.jit(jax.vmap(on(flat, "i", lambda v: jax.lax.ppermute(v, "i", fwd)), in_axes=1, out_axes=1)),
                 jax.jit(lambda v: jnp.stack([v, v * 2], axis=1))(x)),
    }
    return against_jax(progs)


def groups_and_partly_manual_cases(rank, world, local):
    """axis_index_groups and partly-manual shard_maps under the lowering swap against jax's own,
    bit for bit: groups in and against rank order, strided, over two axes, on psum, pmax,
    pmin, all_gather (tiled and not, another axis), psum_scatter and all_to_all, under grad and
    in scan; shard_maps manual over one axis of a 2-D mesh (the other automatic, the input
    sharded over it or not) on every op, ppermute, grad, groups, and jax.vmap of a shard_map;
    jax_r2ccl's own psum and all_gather in a partly-manual shard_map. Every program lowered
    with r2ccl custom calls and no XLA collective, nothing fallen back."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    devs = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    N = devs.size
    flat = Mesh(devs, ("i",))
    grid = Mesh(devs.reshape(2, N // 2), ("a", "b"))
    blocks = [exact_block(p, "float32", seed=11) for p in range(N)]
    x = global_array(flat, ("i",), blocks)
    xg = global_array(grid, ("a", "b"), blocks)
    pairs = [list(range(g, g + 2)) for g in range(0, N, 2)]           # [[0, 1], [2, 3], ..]
    rev_pairs = [g[::-1] for g in pairs]                                  # [[1, 0], [3, 2], ..]
    strided = [list(range(g, N, 2)) for g in range(2)]                  # [[0, 2, ..], [1, 3, ..]]
    b_groups = [list(range(N // 2))[::-1]] if N // 2 < 4 else [[3, 0], [1, 2]] + [[j, j + 1] for j in range(4, N // 2, 2)]

    def on(f, check_vma=False):
        return jax.jit(jax.shard_map(f, mesh=flat, in_specs=P("i"), out_specs=P("i"), check_vma=check_vma))

    # (the results' shardings over the automatic axis are the partitioner's choice: fixed here, so
    # that jax's and the swap's results compare shard by shard)
    def manual_a(f, in_specs=P("a"), out_specs=P()):
        g = jax.shard_map(f, mesh=grid, in_specs=in_specs, out_specs=out_specs, axis_names={"a"}, check_vma=False)
        return jax.jit(g, out_shardings=NamedSharding(grid, out_specs))

    def scan_body(v):
        def step(c, _):
            return jax.lax.psum(c, "i", axis_index_groups=rev_pairs) * 0.25 + c, None
        return jax.lax.scan(step, v, None, length=3)[0]

    progs = {
        "psum_pairs": (on(lambda v: jax.lax.psum(v, "i", axis_index_groups=pairs)), x),
        "pmax_strided": (on(lambda v: jax.lax.pmax(v, "i", axis_index_groups=strided)), x),
        "pmin_rev_pairs": (on(lambda v: jax.lax.pmin(v, "i", axis_index_groups=rev_pairs)), x),
        "all_gather_rev_pairs": (on(lambda v: jax.lax.all_gather(v, "i", axis_index_groups=rev_pairs)
                                    .reshape(-1, v.shape[1])), x),
        "all_gather_tiled_axis1": (on(lambda v: jax.lax.all_gather(v, "i", axis_index_groups=strided, axis=1, tiled=True)
                                      .reshape(-1, v.shape[1])), x),
        "psum_scatter_rev_pairs": (on(lambda v: jnp.tile(jax.lax.psum_scatter(v, "i", axis_index_groups=rev_pairs,
                                                                               tiled=True), (2, 1))), x),
        "all_to_all_strided": (on(lambda v: jax.lax.all_to_all(v, "i", 0, 0, axis_index_groups=strided, tiled=True)), x),
        "grid_groups": (jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, ("a", "b"), axis_index_groups=strided),
                                              mesh=grid, in_specs=P(("a", "b")), out_specs=P(("a", "b")),
                                              check_vma=False)), xg),
        "grid_b_groups": (jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "b", axis_index_groups=b_groups), mesh=grid,
                                                in_specs=P(("a", "b")), out_specs=P(("a", "b")), check_vma=False)), xg),
        "groups_grad": (jax.jit(jax.grad(lambda w: jnp.sum(on(lambda v: jax.lax.psum(v * v, "i", axis_index_groups=strided))(w)
                                                           * jnp.arange(w.size, dtype=w.dtype).reshape(w.shape)))), x),
        "groups_scan": (on(scan_body), x),
        "pm_psum": (manual_a(lambda v: jax.lax.psum(v, "a")), xg),
        "pm_psum_b_replicated": (manual_a(lambda v: jax.lax.psum(v * 2, "a")),
                                 jax.device_put(xg, NamedSharding(grid, P("a")))),
        "pm_pmax": (manual_a(lambda v: jax.lax.pmax(v, "a")), xg),
        "pm_all_gather": (manual_a(lambda v: jax.lax.all_gather(v, "a", tiled=True), out_specs=P("a")), xg),
        "pm_psum_scatter": (manual_a(lambda v: jax.lax.psum_scatter(v, "a", tiled=True), out_specs=P("a")), xg),
        "pm_all_to_all": (manual_a(lambda v: jax.lax.all_to_all(v, "a", 0, 0, tiled=True), out_specs=P("a")), xg),
        "pm_ppermute": (manual_a(lambda v: jax.lax.ppermute(v, "a", [(0, 1), (1, 0)]), out_specs=P("a")), xg),
        "pm_manual_b_groups": (jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "b", axis_index_groups=b_groups),
                                                     mesh=grid, in_specs=P("b"), out_specs=P("b"), axis_names={"b"},
                                                     check_vma=False), out_shardings=NamedSharding(grid, P("b"))), x),
        "pm_grad": (jax.jit(jax.grad(lambda w: jnp.sum(manual_a(lambda v: jax.lax.psum(v * v, "a"))(w)
                                                       * jnp.arange(w.size // 2, dtype=w.dtype).reshape(-1, w.shape[1])))),
                    xg),
        "vmap_of_shard_map": (jax.jit(jax.vmap(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=flat, in_specs=P("i"),
                                                             out_specs=P()), in_axes=1, out_axes=1)), x),
    }
    res = against_jax(progs)
    # jax_r2ccl's own functions in a partly-manual shard_map, against jax.lax's without the swap
    import jax_r2ccl
    for name, own, ref in [("own_psum", lambda v: jax_r2ccl.psum(v, "a"), lambda v: jax.lax.psum(v, "a")),
                           ("own_all_gather", lambda v: jax_r2ccl.all_gather(v, "a", axis=1, tiled=True),
                            lambda v: jax.lax.all_gather(v, "a", axis=1, tiled=True))]:
        f, g = manual_a(own), manual_a(ref)
        text = f.lower(xg).as_text()
        a, b = f(xg), g(xg)
        res[name] = {"equal": all(np.asarray(sa.data).tobytes() == np.asarray(sb.data).tobytes()
                                  for sa, sb in zip(a.addressable_shards, b.addressable_shards)),
                     "r2ccl_calls": text.count("r2ccl_collective"),
                     "xla_collectives": sum(text.count(c) for c in XLA_COLLECTIVES)}
    return res


def ragged_cases(rank, world, local):
    """jax.lax.ragged_all_to_all under the lowering swap (XLA:CPU has no ragged-all-to-all of its
    own: jax alone raises UNIMPLEMENTED) against its docstring's semantics computed in numpy, bit
    for bit: over the flat mesh and over one axis of a 2-D mesh (a group per row), 1-D and 2-D
    rows, several dtypes, int32 and int64 offsets, slices of every size (zero included), several
    per peer, inside jit with work around it, and under grad (jax transposes it into another
    ragged_all_to_all, and all_to_all of the offsets, both on the rails). Every program lowered
    with r2ccl custom calls and no XLA collective."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from workers import ragged_layout, ragged_reference
    devs = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    N = devs.size
    flat = Mesh(devs, ("i",))
    grid = Mesh(devs.reshape(world, local), ("p", "l"))

    def case(mesh, axes, over, dtype, in_rows, row, spr, max_rows, idx, seed, grad=False):
        n = int(np.prod([mesh.shape[a] for a in over]))
        G = N // n
        if grad:   # a sender's slices side by side in its input
            max_rows = min(max_rows, in_rows // (n * spr))
        layouts = [ragged_layout(1, n, in_rows, spr, max_rows, seed + g, disjoint_inputs=grad) for g in range(G)]
        out_rows = max(m for _, m in layouts)
        rng = np.random.default_rng(seed)
        ins = [(rng.integers(-8, 9, (in_rows,) + row) * 0.5).astype(np_dtype(dtype)) for _ in range(N)]
        inits = [(rng.integers(-8, 9, (out_rows,) + row) * 0.5).astype(np_dtype(dtype)) for _ in range(N)]
        # at[g][r]: the flat mesh position of rank r of group g (the other axes, then `over`)
        names = list(mesh.axis_names)
        order = [names.index(a) for a in names if a not in over] + [names.index(a) for a in over]
        at = np.arange(N).reshape(mesh.devices.shape).transpose(order).reshape(G, n)
        sl, ref = [None] * N, [None] * N
        for g in range(G):
            outs = ragged_reference([ins[q] for q in at[g]], [inits[q] for q in at[g]], layouts[g][0], spr)
            for r, q in enumerate(at[g]):
                sl[q], ref[q] = layouts[g][0][r], outs[r]
        arrays = [global_array(mesh, axes, ins), global_array(mesh, axes, inits)] + [
            global_array(mesh, axes, [np.asarray(sl[q][j], idx) for q in range(N)]) for j in range(4)]
        body = lambda *a: jax.lax.ragged_all_to_all(*a, axis_name=over)    # noqa: E731
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P(axes), check_vma=False))
        want = ref
        if grad:   # d/d operand of sum(result * w), w = the output rows' positions: numpy's own transpose
            w = [np.arange(out_rows * int(np.prod(row)), dtype=np.float32).reshape((out_rows,) + row) for _ in range(N)]
            arrays.append(global_array(mesh, axes, w))
            f = jax.jit(jax.grad(lambda op, *rest: jnp.sum(jax.shard_map(
                body, mesh=mesh, in_specs=P(axes), out_specs=P(axes), check_vma=False)(op, *rest[:-1]) * rest[-1])))
            want = [np.zeros_like(x) for x in ins]
            for g in range(G):
                for a in range(n):
                    in_off, send, out_off, _ = layouts[g][0][a]
                    for k in range(len(send)):
                        b = at[g][k // spr]
                        want[at[g][a]][in_off[k]:in_off[k] + send[k]] += w[b][out_off[k]:out_off[k] + send[k]]
        pos = {d.id: q for q, d in enumerate(mesh.devices.flat)}
        out = {}
        try:
            with jax_r2ccl.enabled():
                text = f.lower(*arrays).as_text()
                got = f(*arrays)
            out["equal"] = all(np.asarray(s.data).dtype == want[pos[s.device.id]].dtype and
                               np.asarray(s.data).tobytes() == want[pos[s.device.id]].tobytes()
                               for s in got.addressable_shards)
            out["r2ccl_calls"] = text.count("r2ccl_")
            out["xla_collectives"] = sum(text.count(c) for c in XLA_COLLECTIVES) + text.count("@ragged_all_to_all")
        except Exception as e:   # noqa: BLE001
            out["raised"] = f"{type(e).__name__}: {e}"
        jax.clear_caches()
        return out

    res = {
        "flat_f32": case(flat, ("i",), ("i",), "float32", 24, (), 1, 6, np.int32, 1),
        "flat_rows_bf16_two_per_peer": case(flat, ("i",), ("i",), "bfloat16", 20, (3,), 2, 4, np.int64, 2),
        "flat_int32_rows": case(flat, ("i",), ("i",), "int32", 16, (2, 2), 1, 5, np.int32, 3),
        "grid_over_l": case(grid, ("p", "l"), ("l",), "float32", 18, (2,), 2, 4, np.int32, 4),
        "grid_over_p": case(grid, ("p", "l"), ("p",), "float32", 18, (2,), 1, 6, np.int64, 5),
        "grad": case(flat, ("i",), ("i",), "float32", 16, (2,), 1, 3, np.int32, 6, grad=True),
    }
    res["fallbacks"] = sorted(f"{op}: {why}" for (op, why) in jax_r2ccl.swap_fallbacks())
    return res


def _barrier(name):
    from jax_r2ccl._compat.jax_kv import distributed_client
    distributed_client().wait_at_barrier("r2ccl-test-" + name, 60_000)


def mismatch(rank, world, local, sizes=(4, 6)):
    """Process r feeds a psum of sizes[r] elements per device: an error on every process,
    bounded by R2CCL_TIMEOUT; then the process's life after the error."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    mesh, all_axes = make_mesh(world, local)
    N = mesh.devices.size
    k = sizes[rank % len(sizes)]
    x = global_array(mesh, all_axes, [np.ones((1, k), np.float32) for _ in range(N)])
    f = jax.jit(jax.shard_map(lambda v: jax_r2ccl.psum(v, all_axes), mesh=mesh, in_specs=P(all_axes),
                              out_specs=P(all_axes)))
    t0 = time.monotonic()
    out = {"error": None}
    try:
        np.asarray(jax.block_until_ready(f(x)).addressable_shards[0].data)
    except Exception as e:  # noqa: BLE001 - the expected outcome
        out["error"] = f"{type(e).__name__}: {e}"[:600]
    out["seconds"] = round(time.monotonic() - t0, 2)
    # life after the error: a well-formed psum on the same processes
    _barrier("after-mismatch")
    y = global_array(mesh, all_axes, [np.full((1, 8), p + 1.0, np.float32) for p in range(N)])
    try:
        r = jax.block_until_ready(f(y))
        out["after"] = {"ok": True, "value": float(np.asarray(r.addressable_shards[0].data).ravel()[0]),
                        "expected": float(N * (N + 1) / 2)}
    except Exception as e:  # noqa: BLE001 - reported
        out["after"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return out


def mixed_program(rank, world, local, n=1 << 20, rounds=5):
    """An r2ccl psum followed by XLA's own psum in one program, several local devices: the
    XLA collective must not run on (and block) the r2ccl executor's thread."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))), ("x",))
    ndev = mesh.devices.size

    def body(v):
        return jax.lax.psum(jax_r2ccl.psum(v, "x") * v, "x")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False))
    g = jax.jit(jax.shard_map(lambda v: jax.lax.psum(jax.lax.psum(v, "x") * v, "x"), mesh=mesh, in_specs=P("x"),
                              out_specs=P(), check_vma=False))
    blocks = [np.full(n, (p % 3) + 1, np.float32) for p in range(ndev)]
    x = jax.make_array_from_callback((n * ndev,), NamedSharding(mesh, P("x")),
                                     lambda idx: blocks[idx[0].start // n])
    ok = True
    t0 = time.monotonic()
    for _ in range(rounds):
        a = np.asarray(f(x).addressable_shards[0].data)
        b = np.asarray(g(x).addressable_shards[0].data)
        ok = ok and np.array_equal(a, b)
    return {"equal": bool(ok), "seconds": time.monotonic() - t0}


def _custom_calls(text):
    """The r2ccl custom calls of a lowered module's text, each with what follows it (its
    attributes and types), in program order."""
    import re
    out = []
    for m in re.finditer(r'stablehlo\.custom_call @r2ccl_collective\(([^)]*)\)(.*)', text):
        out.append({"operands": m.group(1), "rest": m.group(2)})
    return out


def cuda_lowering(rank, world, local):
    """Every jax_r2ccl collective, and jax.lax's under the lowering swap, lowered for the CUDA
    platform (no GPU needed): the r2ccl custom call with its three operands, attributes,
    side effect and row-major layouts, identical to the CPU lowering of the same program."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    mesh, all_axes = make_mesh(world, local)
    n = mesh.devices.size
    ax = all_axes
    progs = {
        "psum": lambda v: jax_r2ccl.psum(v, ax),
        "pmean": lambda v: jax_r2ccl.pmean(v, ax),
        "pmax": lambda v: jax_r2ccl.pmax(v, ax),
        "pmin": lambda v: jax_r2ccl.pmin(v, ax),
        "all_gather": lambda v: jax_r2ccl.all_gather(v, ax, tiled=True)[:v.shape[0]],
        "psum_scatter": lambda v: jnp.tile(jax_r2ccl.psum_scatter(v, ax, tiled=True), (n, 1)),
        "all_to_all": lambda v: jax_r2ccl.all_to_all(v, ax, 0, 0, tiled=True),
        "swap:psum": lambda v: jax.lax.psum(v, ax),
        "swap:all_gather": lambda v: jax.lax.all_gather(v, ax, tiled=True)[:v.shape[0]],
        "swap:psum_scatter": lambda v: jnp.tile(jax.lax.psum_scatter(v, ax, tiled=True), (n, 1)),
    }
    out = {}
    for dtype in ("float32", "bfloat16", "int32", "float64"):
        x = jax.device_put(np.zeros((4 * n, 8), np_dtype(dtype)), NamedSharding(mesh, P(ax)))
        for name, body in progs.items():
            if dtype != "float32" and name.startswith("swap:"):
                continue
            f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(ax), out_specs=P(ax), check_vma=False))
            texts = {}
            for plat in ("cuda", "cpu"):
                if name.startswith("swap:"):
                    with jax_r2ccl.enabled():
                        texts[plat] = f.trace(x).lower(lowering_platforms=(plat,)).as_text()
                else:
                    texts[plat] = f.trace(x).lower(lowering_platforms=(plat,)).as_text()
            out[f"{name}/{dtype}"] = {p: _custom_calls(t) for p, t in texts.items()}
    return out


def ffi_boundary(rank, world, local):
    """The FFI boundary on CPU: exceptions thrown inside the handler (a std::exception, an
    r2ccl::Error, something else) and result buffers of the wrong size become
    JaxRuntimeErrors naming the cause, on every local device, without a crash or a hang, and
    the process's next collective is exact."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from jax_r2ccl import _core
    from jax_r2ccl._src import lowering, runtime
    mesh, all_axes = make_mesh(world, local)
    N = mesh.devices.size
    x = global_array(mesh, all_axes, [np.full((1, 16), p + 1.0, np.float32) for p in range(N)])
    f = jax.jit(jax.shard_map(lambda v: jax_r2ccl.psum(v, all_axes), mesh=mesh, in_specs=P(all_axes),
                              out_specs=P(all_axes)))
    want = float(N * (N + 1) / 2)
    out = {}

    def attempt(fn, arg):
        t0 = time.monotonic()
        try:
            r = jax.block_until_ready(fn(arg))
            return {"error": None, "value": float(np.asarray(r.addressable_shards[0].data).ravel()[0]),
                    "seconds": round(time.monotonic() - t0, 2)}
        except Exception as e:  # noqa: BLE001 - the expected outcome
            return {"error": f"{type(e).__name__}: {e}"[:600], "seconds": round(time.monotonic() - t0, 2)}

    out["before"] = attempt(f, x)
    for what in ("std", "error", "other"):
        _core.testing_throw_in_next_handler(what)
        out[what] = attempt(f, x)
        out[what + "_after"] = attempt(f, x)

    # A hand-written call whose result buffer is one element short (or of another dtype) of
    # what the all-reduce writes: refused before anything is written.
    comm = lowering._comm(mesh, tuple(all_axes))
    comm_id = comm.register()

    def raw(out_shape, out_dtype):
        def body(v):
            pid = jax.lax.axis_index(all_axes)
            g, r = jnp.int32(0), pid.astype(jnp.int32)
            call = jax.ffi.ffi_call(runtime.FFI_TARGET, jax.ShapeDtypeStruct(out_shape, out_dtype),
                                    has_side_effect=True)
            return call(v, g, r, comm_id=comm_id, op_id=9999, kind=lowering.KIND["all_reduce"],
                        reduce_op=lowering.REDUCE["sum"], root=0)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(all_axes), out_specs=P(all_axes),
                                     check_vma=False))

    out["short_result"] = attempt(raw((1, 15), np.float32), x)
    out["wrong_dtype_result"] = attempt(raw((1, 16), np.int32), x)
    out["after_all"] = attempt(f, x)
    out["want"] = want
    return out


# ---------------------------------------------------------------------------- GPU platform
# These run where the processes' JAX platform is "cuda" (tests/test_gpu.py); they compare
# against a host reference in canonical order, never against jax.lax (NCCL refuses two
# processes on one GPU, the usual shape of a one-GPU check machine).

def _mesh_1d():
    jax, jnp, Mesh, NamedSharding, P = _jax()
    devs = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    return Mesh(devs, ("x",)), [int(d.process_index) for d in devs]


def _per_rank_array(mesh, blocks):
    """A (n * count,) array sharded over "x" whose block r is blocks[r]."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    count = blocks[0].size
    return jax.make_array_from_callback((len(blocks) * count,), NamedSharding(mesh, P("x")),
                                        lambda idx: blocks[(idx[0].start or 0) // count])


def gpu_matrix(rank, world, local, sizes=(1000, 3_000_001)):
    """Every op x dtype on the GPUs of every process, bit for bit against the canonical-order
    host reference; the large size runs in several staging chunks."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from workers import _rank_input, host_reference
    mesh, proc_of = _mesh_1d()
    n = len(proc_of)
    ops = {"psum": ("all_reduce", "sum", lambda v: jax_r2ccl.psum(v, "x")),
           "pmax": ("all_reduce", "max", lambda v: jax_r2ccl.pmax(v, "x")),
           "pmin": ("all_reduce", "min", lambda v: jax_r2ccl.pmin(v, "x")),
           "all_gather": ("all_gather", "sum", lambda v: jax_r2ccl.all_gather(v, "x", tiled=True)),
           "psum_scatter": ("reduce_scatter", "sum", lambda v: jax_r2ccl.psum_scatter(v, "x", tiled=True)),
           "all_to_all": ("all_to_all", "sum", lambda v: jax_r2ccl.all_to_all(v, "x", 0, 0, tiled=True))}
    bad, ran = [], 0
    for size in sizes:
        for dtype in DTYPES + ["bool"]:
            if size > 1000 and dtype not in ("float32", "bfloat16"):
                continue
            for name, (kind, op, body) in ops.items():
                if dtype == "bool" and name not in ("pmax", "pmin", "all_gather", "all_to_all"):
                    continue
                count = size - size % n if kind in ("reduce_scatter", "all_to_all") else size
                ins = [_rank_input(kind, dtype, count, r, seed=ran) for r in range(n)]
                x = _per_rank_array(mesh, ins)
                f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
                got = jax.block_until_ready(f(x))
                ref = host_reference(kind, op, ins, proc_of)
                for shard in got.addressable_shards:
                    r = int(mesh.devices.tolist().index(shard.device))
                    o = np.asarray(shard.data)
                    if o.tobytes() != ref[r].tobytes():
                        bad.append({"op": name, "dtype": dtype, "size": count, "rank": r})
                ran += 1
    return {"bad": bad, "ran": ran}


def gpu_smoke(rank, world, local, chunk_bytes=4 << 20):
    """The GPU check's first collectives, cheapest first, each bit for bit against the host
    reference: an 8-byte psum (the small path), a psum of three staging chunks and one
    element (the pipeline, its last chunk short), an all_gather, a psum_scatter, and a psum
    of a matmul's result. Each runs twice (compile, then a timed call). Returns what ran,
    what was wrong, the times."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from workers import _rank_input, host_reference
    mesh, proc_of = _mesh_1d()
    n = len(proc_of)
    big = 3 * (chunk_bytes // 4) + 1
    cases = [("psum 8 B", "all_reduce", 2, lambda v: jax_r2ccl.psum(v, "x")),
             (f"psum {big * 4} B", "all_reduce", big, lambda v: jax_r2ccl.psum(v, "x")),
             ("all_gather", "all_gather", 1000, lambda v: jax_r2ccl.all_gather(v, "x", tiled=True)),
             ("psum_scatter", "reduce_scatter", n * 1000, lambda v: jax_r2ccl.psum_scatter(v, "x", tiled=True))]
    # A program with a dot: on a GPU its kernel is autotuned, and processes whose autotuning
    # differs compile different programs (different run ids; bench/gpu_smoke.py names the
    # fix). Small integers keep the product exact on any hardware (TF32 included).
    k = 64

    def matmul_psum(v):
        a = v.reshape(k, k)
        return jax_r2ccl.psum((a @ a.T).reshape(-1), "x")
    cases.append(("psum of a matmul", "matmul", k * k, matmul_psum))
    out = {"ran": [], "bad": [], "seconds": {}}
    rng = np.random.default_rng(11)
    for name, kind, count, body in cases:
        if kind == "matmul":
            mats = [rng.integers(-2, 3, (k, k)).astype(np.float32) for _ in range(n)]
            ins = [m.reshape(-1) for m in mats]
            kind, ins_ref = "all_reduce", [(m.astype(np.float64) @ m.T.astype(np.float64)).astype(np.float32)
                                            .reshape(-1) for m in mats]
        else:
            ins = ins_ref = [_rank_input(kind, "float32", count, r, seed=11) for r in range(n)]
        x = _per_rank_array(mesh, ins)
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
        jax.block_until_ready(f(x))
        t0 = time.monotonic()
        got = jax.block_until_ready(f(x))
        out["seconds"][name] = round(time.monotonic() - t0, 6)
        ref = host_reference(kind, "sum", ins_ref, proc_of)
        for shard in got.addressable_shards:
            r = int(mesh.devices.tolist().index(shard.device))
            if np.asarray(shard.data).tobytes() != ref[r].tobytes():
                out["bad"].append({"case": name, "rank": r})
        out["ran"].append(name)
    return out


def gpu_rail_fault(rank, world, local, count=16 << 20, rate=40e6, wait_s=20.0):
    """A rail taken down while a 64 MiB psum of GPU buffers is on the wire: the result is
    bit-exact, the rail is seen failing, and the fault provably landed inside the collective:
    the program is compiled first, then process 0 waits (bounded) until the rail to process
    1 holds unacknowledged bytes of it and closes it there; the close reports the bytes the
    rail held (they move to the other rails), and the re-sent chunks are counted."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from jax_r2ccl._src import runtime
    from workers import _rank_input, host_reference
    mesh, proc_of = _mesh_1d()
    n = len(proc_of)
    ep = runtime.current().endpoint
    for peer in range(world):
        if peer != rank:
            for s in ep.rail_stats(peer):
                ep.inject(peer, s["rail"], "rate", rate)
    ins = [_rank_input("all_reduce", "float32", count, r, seed=5) for r in range(n)]
    x = _per_rank_array(mesh, ins)
    f = jax.jit(jax.shard_map(lambda v: jax_r2ccl.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False)).lower(x).compile()
    fault = {"unacked_bytes": 0, "waited_s": None, "resent_chunks": 0}
    resent_before = sum(s["retransmitted_chunks"] for s in ep.rail_stats(1)) if rank == 0 and world > 1 else 0

    def take_down():
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait_s:
            if ep.rail_stats(1)[1]["inflight_bytes"] > 0:
                fault["waited_s"] = round(time.monotonic() - t0, 4)
                fault["unacked_bytes"] = ep.inject(1, 1, "close")["unacked_bytes"]
                return
            time.sleep(0.0002)

    _barrier("gpu-fault-start")
    taker = None
    if rank == 0 and world > 1:
        taker = threading.Thread(target=take_down)
        taker.start()
    got = jax.block_until_ready(f(x))
    if taker:
        taker.join()
        fault["resent_chunks"] = sum(s["retransmitted_chunks"] for s in ep.rail_stats(1)) - resent_before
    ref = host_reference("all_reduce", "sum", ins, proc_of)
    bad = [int(mesh.devices.tolist().index(s.device)) for s in got.addressable_shards
           if np.asarray(s.data).tobytes() != ref[0].tobytes()]
    failures = sum(s["failures"] for p in range(world) if p != rank for s in ep.rail_stats(p))
    return {"bad": bad, "rail_failures": failures, "fault": fault}


def gpu_train_step(rank, world, local, steps=4):
    """A data-parallel training step on the GPUs with plain jax.lax.psum under the lowering
    swap: the program holds the r2ccl custom call and no XLA all-reduce; each step's summed
    gradient equals the canonical host fold of the devices' own gradients, bit for bit; every
    device ends with the same parameters; the loss goes down."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    from workers import _fold
    mesh, proc_of = _mesh_1d()
    n = len(proc_of)
    rng = np.random.default_rng(3)
    d_in, d_out, per = 64, 16, 32
    w_true = rng.standard_normal((d_in, d_out)).astype(np.float32)
    xs = rng.standard_normal((n * per, d_in)).astype(np.float32)
    ys = xs @ w_true
    # Every process builds its own shards (jax.device_put of a global array would check the
    # processes agree with an XLA all-gather: NCCL, which two processes on one GPU cannot run).
    w0 = np.zeros((n * d_in, d_out), np.float32)   # replicated by hand: one block per device
    X, Y, w = (jax.make_array_from_callback(a.shape, NamedSharding(mesh, P("x")), lambda idx, a=a: a[idx])
               for a in (xs, ys, w0))

    def loss(wl, xl, yl):
        return jnp.mean((xl @ wl - yl) ** 2)

    def step(wl, xl, yl):
        lv, g = jax.value_and_grad(loss)(wl, xl, yl)
        gs = jax.lax.psum(g, "x")
        return wl - 0.0625 * (gs * 0.5), g, gs, jnp.reshape(lv, (1,))

    with jax_r2ccl.enabled():
        f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("x"), P("x"), P("x")),
                                  out_specs=(P("x"), P("x"), P("x"), P("x")), check_vma=False))
        f = f.lower(w, X, Y).compile()   # what runs below is the program inspected here
        hlo = f.as_text()
    out = {"custom_call": "r2ccl_collective" in hlo, "xla_all_reduce": "all-reduce" in hlo or "all_reduce" in hlo,
           "bad_sums": [], "losses": [], "params_differ": False}
    for it in range(steps):
        w, g, gs, lv = jax.block_until_ready(f(w, X, Y))
        local_g = {int(mesh.devices.tolist().index(s.device)): np.asarray(s.data) for s in g.addressable_shards}
        # every process's local gradients, through the coordination service
        from jax_r2ccl._compat.jax_kv import distributed_client
        cl = distributed_client()
        for r, a in local_g.items():
            cl.key_value_set_bytes(f"r2ccl-test-g/{it}/{r}", a.tobytes())
        allg = [np.frombuffer(cl.blocking_key_value_get_bytes(f"r2ccl-test-g/{it}/{r}", 60_000), np.float32)
                .reshape(d_in, d_out) for r in range(n)]
        procs = list(dict.fromkeys(proc_of))
        partial = [_fold("sum", [allg[r] for r in range(n) if proc_of[r] == p]) for p in procs]
        want = _fold("sum", partial)
        for s in gs.addressable_shards:
            if np.asarray(s.data).tobytes() != want.tobytes():
                out["bad_sums"].append(it)
        ws = [np.asarray(s.data).tobytes() for s in w.addressable_shards]
        out["params_differ"] |= len(set(ws)) > 1
        out["losses"].append(float(np.asarray(lv.addressable_shards[0].data)[0]))
    out["param_digest"] = digest(np.asarray(w.addressable_shards[0].data))
    return out


def gpu_subnormals(rank, world, local):
    """Where GPU and CPU arithmetic differ: jax_r2ccl reduces with XLA CPU's rules on both
    platforms (float32 subnormals read as zero), while XLA:GPU's own add keeps them. Returns
    both, from the same GPU program inputs."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    mesh, proc_of = _mesh_1d()
    n = len(proc_of)
    tiny = np.float32(1e-45)   # the smallest float32 subnormal
    x = _per_rank_array(mesh, [np.full(4, tiny, np.float32) for _ in range(n)])
    f = jax.jit(jax.shard_map(lambda v: (jax_r2ccl.psum(v, "x"), v + v), mesh=mesh, in_specs=P("x"),
                              out_specs=(P("x"), P("x")), check_vma=False))
    s, d = jax.block_until_ready(f(x))
    return {"r2ccl_psum": float(np.asarray(s.addressable_shards[0].data)[0]),
            "xla_gpu_add": float(np.asarray(d.addressable_shards[0].data)[0])}


def many_in_flight(rank, world, local, n=1000, size=16):
    """`n` independent small psums in one jitted program (no data dependence between them,
    so XLA may issue them all before any completes): every result equal to XLA's psum of the
    same input, and the most collectives this process's executor held at once."""
    jax, jnp, Mesh, NamedSharding, P = _jax()
    import jax_r2ccl
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))), ("x",))
    ndev = mesh.devices.size

    def ours(v):
        return jnp.stack([jax_r2ccl.psum(v[i], "x") for i in range(n)])

    def xlas(v):
        return jnp.stack([jax.lax.psum(v[i], "x") for i in range(n)])

    spec = dict(mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"), check_vma=False)
    f, g = jax.jit(jax.shard_map(ours, **spec)), jax.jit(jax.shard_map(xlas, **spec))
    rng = np.random.default_rng(7)
    full = rng.integers(-4, 5, (n, size * ndev)).astype(np.float32)
    x = jax.make_array_from_callback(full.shape, NamedSharding(mesh, P(None, "x")), lambda idx: full[idx])
    t0 = time.monotonic()
    text = f.lower(x).as_text()
    compiled = f.lower(x).compile()
    t1 = time.monotonic()
    a = compiled(x)
    a.block_until_ready()
    t2 = time.monotonic()
    b = g(x)
    got = [np.asarray(s.data) for s in a.addressable_shards]
    want = [np.asarray(s.data) for s in b.addressable_shards]
    from jax_r2ccl._src import runtime
    return {"equal": all(np.array_equal(p, q) for p, q in zip(got, want)), "custom_calls": len(_custom_calls(text)),
            "compile_s": t1 - t0, "run_s": t2 - t1, "peak_in_flight": runtime.current().comm.executor.peak_in_flight()}
