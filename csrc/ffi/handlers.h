// The XLA FFI handlers of jax_r2ccl, as opaque pointers for registration from Python
// (jax.ffi.register_ffi_target). This header names no XLA type; csrc/ffi/*.cc are the only
// files that include XLA headers.
#pragma once
#include <string>
#include <vector>

namespace r2ccl::ffi {

// "r2ccl_collective" on the CPU platform: one local rank's part of a collective, asynchronous.
void* collective_cpu_handler();
// "r2ccl_ragged_all_to_all" on the CPU platform (jax.lax.ragged_all_to_all under the swap).
void* ragged_cpu_handler();
// The same target for platform "CUDA"; null when the CUDA part was not built.
void* collective_cuda_handler();

// What the CUDA part knows of this machine (for doctor and the tests' skip reasons). With
// the CUDA part built but no driver or GPU, `devices` is 0 and `error` says why.
struct CudaInfo {
  bool built = false;
  int runtime_version = 0;   // e.g. 13000
  int driver_version = 0;    // 0: no driver
  int devices = 0;
  std::string error;
  std::vector<std::string> pci_bus_ids;   // per visible device, "0000:3b:00.0"
  std::vector<std::string> archs;         // what the build holds: "sm_80", "sm_90", "compute_90"
};
CudaInfo cuda_info();

// Testing (_core.testing_throw_in_next_handler): the next handler entry throws this kind of
// exception inside its guard (boundary.h), so tests can show it becomes an error, not an abort.
enum class InjectedThrow : int { kNone = 0, kStd = 1, kError = 2, kOther = 3 };
void arm_injected_throw(InjectedThrow kind);

}  // namespace r2ccl::ffi
