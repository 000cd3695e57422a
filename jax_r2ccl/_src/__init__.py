"""Internals of jax_r2ccl's JAX integration: the primitives behind jax_r2ccl.psum and friends
(one file per op family), their shared lowering to the "r2ccl_collective" FFI custom call,
and the lowering swap for jax.lax's own collectives. The public names live in
jax_r2ccl.ops and jax_r2ccl."""
