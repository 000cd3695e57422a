// The XLA FFI handlers of jax_r2ccl, as opaque pointers for registration from Python
// (jax.ffi.register_ffi_target). This header names no XLA type; csrc/ffi/*.cc are the only
// files that include XLA headers.
#pragma once

namespace r2ccl::ffi {

// "r2ccl_collective" on the CPU platform: one local rank's part of a collective, asynchronous.
void* collective_cpu_handler();

}  // namespace r2ccl::ffi
