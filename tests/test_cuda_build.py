"""The CUDA platform where no GPU exists: the CUDA part is built and linked (CI builds it;
these machines have nvcc and no driver), the module imports and runs on CPU without a
driver, and every collective lowers for "cuda" to the same r2ccl custom call as for "cpu"
(target, operands, attributes, side effect, row-major layouts)."""

import glob
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from jax_rank_main import run_jax_ranks  # noqa: E402

from jax_r2ccl import _core  # noqa: E402

NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
# .ci/run builds one venv with R2CCL_CUDA=off and says so here: that build must have no CUDA part.
CUDA_OFF = os.environ.get("R2CCL_EXPECT_CUDA_PART") == "0"


def _fatbin_entries(so: str):
    """(kind, arch) of every image in the library's .nv_fatbin section: kind 1 PTX, 2 ELF."""
    out = subprocess.run(["readelf", "-S", "-W", so], capture_output=True, text=True, check=True).stdout
    sec = [ln for ln in out.splitlines() if ".nv_fatbin" in ln]
    assert sec, "no .nv_fatbin section: the CUDA kernels were not linked"
    fields = sec[0].split("]", 1)[1].split()
    off, size = int(fields[3], 16), int(fields[4], 16)
    with open(so, "rb") as f:
        f.seek(off)
        data = f.read(size)
    entries, pos = [], 0
    while pos + 16 <= len(data):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            break
        p, end = pos + hsize, pos + hsize + fsize
        while p < end:
            kind, _, eh, esz = struct.unpack_from("<HHIQ", data, p)
            entries.append((kind, struct.unpack_from("<I", data, p + 28)[0]))
            p += eh + esz
        pos = end
    return entries


@pytest.mark.variant
@pytest.mark.skipif(not CUDA_OFF, reason="only for a build made with R2CCL_CUDA=off")
def test_a_build_without_the_cuda_part_says_so_and_registers_no_cuda_target():
    info = _core.cuda_info()
    assert not info["built"] and "R2CCL_CUDA=off" in info["error"], info
    assert _core.ffi_targets_cuda() == {}
    assert "no CUDA part" in subprocess.run([sys.executable, "-m", "jax_r2ccl", "doctor"], capture_output=True,
                                            text=True, cwd="/", timeout=120).stdout


@pytest.mark.variant
@pytest.mark.skipif(not NVCC or CUDA_OFF, reason="no CUDA toolkit on this machine (or an R2CCL_CUDA=off build)")
def test_the_cuda_part_is_built_with_sm80_sm90_and_ptx_and_imports_without_a_driver():
    info = _core.cuda_info()
    assert info["built"], info
    assert info["archs"] == ["sm_80", "sm_90", "compute_90"], info
    assert "r2ccl_collective" in _core.ffi_targets_cuda()
    so = _core.__file__
    kinds = sorted(set(_fatbin_entries(so)))
    assert (2, 80) in kinds and (2, 90) in kinds and (1, 90) in kinds, kinds
    # cudart is linked statically: no libcudart needed at load time
    ldd = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
    assert "libcudart" not in ldd and "libcuda.so" not in ldd, ldd
    if info["driver_version"] == 0:
        assert info["devices"] == 0 and info["error"], info


def test_without_a_gpu_the_cuda_entry_points_raise_a_clear_error():
    info = _core.cuda_info()
    if info["devices"] > 0:
        pytest.skip("a GPU is visible here")
    import numpy as np
    from jax_r2ccl.errors import R2cclError
    with pytest.raises(R2cclError) as e:
        _core.cuda_testing_reduce("float32", "sum", np.zeros(8, np.uint8), np.zeros(8, np.uint8))
    assert e.value.cause == "device"
    # initialize() prepares a process's GPUs only where CUDA sees one; asked directly, it names
    # what is missing (the runtime first, then the device)
    with pytest.raises(R2cclError, match="not initialized"):
        _core.cuda_prepare([0])


KINDS = {name: i for i, name in enumerate(_core.names()["kinds"])}
OPS = {name: i for i, name in enumerate(_core.names()["reduce_ops"])}
EXPECT = {"psum": ("all_reduce", "sum"), "pmean": ("all_reduce", "sum"), "pmax": ("all_reduce", "max"),
          "pmin": ("all_reduce", "min"), "all_gather": ("all_gather", "sum"),
          "psum_scatter": ("reduce_scatter", "sum"), "all_to_all": ("all_to_all", "sum"),
          "swap:psum": ("all_reduce", "sum"), "swap:all_gather": ("all_gather", "sum"),
          "swap:psum_scatter": ("reduce_scatter", "sum")}
MLIR_TYPE = {"float32": "f32", "bfloat16": "bf16", "int32": "i32", "float64": "f64"}


def test_every_collective_lowers_for_cuda_to_the_r2ccl_custom_call():
    rs = run_jax_ranks("cuda_lowering", 1, local=2, timeout=300)
    res = rs[0]["result"]
    assert len(res) == 4 * 7 + 3, sorted(res)
    for key, calls in res.items():
        name, dtype = key.split("/")
        kind, op = EXPECT[name]
        cuda, cpu = calls["cuda"], calls["cpu"]
        assert len(cuda) == 1, (key, cuda)
        assert cuda == cpu, (key, cuda, cpu)          # one lowering for both platforms
        c = cuda[0]
        assert len(c["operands"].split(",")) == 3, (key, c)
        rest = c["rest"]
        assert "has_side_effect = true" in rest, (key, rest)
        assert f"kind = {KINDS[kind]} : i64" in rest and f"reduce_op = {OPS[op]} : i64" in rest, (key, rest)
        for attr in ("comm_id", "op_id", "root"):
            assert re.search(attr + r" = -?\d+ : i64", rest), (key, attr, rest)
        # operands: the data (row-major), then group and rank as s32 scalars
        m = re.search(r": \((tensor<[^>]*>), tensor<i32>, tensor<i32>\) -> (tensor<[^>]*>)", rest)
        assert m and m.group(1).endswith(MLIR_TYPE[dtype] + ">") and m.group(2).endswith(MLIR_TYPE[dtype] + ">"), \
            (key, rest)
        rank = m.group(1).count("x")
        layout = "dense<[" + ", ".join(str(i) for i in reversed(range(rank))) + "]>"
        assert f"operand_layouts = [{layout}" in rest and f"result_layouts = [dense<[" in rest, (key, rest)
