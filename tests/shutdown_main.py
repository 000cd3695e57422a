"""One process of the shutdown tests (tests/test_shutdown.py): a program that ends the way a
training script does, a loop of jitted steps with jax_r2ccl collectives and then
`jax_r2ccl.shutdown()` with the last steps still in flight (jit dispatch is asynchronous), and
then lets the interpreter exit on its own (no os._exit: interpreter exit is part of what is
tested). Prints one JSON line "RESULT {...}" before it shuts down the runtime and one
"AFTER {...}" after, and exits 0 only when every check below held.

Usage: shutdown_main.py SPEC_JSON (see tests/test_shutdown.py: rank, world, port, mode, steps,
elems, config, nics).

Modes:
- "in_flight": every process dispatches `steps` steps and calls shutdown() without blocking;
  every step's result must then be exact (shutdown waits for them).
- "exit": the same, but the process never calls shutdown() nor looks at a result: it returns
  from main at once, and interpreter exit must wait for the steps and close the runtime.
- "peer_first": process 1 shuts down right after dispatching 1 step; the others dispatch
  `steps` steps, so their later collectives with it can never complete: each step's result is
  exact or fails with a jax_r2ccl error (peer gone / closed), and no process waits out
  R2CCL_TIMEOUT for it.
- "failing": the last step disagrees across processes (process 1 reduces another shape), and
  shutdown() races its failure: the earlier steps are exact, the last fails with the mismatch
  (or closed) on every process.
- "reinit": "in_flight", then initialize() again and the same once more.

Every result is checked bit for bit against numpy (int32 arithmetic, wrapping as XLA's does)."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

MOD = 1_000_003


def reference(rank_inputs: list[np.ndarray], steps: int) -> list[np.ndarray]:
    """The result of every step: x <- (sum over processes of x_p + k) % MOD, in int32, where
    after the first step every process holds the same x."""
    xs = [a.astype(np.int32) for a in rank_inputs]
    out = []
    for k in range(steps):
        s = np.zeros_like(xs[0])
        for a in xs:
            s = (s + a).astype(np.int32)
        y = ((s + np.int32(k)) % np.int32(MOD)).astype(np.int32)
        out.append(y)
        xs = [y] * len(xs)
    return out


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    rank, world, mode = spec["rank"], spec["world"], spec["mode"]
    steps, elems = spec["steps"], spec["elems"]
    # A hang must say where it is: every thread's stack, well before the test's own deadline.
    faulthandler.dump_traceback_later(spec.get("dump_after_s", 90), exit=False)
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_r2ccl
    from jax_r2ccl.config import Config

    jax.distributed.initialize(f"127.0.0.1:{spec['port']}", world, rank, initialization_timeout=60)
    config = Config.from_env(**spec.get("config", {}))

    def start():
        jax_r2ccl.initialize(nics=spec["nics"], config=config)
        mesh = Mesh(np.array(jax.devices()), ("p",))

        def local(x, k):
            return (jax_r2ccl.psum(x, "p") + k) % MOD

        step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("p"), P()), out_specs=P("p")))
        inputs = [np.arange(elems, dtype=np.int32) * (p + 1) % 97 for p in range(world)]
        full = np.concatenate(inputs)
        return step, inputs, computed(full, mesh), mesh

    def computed(host, mesh):
        """`host` as a sharded array made by an XLA computation, not a zero-copy view of numpy
        memory. Under TSan, jaxlib's deferred release of a numpy-backed buffer (its Python
        reference manager, synchronised in code TSan does not see) shows as a race between a
        collective's read and numpy's free on the main thread; a training step's inputs are
        XLA's buffers, freed by jaxlib (tests/tsan.supp: called_from_lib)."""
        view = jax.make_array_from_callback(host.shape, NamedSharding(mesh, P("p")), lambda i: host[i])
        return copy(view)

    copy = jax.jit(lambda v: v + 0)

    checks = []
    rounds = 2 if mode == "reinit" else 1
    for rnd in range(rounds):
        step, inputs, x, mesh = start()
        n_steps = 1 if (mode == "peer_first" and rank == 1) else steps
        outs = []
        for k in range(n_steps):
            if mode == "failing" and k == n_steps - 1 and rank == 1:
                # A collective of another shape on this process only: a mismatch everywhere.
                # Its input is made locally (no resharding: XLA would insert a collective of its own).
                bad = jax.jit(jax.shard_map(lambda v: jax_r2ccl.psum(v, "p"), mesh=mesh, in_specs=P("p"),
                                            out_specs=P("p")))
                twice = np.zeros(2 * elems * world, np.int32)
                try:   # the CPU client may run it at dispatch, and so raise here
                    x = bad(computed(twice, mesh))
                except Exception as e:  # noqa: BLE001 - checked below like a failed result
                    x = e
            else:
                x = step(x, np.int32(k))
            outs.append(x)
        t0 = time.monotonic()
        print("RESULT " + json.dumps({"rank": rank, "round": rnd, "dispatched": len(outs)}), flush=True)
        if mode == "exit":   # no shutdown(), no look at the results: straight to interpreter exit
            faulthandler.cancel_dump_traceback_later()
            faulthandler.dump_traceback_later(spec.get("dump_after_s", 90), exit=False)
            return 0
        jax_r2ccl.shutdown()
        shutdown_s = time.monotonic() - t0
        ref = reference(inputs, n_steps)
        exact = failed = 0
        errors = []
        for k, o in enumerate(outs):
            try:
                if isinstance(o, Exception):
                    raise o
                got = np.asarray(o.addressable_shards[0].data)
            except Exception as e:  # noqa: BLE001 - a failed collective: its message is checked
                failed += 1
                text = str(e)   # a chain of failed steps repeats its prefix: keep the cause at the end
                errors.append(f"step {k}: {type(e).__name__}: {text[:120]} ... {text[-300:]}")
                continue
            if mode == "failing" and k == n_steps - 1:
                errors.append(f"step {k}: the mismatched collective returned a result")
                continue
            if np.array_equal(got, ref[k]):
                exact += 1
            else:
                errors.append(f"step {k}: wrong result ({int((got != ref[k]).sum())} elements differ)")
        checks.append({"round": rnd, "exact": exact, "failed": failed, "errors": errors,
                       "shutdown_s": round(shutdown_s, 3), "steps": n_steps})
    print("AFTER " + json.dumps({"rank": rank, "checks": checks}), flush=True)
    ok = all(_round_ok(mode, rank, c) for c in checks)
    jax.distributed.shutdown()
    faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 1


def _round_ok(mode: str, rank: int, c: dict) -> bool:
    wrong = [e for e in c["errors"] if "wrong result" in e or "returned a result" in e]
    if wrong:
        return False
    if mode in ("in_flight", "reinit"):
        return c["exact"] == c["steps"]
    if mode == "failing":   # every step before the last exact; the last one failed with a clear cause
        return c["exact"] == c["steps"] - 1 and c["failed"] == 1 and "r2ccl" in c["errors"][-1]
    # peer_first: exact or a jax_r2ccl error, in order (no exact step after a failed one)
    return all("r2ccl" in e for e in c["errors"]) and c["exact"] + c["failed"] == c["steps"]


if __name__ == "__main__":
    sys.exit(main())
