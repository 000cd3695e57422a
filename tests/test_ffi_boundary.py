"""The FFI boundary (csrc/ffi/boundary.h) on CPU: no C++ exception reaches XLA (it would end
the process), every failure is a JaxRuntimeError starting "[r2ccl <cause>", raised on every
device of the program without a hang, result buffers are checked before anything is written,
and the process's next collective is exact."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from jax_rank_main import run_jax_ranks  # noqa: E402


def test_exceptions_and_wrong_result_buffers_become_errors_and_the_process_goes_on():
    rs = run_jax_ranks("ffi_boundary", 1, local=2, timeout=180, config={"timeout_s": 10.0})
    r = rs[0]["result"]
    want = r["want"]
    assert r["before"]["value"] == want, r["before"]
    # a std::exception and an unknown exception: cause "internal", naming the handler
    for what in ("std", "other"):
        e = r[what]["error"]
        assert e and "[r2ccl internal]" in e and "r2ccl_collective (cpu)" in e, r[what]
    assert "injected std::runtime_error" in r["std"]["error"]
    assert "unknown type" in r["other"]["error"]
    # an r2ccl::Error keeps its cause and peer
    assert "[r2ccl system, peer 3]" in r["error"]["error"], r["error"]
    # the other local device did not wait for the one that threw: well under R2CCL_TIMEOUT
    for what in ("std", "error", "other"):
        assert r[what]["seconds"] < 8, r[what]
        assert r[what + "_after"] == {"error": None, "value": want, "seconds": r[what + "_after"]["seconds"]}, \
            r[what + "_after"]
    short = r["short_result"]["error"]
    assert short and "[r2ccl invalid_argument]" in short and "result buffer holds 15" in short, short
    wrong = r["wrong_dtype_result"]["error"]
    assert wrong and "[r2ccl invalid_argument]" in wrong and "dtype" in wrong, wrong
    assert r["after_all"]["value"] == want, r["after_all"]
