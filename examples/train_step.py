"""A data-parallel training step as a user writes it with jax_r2ccl, runnable on several hosts.

One process per host (or several on one machine):
    R2CCL_NICS=eth1,eth2,eth3,eth4 python examples/train_step.py --coordinator HOST0:5000 \\
        --num-processes 2 --process-id 0          # on host 0; --process-id 1 on host 1
On one machine without extra NICs, R2CCL_NICS=127.0.0.1,127.0.0.2 works. Pull a cable (or
`ip link set ethX down`) mid-run: the loss curve is the same as without the failure."""

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_r2ccl  # noqa: E402


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--num-processes", type=int, required=True)
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)
    jax_r2ccl.initialize()
    mesh = Mesh(np.array(jax.devices()), ("data",))

    @jax.jit
    def train_step(params, x, y):
        def local(params, x, y):
            local_params = jax.lax.pcast(params, "data", to="varying")
            l, grads = jax.value_and_grad(loss)(local_params, x, y)
            grads = jax_r2ccl.pmean(grads, "data")
            return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), jax_r2ccl.pmean(l, "data")
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))(
            params, x, y)

    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (16, 512)) * 0.1, "b1": jnp.zeros(512),
              "w2": jax.random.normal(k2, (512, 1)) * 0.1}
    params = jax.device_put(params, NamedSharding(mesh, P()))
    n = 32 * len(jax.devices())
    X = np.random.default_rng(0).standard_normal((n, 16)).astype(np.float32)
    Y = np.cos(X[:, :1]).astype(np.float32)
    sh = NamedSharding(mesh, P("data"))
    x = jax.make_array_from_callback(X.shape, sh, lambda i: X[i])
    y = jax.make_array_from_callback(Y.shape, sh, lambda i: Y[i])
    for step in range(a.steps):
        params, l = train_step(params, x, y)
        if step % 20 == 0 and jax.process_index() == 0:
            print(f"step {step} loss {float(l):.6f}", flush=True)
    jax_r2ccl.shutdown()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
