"""Prints, a "key<TAB>value" line each, what the Bazel build takes from this machine's Python environment: the
Python headers, XLA's FFI headers (jax.ffi.include_dir()), nanobind's sources, the extension
suffix, and whether rdma-core's <infiniband/verbs.h> is there. Run by bazel/toolchain_inputs.bzl
with the Python it found; a missing input is reported by name, never guessed."""

import os
import sys
import sysconfig

out = {"python": sys.executable, "missing": []}
inc = sysconfig.get_paths().get("include") or ""
if os.path.exists(os.path.join(inc, "Python.h")):
    out["python_include"] = inc
else:
    out["missing"].append(f"the Python headers (Python.h not in {inc!r}: install python3-dev)")
out["ext_suffix"] = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
try:
    import jax.ffi
    out["xla_include"] = jax.ffi.include_dir()
except Exception as e:  # noqa: BLE001 - reported by name
    out["missing"].append(f"jax (for the XLA FFI headers, jax.ffi.include_dir()): {e}")
try:
    import nanobind
    nb = os.path.dirname(nanobind.__file__)
    if not os.path.isdir(os.path.join(nb, "src")):
        raise ImportError(f"{nb} has no src/ folder")
    out["nanobind"] = nb
except Exception as e:  # noqa: BLE001
    out["missing"].append(f"nanobind's sources (pip install nanobind): {e}")
verbs = [d for d in ("/usr/include", "/usr/local/include") if os.path.exists(os.path.join(d, "infiniband", "verbs.h"))]
out["ibverbs_include"] = verbs[0] if verbs else ""
for key, value in out.items():
    for v in value if isinstance(value, list) else [value]:
        print(f"{key}\t{v}")
