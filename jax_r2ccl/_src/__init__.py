"""The JAX tier: the primitives behind jax_r2ccl.psum and friends (one file per op family),
their shared lowering to the "r2ccl_collective" FFI custom call, the lowering swap for
jax.lax's own collectives (swap.py), the private JAX APIs they need (jaxapi.py), and the
process runtime (runtime.py: one Runtime, reached through current()). The public names are
re-exported by jax_r2ccl (ops.py lists them). Knows the transport tier below it, nothing of
monitoring or the tools above."""
