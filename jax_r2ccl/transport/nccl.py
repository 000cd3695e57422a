"""The NCCL net plugin from Python: where it is, the environment that puts every NCCL collective
of this process on it, and what the NCCL this process would load says about it. No jax here
(the JAX tier's initialize(nccl=True) calls nccl_env()); `jax-r2ccl doctor` prints report().

The plugin itself (csrc/nccl/, libnccl-net-r2ccl.so, installed beside _core) reads its settings
from the same R2CCL_* environment in C++, so a process that never imports jax_r2ccl gets the
same behaviour from the same variables."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import sys

from ..errors import R2cclError

PLUGIN_FILE = "libnccl-net-r2ccl.so"
PLUGIN_NAME = "r2ccl"            # the tables' name: NCCL_NET must match it (case-insensitive)
TABLES = (12, 11, 10)            # the ncclNetPlugin_vN this plugin exports


def plugin_path() -> str:
    """The absolute path of the installed plugin; R2cclError when this install has none."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, PLUGIN_FILE)
    if not os.path.exists(path):
        raise R2cclError(f"{PLUGIN_FILE} is not installed beside jax_r2ccl ({here}); this build was made "
                         "without R2CCL_NCCL_PLUGIN")
    return path


def nccl_env() -> dict[str, str]:
    """The variables that make NCCL load this plugin and fail loudly rather than fall back to its
    own transports: NCCL_NET_PLUGIN (an absolute path) and NCCL_NET. Set them in the environment
    of every process before XLA creates its first NCCL communicator (jax_r2ccl.initialize(nccl=True)
    does it), or export them in the job's launcher."""
    return {"NCCL_NET_PLUGIN": plugin_path(), "NCCL_NET": PLUGIN_NAME}


def apply_env(environ=None) -> dict[str, str]:
    """Sets nccl_env() in `environ` (os.environ by default). Refuses a different plugin or net
    already chosen there, naming it: two plugins cannot both carry NCCL's traffic."""
    environ = os.environ if environ is None else environ
    want = nccl_env()
    for key, value in want.items():
        have = environ.get(key)
        if have not in (None, "", value) and not (key == "NCCL_NET" and have.lower() == value):
            raise R2cclError(f"{key}={have!r} is already set in this process; jax_r2ccl's NCCL plugin needs "
                             f"{key}={value!r} (unset it, or drop nccl=True to keep the other one)")
    environ.update(want)
    return want


def _loaded_nccl() -> str | None:
    """The libnccl.so.2 already mapped into this process (jax's CUDA plugin preloads it), if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libnccl.so"):
                    return path
    except OSError:
        pass
    return None


def _mapped(basename: str) -> str | None:
    """The path of a library of this name mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.count(" ") >= 5 else ""
                if os.path.basename(path) == basename:
                    return path
    except OSError:
        pass
    return None


def plugin_health() -> dict | None:
    """The plugin's own health snapshot when NCCL loaded it into this process (else None): its
    rails per NCCL connection (state, standby, weight, bandwidth, bytes, failures), its NICs and
    its monitor's latest events, read through the plugin's r2ccl_nccl_plugin_health_v1 (the
    plugin is a library of its own, with its own endpoint and monitor). Keys: plugin, devices
    (fused or nic), monitor (on, off, not initialized), rails, nics, events."""
    import json
    path = _mapped(PLUGIN_FILE)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        fn = lib.r2ccl_nccl_plugin_health_v1
    except (OSError, AttributeError):
        return None   # unmapped meanwhile, or an older plugin without the function
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    size = 1 << 16
    for _ in range(4):   # the snapshot may grow between the calls
        buf = ctypes.create_string_buffer(size)
        n = fn(buf, size)
        if n < size:
            return json.loads(buf.value.decode("utf-8", "replace"))
        size = n + 4096
    raise R2cclError("the NCCL plugin's health snapshot kept growing past its buffer")


def nccl_library() -> tuple[str | None, str]:
    """The libnccl.so.2 this process would load, and how it was found: already loaded, the
    nvidia-nccl-cu12/cu13 wheel jax[cuda] installs, or the system's library path."""
    loaded = _loaded_nccl()
    if loaded:
        return loaded, "loaded in this process"
    for entry in sys.path:
        for hit in sorted(glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so*"))) + \
                sorted(glob.glob(os.path.join(entry, "nvidia", "cu*", "lib", "libnccl.so*"))):
            return hit, "the nvidia-nccl wheel"
    found = ctypes.util.find_library("nccl")
    return (found, "the system library path") if found else (None, "not found")


def accepted_tables(path: str) -> list[int]:
    """The ncclNetPlugin_vN versions a libnccl binary looks up (the names in its bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    return sorted({int(v) for v in re.findall(rb"ncclNetPlugin_v(\d+)", data)}, reverse=True)


def nccl_version(path: str) -> str | None:
    """ncclGetVersion() of a libnccl ("2.32.6"), or None when it cannot be loaded here."""
    try:
        lib = ctypes.CDLL(path)
        v = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(v)) != 0:
            return None
        code = v.value   # 2.9+: major*10000 + minor*100 + patch
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    except OSError:
        return None


def report(environ=None) -> dict:
    """What doctor prints: the plugin, the NCCL this process would load, its version, the tables
    it accepts and whether NCCL would use the plugin with this environment."""
    environ = os.environ if environ is None else environ
    out: dict = {"plugin": None, "nccl": None, "how": None, "version": None, "tables": [], "would_use": False,
                 "why": ""}
    try:
        out["plugin"] = plugin_path()
    except R2cclError as e:
        out["why"] = str(e)
        return out
    out["nccl"], out["how"] = nccl_library()
    if out["nccl"] and os.path.exists(out["nccl"]):
        out["tables"] = accepted_tables(out["nccl"])
        out["version"] = nccl_version(out["nccl"])
    common = [t for t in TABLES if t in out["tables"]]
    chosen = environ.get("NCCL_NET_PLUGIN", "")
    if not out["nccl"]:
        out["why"] = "no libnccl.so.2 here (jax[cuda12] or jax[cuda13] installs one)"
    elif not common:
        out["why"] = f"this NCCL looks up tables {out['tables']}, the plugin exports {list(TABLES)}"
    elif chosen != out["plugin"]:
        out["why"] = ("NCCL_NET_PLUGIN is not set to the plugin: call jax_r2ccl.initialize(nccl=True) first "
                      "thing, or export the variables of jax_r2ccl.nccl_env()")
    else:
        out["would_use"] = True
        out["why"] = f"NCCL will load table v{common[0]}" + (
            "" if environ.get("NCCL_NET", "").lower() == PLUGIN_NAME else
            " (NCCL_NET is not set: NCCL would fall back to its own transports if the plugin failed)")
    return out
