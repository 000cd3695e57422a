"""`python -m jax_r2ccl demo`: the main demo. N local processes (default 2 × 2 CPU devices)
whose four rails are loopback addresses train a small MLP data-parallel with
jax_r2ccl.pmean inside shard_map under jit. The run is done twice from the same start:
fault-free, then with a rail taken down mid-run (and healed later). Per-step loss and rail
status are printed; the demo ends by checking that the two loss curves are bit-identical
and exits non-zero if they are not. `--transport` runs the transport-only demo instead."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

NICS = "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m jax_r2ccl demo", description=__doc__)
    p.add_argument("--processes", type=int, default=2, help="local processes (default 2)")
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process (default 2)")
    p.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    p.add_argument("--width", type=int, default=512, help="hidden width of the MLP (default 512)")
    p.add_argument("--fail-rail", type=int, default=2, help="rail taken down (default 2)")
    p.add_argument("--fail-step", type=int, default=None, help="step at which it fails (default steps/3)")
    p.add_argument("--heal-step", type=int, default=None, help="step at which it heals (default steps/2)")
    p.add_argument("--rail-rate", type=float, default=10.0,
                   help="software cap per rail in MB/s so a step's all-reduce is in flight long enough "
                        "for the failure to land inside it (default 10)")
    p.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _worker(a) -> int:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={a.devices}").strip()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_r2ccl
    from jax_r2ccl.config import Config

    jax.distributed.initialize(coordinator_address=a.coordinator, num_processes=a.processes,
                               process_id=a.process_id)
    ep = jax_r2ccl.initialize(nics=os.environ.get("R2CCL_NICS", NICS).split(","),
                              config=Config.from_env(timeout_s=30.0))
    me = a.process_id
    peers = [p for p in range(a.processes) if p != me]
    mesh = Mesh(np.array(jax.devices()), ("data",))
    n_dev = len(jax.devices())

    def init_params(key, width):
        k1, k2, k3 = jax.random.split(key, 3)
        return {"w1": jax.random.normal(k1, (32, width)) * 0.1, "b1": jnp.zeros(width),
                "w2": jax.random.normal(k2, (width, width)) * 0.1, "b2": jnp.zeros(width),
                "w3": jax.random.normal(k3, (width, 1)) * 0.1}

    def loss_fn(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        h = jnp.tanh(h @ params["w2"] + params["b2"])
        return jnp.mean((h @ params["w3"] - y) ** 2)

    def local_step(params, x, y):
        # params are replicated (P()); marking them varying makes the gradient per device,
        # so the all-reduce below is the only one (with check_vma on, JAX would otherwise sum
        # the gradient of an invariant value itself, through its own collectives).
        local = jax.lax.pcast(params, "data", to="varying")
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        grads = jax_r2ccl.pmean(grads, "data")       # the all-reduce that must survive a NIC failure
        loss = jax_r2ccl.pmean(loss, "data")
        params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
        return params, loss

    step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                 out_specs=(P(), P())))
    rng = np.random.default_rng(0)
    batch = 64 * n_dev
    X = rng.standard_normal((batch, 32)).astype(np.float32)
    Y = np.sin(X[:, :1] * 2).astype(np.float32)
    xs = jax.make_array_from_callback(X.shape, NamedSharding(mesh, P("data")), lambda i: X[i])
    ys = jax.make_array_from_callback(Y.shape, NamedSharding(mesh, P("data")), lambda i: Y[i])
    fail_step = a.fail_step if a.fail_step is not None else a.steps // 3
    heal_step = a.heal_step if a.heal_step is not None else a.steps // 2
    n_params = sum(int(np.prod(v.shape)) for v in init_params(jax.random.key(0), a.width).values())
    if me == 0:
        print(f"[demo] {a.processes} processes x {a.devices} CPU devices, MLP with {n_params} parameters "
              f"({n_params * 4 / 1e6:.2f} MB of gradients all-reduced per step over 4 loopback rails, "
              f"each capped at {a.rail_rate:g} MB/s)", flush=True)
    for p in peers:
        for s in ep.rail_stats(p):
            ep.inject(p, s["rail"], "rate", a.rail_rate * 1e6)
    curves = {}
    for run in ("fault-free", "with failure"):
        params = jax.device_put(init_params(jax.random.key(0), a.width), NamedSharding(mesh, P()))
        losses = []
        t0 = time.monotonic()
        for i in range(a.steps):
            faulty = run == "with failure" and me == 0 and peers
            params, loss = step(params, xs, ys)          # dispatched: runs while Python goes on
            if faulty and i == fail_step:
                time.sleep(0.005)                         # inside this step's gradient all-reduce
                ep.inject(peers[0], a.fail_rail, "close")
                inflight = sum(s["inflight_bytes"] for s in ep.rail_stats(peers[0]))
                print(f"[demo] step {i}: rail {a.fail_rail} to process {peers[0]} taken DOWN "
                      f"with the all-reduce in flight ({inflight} bytes unacknowledged on the rails)", flush=True)
            if faulty and i == heal_step:
                ep.inject(peers[0], a.fail_rail, "rate", a.rail_rate * 1e6)
                print(f"[demo] step {i}: rail {a.fail_rail} healed", flush=True)
            losses.append(np.asarray(loss).item())
            if me == 0 and (i % 50 == 0 or i == a.steps - 1 or
                            (run == "with failure" and i in (fail_step, fail_step + 1, heal_step, heal_step + 20))):
                rails = " ".join(f"r{s['rail']}:{s['state']}" for s in ep.rail_stats(peers[0])) if peers else ""
                print(f"[demo] {run:>12s} step {i:4d} loss {losses[-1]:.7f}  rails to process "
                      f"{peers[0] if peers else '-'}: {rails}", flush=True)
        curves[run] = np.array(losses, np.float32)
        if me == 0:
            print(f"[demo] {run}: {a.steps} steps in {time.monotonic() - t0:.1f} s, final loss "
                  f"{losses[-1]:.7f}", flush=True)
    identical = curves["fault-free"].tobytes() == curves["with failure"].tobytes()
    if me == 0:
        st = ep.rail_stats(peers[0]) if peers else []
        for s in st:
            print(f"[demo] rail {s['rail']} ({s['local_addr']}): failures {s['failures']}, recoveries "
                  f"{s['recoveries']}, chunks re-sent for others {s['retransmitted_chunks']}", flush=True)
        first = None if identical else int(np.nonzero(curves["fault-free"] != curves["with failure"])[0][0])
        print(f"[demo] loss curves {'BIT-IDENTICAL' if identical else f'DIFFER (first at step {first})'} "
              f"over {a.steps} steps", flush=True)
    jax_r2ccl.shutdown()
    jax.distributed.shutdown()
    return 0 if identical else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--transport" in argv:
        argv.remove("--transport")
        from . import demo_transport
        return demo_transport.main(argv)
    a = _parse(argv)
    if a.process_id is not None:
        return _worker(a)
    coordinator = f"127.0.0.1:{_free_port()}"
    from .demo_transport import launch
    codes = launch([[sys.executable, "-m", "jax_r2ccl", "demo", *argv, "--process-id", str(i),
                     "--coordinator", coordinator] for i in range(a.processes)], dict(os.environ), 600)
    if codes is None:
        return 1
    ok = all(c == 0 for c in codes)
    print("demo: PASS (loss curve bit-identical through a rail failure)" if ok else f"demo: FAIL (exit codes {codes})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
