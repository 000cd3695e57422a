"""Parity of the C++ core and the Python package: every default, enum name and shared constant is
written once (csrc/) and read by Python through _core.config_defaults(), _core.names() and
_core.constants(). These tests fail when the two sides drift: a default repeated or changed on
one side only, a Config field not bound or without a setting, an enum whose name list is out of
order, or a Python table of kinds, reductions, dtypes or plans that is not the core's. They read
the headers as text (no build of their own) and need no network, no JAX process group."""

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jax_r2ccl import _core, config
from jax_r2ccl.config import CORE_ONLY_FIELDS, SETTINGS, Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")


def _read(rel: str) -> str:
    with open(os.path.join(CSRC, rel)) as f:
        return f.read()


def _struct_fields() -> list[str]:
    """The data members of `struct Config` in csrc/base/config.h, in declaration order."""
    body = re.search(r"struct Config \{(.*?)\n\};", _read("base/config.h"), re.S).group(1)
    return re.findall(r"^\s+[\w:]+ (\w+)(?: = [^;]+)?;", body, re.M)


def _enumerators(rel: str, enum: str) -> list[str]:
    """The enumerators of `enum class <enum>` in a header, without their k prefix, in order."""
    body = re.search(r"enum class " + enum + r"\b[^{]*\{(.*?)\};", _read(rel), re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    return [re.match(r"\s*k(\w+)", e).group(1) for e in body.split(",") if e.strip()]


def _size(n: int) -> str:
    """65536 -> '64 KiB': how the settings' docs write a size."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).lower()


def _core_properties() -> set[str]:
    return {n for n in dir(_core.Config()) if not n.startswith("_") and n != "validate"}


# ----------------------------------------------------------------------------- defaults

def test_every_struct_field_is_bound_and_exported():
    fields = _struct_fields()
    assert len(fields) > 10, fields        # the regex still reads the header
    assert set(fields) == set(_core.config_defaults()), "bindings.cc binds other fields than config.h declares"
    assert set(fields) == _core_properties()


def test_exported_defaults_are_those_of_a_default_constructed_struct():
    core = _core.Config()
    for field, value in _core.config_defaults().items():
        got = getattr(core, field)
        assert got == value and type(got) is type(value), (field, got, value)


def test_python_defaults_equal_the_core_defaults():
    py, core = Config(), _core.Config()
    for s in SETTINGS:
        if s.field == "debug":
            continue
        want = getattr(core, s.field)
        assert getattr(py, s.field) == want and s.default == want, f"{s.env}: Python {getattr(py, s.field)!r}, C++ {want!r}"
        assert isinstance(getattr(py, s.field), type(want)), (s.env, type(getattr(py, s.field)), type(want))
    # R2CCL_DEBUG is a name on the Python side, an index in C++.
    assert _core.names()["log_levels"][core.debug_level] == py.debug
    # Nothing is lost on the way to the core: a default Config reaches it unchanged.
    sent = py.to_core()
    for f in _core.config_defaults():
        assert getattr(sent, f) == getattr(core, f), f


def test_settings_and_core_fields_match_one_to_one():
    core_fields = set(_core.config_defaults())
    shared = {s.field for s in SETTINGS} - {"debug"}
    assert shared == core_fields - CORE_ONLY_FIELDS, (
        f"C++ fields without a setting: {sorted(core_fields - CORE_ONLY_FIELDS - shared)}; "
        f"settings not in C++: {sorted(shared - core_fields)}")
    assert CORE_ONLY_FIELDS <= core_fields
    assert [f.name for f in config.dataclasses.fields(Config)] == [s.field for s in SETTINGS]
    assert len({s.env for s in SETTINGS}) == len(SETTINGS) == len({s.field for s in SETTINGS})


def test_the_python_table_is_the_core_table():
    # One table, in C++ (csrc/base/settings.cc): Python repeats no variable, kind, default or doc.
    rows = _core.settings()
    assert [(r["env"], r["field"], r["default"], r["doc"]) for r in rows] == [
        (s.env, s.field, s.default, s.doc) for s in SETTINGS]
    assert {r["kind"] for r in rows} <= set(_core.names()["setting_kinds"])
    src = open(os.path.join(ROOT, "jax_r2ccl", "config.py")).read()
    assert not re.search(r"Setting\(\s*[\"']R2CCL_", src), "config.py writes a row of its own: the table is C++'s"


def test_each_setting_comment_in_the_header_names_its_setting():
    # config.h documents each field with its R2CCL_* name: the comment must name the right one.
    text = _read("base/config.h")
    for s in SETTINGS:
        member = "debug_level" if s.field == "debug" else s.field
        assert re.search(rf"\b{member}(?: = [^;]+)?;\s+// {s.env}:", text), f"{member} is not documented as {s.env}"


def test_the_core_reads_the_process_environment_itself(tmp_path):
    # What a process without Python (the NCCL plugin) reads: the C++ reader over getenv, not a
    # dictionary handed down from Python.
    env = dict(os.environ, R2CCL_CHUNK_BYTES="0x20000", R2CCL_CRC="yes", R2CCL_TIMEOUT="2.5",
               R2CCL_DEBUG="info", R2CCL_NICS="lo, 127.0.0.1", R2CCL_SECRET="ab" * 16)
    code = "from jax_r2ccl import _core; import json; print(json.dumps(_core.read_settings(None), sort_keys=True))"
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout) == {"chunk_bytes": 0x20000, "crc": True, "timeout_s": 2.5, "debug": "INFO",
                                    "nics": "lo, 127.0.0.1", "secret": "ab" * 16}
    # And the values Python's Config gets from the same environment are the same ones.
    cfg = Config.from_env(env=env)
    assert (cfg.chunk_bytes, cfg.crc, cfg.timeout_s, cfg.debug, cfg.nics) == (0x20000, True, 2.5, "INFO", "lo, 127.0.0.1")


# ----------------------------------------------------------------------------- names

ENUMS = [  # (names key, header, enum, enumerator -> name)
    ("kinds", "coll/collectives.h", "Kind", _snake),
    ("reduce_ops", "coll/reduce.h", "ReduceOp", _snake),
    ("plans", "coll/plan.h", "PlanKind", _snake),
    ("causes", "base/error.h", "Cause", _snake),
    ("log_levels", "base/log.h", "LogLevel", str.upper),
    ("rail_states", "core/rail_state.h", "RailState", _snake),
    ("fail_reasons", "core/rail_state.h", "FailReason", lambda e: "" if e == "None" else _snake(e)),
    ("faults", "core/rail_state.h", "Fault", lambda e: "" if e == "None" else _snake(e)),
    ("setting_kinds", "base/settings.h", "SettingKind", lambda e: "str" if e == "String" else e.lower()),
    ("dtypes", "coll/reduce.h", "DType",
     lambda e: "bool" if e == "Bool" else re.sub(r"^(BF|F|I|U)", lambda m: {"BF": "bfloat", "F": "float",
                                                                             "I": "int", "U": "uint"}[m.group(1)], e)),
]


@pytest.mark.parametrize("key,header,enum,name", ENUMS, ids=[e[0] for e in ENUMS])
def test_name_lists_follow_their_enums(key, header, enum, name):
    # Python sends the index of a name as the enum's value, so the order is what matters.
    assert _core.names()[key] == [name(e) for e in _enumerators(header, enum)]


def test_the_jax_lowering_uses_the_core_names():
    pytest.importorskip("jax")
    from jax_r2ccl._src import lowering
    names = _core.names()
    assert lowering.KIND == {n: i for i, n in enumerate(names["kinds"])}
    assert lowering.REDUCE == {n: i for i, n in enumerate(names["reduce_ops"])}
    assert sorted(d.name for d in lowering.SUPPORTED_DTYPES) == sorted(names["dtypes"])
    for d in names["dtypes"]:
        lowering.check_dtype(lowering._np_dtype(d), "parity")
    with pytest.raises(Exception, match="complex64"):
        lowering.check_dtype(np.complex64, "parity")


def test_host_collectives_accept_the_core_names():
    from jax_r2ccl.transport import host_collectives as hc
    names = _core.names()
    assert list(hc.KINDS) == names["kinds"]
    assert list(hc.OPS) == names["reduce_ops"]
    assert list(hc.DTYPES) == names["dtypes"]


def _names_everywhere(field, names, setting, unknown):
    """A planner's names (R2CCL_PLAN's, R2CCL_ALGO's) are the bench's --FIELD choices, each is
    explained in the setting's doc, and the setting takes them and refuses others by name."""
    from jax_r2ccl.tools.bench import collective
    p = argparse.ArgumentParser()
    collective.add_args(p)
    choices = next(a.choices for a in p._actions if f"--{field}" in a.option_strings)
    assert list(choices) == names
    doc = next(s.doc for s in SETTINGS if s.field == field)
    for name in names:
        assert f"{name}:" in doc, f"{setting}'s doc does not explain {name}"
    assert getattr(config.Config.from_env(env={}, **{field: names[-1]}), field) == names[-1]
    with pytest.raises(config.R2cclError, match=f"{setting} must be " + ", ".join(names[:-1]) + " or " + names[-1]):
        config.Config.from_env(env={}, **{field: unknown})


def test_plan_names_everywhere_are_the_planners():
    from jax_r2ccl.tools.sim import plans as sim_plans
    plans = _core.names()["plans"]
    _names_everywhere("plan", plans, "R2CCL_PLAN", "fastest")
    assert sorted(sim_plans.PLANS) == sorted(plans)


def test_algorithm_names_everywhere_are_the_planners():
    _names_everywhere("algo", _core.names()["algos"], "R2CCL_ALGO", "tree")
    with pytest.raises(config.R2cclError, match="R2CCL_MAX_PEERS"):
        config.Config.from_env(env={}, max_peers=0)


def test_error_causes_are_the_cores():
    from jax_r2ccl import errors
    causes = _core.names()["causes"]
    listed = re.search(r"cause: one of (.*?)\.\n", errors.R2cclError.__doc__, re.S).group(1)
    assert re.findall(r'"(\w+)"', listed) == causes, "jax_r2ccl/errors.py's docstring lists other causes"
    # Every cause the Python side raises by name is one the core knows.
    pkg = os.path.dirname(errors.__file__)
    used = {}
    for dirpath, _, files in os.walk(pkg):
        for fn in files:
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                for node in ast.walk(ast.parse(open(path).read(), path)):
                    if isinstance(node, ast.keyword) and node.arg == "cause" and isinstance(node.value, ast.Constant):
                        used[node.value.value] = os.path.relpath(path, pkg)
    assert used, "no cause= keyword found (the scan is broken)"
    assert set(used) <= set(causes), {c: f for c, f in used.items() if c not in causes}
    import inspect
    assert inspect.signature(errors.R2cclError).parameters["cause"].default in causes


# ----------------------------------------------------------------------------- constants

def test_constants_are_the_ones_the_core_checks_and_the_docs_quote():
    k = _core.constants()
    assert set(k) == {"small_collective_bytes", "min_chunk_bytes", "max_chunk_bytes", "caller_path_bytes",
                      "eager_bytes_max", "eager_held_bytes", "io_threads_max",
                      "io_cpus_per_nic"}
    for ok in (k["min_chunk_bytes"], k["max_chunk_bytes"]):
        assert Config.from_env(env={}, chunk_bytes=ok, rail_window_bytes=max(ok, 1 << 20)).chunk_bytes == ok
    for bad in (k["min_chunk_bytes"] - 1, k["max_chunk_bytes"] + 1):
        with pytest.raises(config.R2cclError, match=f"between {k['min_chunk_bytes']} and {k['max_chunk_bytes']}"):
            Config.from_env(env={}, chunk_bytes=bad, rail_window_bytes=max(bad, 1 << 20))
    doc = {s.field: s.doc for s in SETTINGS}
    assert f"(<= {_size(k['small_collective_bytes'])})" in doc["sync_wait_us"]
    assert _size(k["max_chunk_bytes"]) in doc["chunk_bytes"]
    assert _size(k["min_chunk_bytes"]) in doc["chunk_bytes"]
    assert f"(<= {_size(k['caller_path_bytes'])})" in doc["poll_us"]
    assert f"(at most {_size(k['eager_bytes_max'])})" in doc["eager_bytes"]
    assert _size(k["eager_held_bytes"]) in doc["eager_bytes"]
    assert f"(at most {k['io_threads_max']})" in doc["io_threads"]
    assert f"at least {k['io_cpus_per_nic']} CPUs per NIC" in doc["io_threads"]
    cpus = len(os.sched_getaffinity(0))
    for nics in (1, 2, 4, 8):
        want = min(nics, k["io_threads_max"]) if nics >= 2 and cpus >= k["io_cpus_per_nic"] * nics else 0
        assert _core.io_threads_for(-1, nics) == want, (nics, cpus)
        assert _core.io_threads_for(3, nics) == 3
    assert f"at most {_size(k['caller_path_bytes'])} onto an idle" in doc["io_threads"]
    assert Config.from_env(env={}, io_threads=k["io_threads_max"]).io_threads == k["io_threads_max"]
    with pytest.raises(config.R2cclError, match="R2CCL_IO_THREADS"):
        Config.from_env(env={}, io_threads=k["io_threads_max"] + 1)
    assert Config.from_env(env={}, eager_bytes=k["eager_bytes_max"]).eager_bytes == k["eager_bytes_max"]
    with pytest.raises(config.R2cclError, match="R2CCL_EAGER_BYTES"):
        Config.from_env(env={}, eager_bytes=k["eager_bytes_max"] + 1)
    assert _size(65536) == "64 KiB" and _size(64 << 20) == "64 MiB" and _size(1000) == "1000 bytes"


def test_no_literal_copies_of_the_constants_in_csrc():
    # The constants are defined once (kSmallCollectiveBytes, kChunkBytesMin/Max); another
    # `64 << 10` or `64ull << 20` in csrc/ is a copy that can drift. (Plain 65536s elsewhere,
    # such as the fault injector's token-bucket burst, are other quantities.)
    hits = []
    for dirpath, _, files in os.walk(CSRC):
        for fn in files:
            path = os.path.join(dirpath, fn)
            for i, line in enumerate(open(path), 1):
                code = line.split("//")[0]
                if re.search(r"\b64(ull|u|ul)? << (10|20)\b|\b67108864\b", code) and "inline constexpr" not in code:
                    hits.append(f"{os.path.relpath(path, CSRC)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


# ----------------------------------------------------------------------------- the settings table

def test_the_settings_command_prints_the_generated_table(tmp_path):
    exe = shutil.which("jax-r2ccl")
    cmd = [exe, "settings"] if exe else [sys.executable, "-m", "jax_r2ccl", "settings"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == config.settings_table()
    for s in SETTINGS:   # the table shows each setting's (core-derived) default
        d = ("1" if s.default else "0") if s.kind is bool else (s.default if s.default != "" else "(empty)")
        assert f"| `{s.env}` | `{d}` |" in r.stdout, s.env
