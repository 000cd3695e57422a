"""Putting XLA's NCCL collectives on the net plugin from JAX: jax_r2ccl.nccl_env(),
initialize(nccl=True) (before JAX's backends exist, refused after), and what `jax-r2ccl doctor`
says about the NCCL this process would load. No GPU here: the plugin itself is exercised by
tests/test_nccl_plugin.py; a real NCCL run is bench/nccl_check.sh on a lent GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jax_r2ccl.errors import R2cclError
from jax_r2ccl.transport import nccl


def test_nccl_env_names_the_installed_plugin_by_absolute_path():
    env = nccl.nccl_env()
    assert os.path.isabs(env["NCCL_NET_PLUGIN"]) and os.path.exists(env["NCCL_NET_PLUGIN"]), env
    assert os.path.basename(env["NCCL_NET_PLUGIN"]) == "libnccl-net-r2ccl.so"
    assert env["NCCL_NET"] == "r2ccl"


def test_apply_env_refuses_another_plugin_and_keeps_ours():
    with pytest.raises(R2cclError, match="NCCL_NET_PLUGIN='/opt/other/libnccl-net.so' is already set"):
        nccl.apply_env({"NCCL_NET_PLUGIN": "/opt/other/libnccl-net.so"})
    with pytest.raises(R2cclError, match="NCCL_NET='IB'"):
        nccl.apply_env({"NCCL_NET": "IB"})
    env = {"NCCL_NET": "R2CCL"}
    nccl.apply_env(env)
    assert env["NCCL_NET_PLUGIN"] == nccl.plugin_path()


def test_the_tables_an_nccl_binary_looks_up_are_read_from_its_bytes(tmp_path):
    fake = tmp_path / "libnccl.so.2"
    fake.write_bytes(b"\x7fELF junk ncclNetPlugin_v12\x00ncclNetPlugin_v11\x00ncclNetPlugin_v6\x00"
                     b"ncclCollNetPlugin_v12\x00")
    assert nccl.accepted_tables(str(fake)) == [12, 11, 6]


def test_report_says_whether_nccl_would_use_the_plugin(tmp_path, monkeypatch):
    fake = tmp_path / "libnccl.so.2"
    fake.write_bytes(b"ncclNetPlugin_v10\x00ncclNetPlugin_v9\x00")
    monkeypatch.setattr(nccl, "nccl_library", lambda: (str(fake), "the nvidia-nccl wheel"))
    r = nccl.report(environ={})
    assert not r["would_use"] and "NCCL_NET_PLUGIN is not set" in r["why"], r
    r = nccl.report(environ=nccl.nccl_env())
    assert r["would_use"] and "table v10" in r["why"] and r["tables"] == [10, 9], r
    fake.write_bytes(b"ncclNetPlugin_v9\x00ncclNetPlugin_v8\x00")
    r = nccl.report(environ=nccl.nccl_env())
    assert not r["would_use"] and "exports [12, 11, 10]" in r["why"], r


def _child(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_initialize_nccl_sets_the_environment_before_the_backends(tmp_path):
    r = _child("import os, jax_r2ccl\n"
               "jax_r2ccl.initialize(nccl=True)\n"
               "print(os.environ['NCCL_NET_PLUGIN'], os.environ['NCCL_NET'])\n"
               "jax_r2ccl.shutdown()\n", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    path, name = r.stdout.split()
    assert path.endswith("libnccl-net-r2ccl.so") and os.path.isabs(path) and name == "r2ccl"


def test_initialize_nccl_after_the_backends_is_refused_clearly(tmp_path):
    r = _child("import jax, jax_r2ccl\n"
               "jax.devices()\n"
               "try:\n"
               "    jax_r2ccl.initialize(nccl=True)\n"
               "except jax_r2ccl.R2cclError as e:\n"
               "    print('refused:', e)\n", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused: initialize(nccl=True) came after JAX initialized its backends" in r.stdout, r.stdout


def test_doctor_reports_the_plugin_and_the_nccl_it_would_load(tmp_path):
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "doctor"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NCCL net plugin" in r.stdout and "libnccl-net-r2ccl.so" in r.stdout, r.stdout
    assert "  used:    " in r.stdout, r.stdout
