"""A tensor-parallel decode loop served with jax_r2ccl: every layer of every token step ends in
a psum of one token's activations (1 KiB: latency-bound), and generation goes on through a
NIC failure. Reports per-token step latency (p50, p99, max) and the step the fault hit, and
checks that the tokens equal those of a fault-free pass in the same processes (exit 1 if not).

One process per host (the model is split across the processes along "model"):
    R2CCL_NICS=eth1,eth2 python examples/serving.py --coordinator HOST0:5000 --num-processes 2 \\
        --process-id 0 --fault-at-token 150 --fault-cmd "ip link set eth2 down"   # host 0
    ... --process-id 1                                                            # host 1
On the test bed: bench/testbed_serving.sh."""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_r2ccl  # noqa: E402


def init_params(key, vocab, d, ff, layers, n_model):
    """Embeddings (token, position) and unembedding replicated; each layer's MLP split along
    "model": w_in column-parallel (d x ff/n per process), w_out row-parallel (ff/n x d)."""
    ks = jax.random.split(key, 2 * layers + 3)
    emb = jax.random.normal(ks[0], (vocab, d)) * 0.5
    pos = jax.random.normal(ks[-2], (4096, d)) * 0.5
    unemb = jax.random.normal(ks[-1], (d, vocab)) / np.sqrt(d)
    w_in = jnp.stack([jax.random.normal(ks[1 + 2 * i], (d, ff)) / np.sqrt(d) for i in range(layers)])
    w_out = jnp.stack([jax.random.normal(ks[2 + 2 * i], (ff, d)) / np.sqrt(ff) for i in range(layers)])
    return emb, pos, unemb, w_in, w_out


def make_step(mesh, layers):
    def local(emb, pos, unemb, w_in, w_out, token, t):
        x = emb[token] + pos[t]                            # (1, d), the same on every process
        for i in range(layers):
            h = jax.nn.gelu(x @ w_in[i])                   # (1, ff/n): this process's columns
            x = x + jax_r2ccl.psum(h @ w_out[i], "model")  # row-parallel: sum the partial outputs
            x = x / (1e-6 + jnp.sqrt(jnp.mean(x * x)))
        logits = x @ unemb
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits
    return jax.jit(jax.shard_map(local, mesh=mesh,
                                 in_specs=(P(), P(), P(), P(None, None, "model"), P(None, "model", None), P(), P()),
                                 out_specs=(P(), P()), check_vma=False))


def generate(step, params, first, n_tokens, fault=None):
    """Greedy decoding; returns the tokens, each step's time, and a digest of every step's
    logits (bit-exact comparison of the two passes, not only of the argmax)."""
    import hashlib
    tok = jnp.array([first], jnp.int32)
    tokens, times, digest = [], [], hashlib.sha256()
    for t in range(n_tokens):
        if fault and t == fault["at"]:
            fault["thread"].start()
        t0 = time.perf_counter()
        tok, logits = step(*params, tok, jnp.int32(t))
        tok.block_until_ready()
        times.append(time.perf_counter() - t0)
        tokens.append(int(np.asarray(tok)[0]))
        digest.update(np.asarray(logits).tobytes())
        if fault and fault["t_done"] is not None and fault["step"] is None:
            fault["step"] = t   # the first step that ended after the command returned
    return tokens, times, digest.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--num-processes", type=int, required=True)
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--fault-at-token", type=int, default=None, help="process 0 starts --fault-cmd at this token")
    ap.add_argument("--fault-cmd", default=None, help="shell command that takes a NIC down")
    ap.add_argument("--heal-cmd", default=None, help="shell command run after the faulty pass")
    ap.add_argument("--json", default=None, help="write the latencies and tokens (process 0)")
    a = ap.parse_args(argv)
    jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)
    jax_r2ccl.initialize()
    mesh = Mesh(np.array(jax.devices()), ("model",))
    n = mesh.devices.size
    ff = 4 * a.d_model
    emb, pos, unemb, w_in, w_out = init_params(jax.random.key(7), a.vocab, a.d_model, ff, a.layers, n)
    params = (jax.device_put(emb, NamedSharding(mesh, P())), jax.device_put(pos, NamedSharding(mesh, P())),
              jax.device_put(unemb, NamedSharding(mesh, P())),
              jax.device_put(w_in, NamedSharding(mesh, P(None, None, "model"))),
              jax.device_put(w_out, NamedSharding(mesh, P(None, "model", None))))
    step = make_step(mesh, a.layers)
    generate(step, params, 1, 20)   # compile and warm up

    clean, clean_t, clean_d = generate(step, params, 1, a.tokens)
    fault = None
    if a.fault_cmd and a.fault_at_token is not None and a.process_id == 0:
        fault = {"at": a.fault_at_token, "t_done": None, "step": None, "rc": None}

        def run():
            t0 = time.perf_counter()
            r = subprocess.run(a.fault_cmd, shell=True, capture_output=True, text=True)
            fault.update(t_done=time.perf_counter(), cmd_s=time.perf_counter() - t0, rc=r.returncode,
                         out=(r.stdout + r.stderr).strip()[-300:])
        fault["thread"] = threading.Thread(target=run, daemon=True)
    faulty, faulty_t, faulty_d = generate(step, params, 1, a.tokens, fault)
    if fault:
        fault["thread"].join(30)
    if a.heal_cmd and a.process_id == 0:
        subprocess.run(a.heal_cmd, shell=True, check=False)
    same = clean == faulty and clean_d == faulty_d
    ms = lambda xs: np.asarray(xs) * 1e3  # noqa: E731
    rc = 0 if same else 1
    if a.process_id == 0:
        c, f = ms(clean_t), ms(faulty_t)
        print(f"serving: {n} processes x {a.layers} layers, d_model {a.d_model}; {a.tokens} tokens per pass, "
              f"{a.layers} psums of {a.d_model * 4} B per token")
        print(f"  fault-free pass: p50 {np.median(c):.3f} ms  p99 {np.percentile(c, 99):.3f} ms  max {c.max():.3f} ms")
        print(f"  faulty pass:     p50 {np.median(f):.3f} ms  p99 {np.percentile(f, 99):.3f} ms  max {f.max():.3f} ms")
        res = {"tokens_equal": same, "clean_ms": c.tolist(), "faulty_ms": f.tolist(), "tokens": clean}
        if fault:
            k0 = fault["at"]
            hit = int(np.argmax(f[k0:])) + k0    # the slowest step from the fault on
            extra = f[hit] - np.median(c)
            print(f"  fault: '{a.fault_cmd}' started at token {k0} (rc {fault['rc']}, {fault.get('cmd_s', 0):.3f} s); "
                  f"slowest step after it: token {hit}, {f[hit]:.3f} ms = {extra:+.3f} ms over the healthy p50")
            res.update(fault_at=k0, hit_token=hit, hit_extra_ms=float(extra), fault_rc=fault["rc"])
        print(f"  tokens and logits identical to the fault-free pass: {'yes' if same else 'NO'} "
              f"({len(set(clean))} distinct tokens; logits digest {clean_d[:16]})")
        try:
            h = jax_r2ccl.health()
            for peer, rails in h["peers"].items():
                print("  rails to process %s: %s" % (peer, ", ".join(
                    f"{r['nic']} {r['state']} (failures {r['failures']})" for r in rails)))
        except Exception as e:  # noqa: BLE001 - the report is optional
            print(f"  (no health report: {e})")
        if a.json:
            with open(a.json, "w") as fp:
                json.dump(res, fp)
    jax_r2ccl.shutdown()
    jax.distributed.shutdown()
    return rc


if __name__ == "__main__":
    sys.exit(main())
