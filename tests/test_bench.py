"""`jax-r2ccl bench p2p` over loopback rails: every row reports each end's CPU seconds per GB,
and `--baseline iperf3` adds iperf3 rows over the same NICs in the same run (skipped where
iperf3 is not installed; CI installs it)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

# The benchmark tool runs its rows checked; the proof tier runs them (iperf3 comes from Debian).
pytestmark = pytest.mark.proof

from jax_rank_main import _free_port


def _p2p(tmp_path, *extra, timeout=150):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = tmp_path / "p2p.json"
    procs = []
    for i in (1, 0):
        cmd = [sys.executable, "-m", "jax_r2ccl", "bench", "p2p", "--coordinator", f"127.0.0.1:{port}",
               "--num-processes", "2", "--process-id", str(i), "--nics", "127.0.0.1,127.0.0.2",
               "--iters", "2", "--warmup", "1", "--timeout", "60", *extra]
        if i == 0:
            cmd += ["--json", str(out)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                      cwd=tmp_path))
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rcs = [p.returncode for p in procs]
    return rcs, "\n".join(texts), json.loads(out.read_text()) if out.exists() else None


@pytest.mark.timeout(200)
def test_every_p2p_row_reports_cpu_per_gb_on_both_ends(tmp_path):
    rcs, text, doc = _p2p(tmp_path, "--sizes", "4MiB", "--no-baselines")
    assert rcs == [0, 0], text[-4000:]
    assert "cpu/GB snd" in text and "cpu/GB rcv" in text, text[-4000:]
    (row,) = [r for r in doc["results"] if r["impl"] == "r2ccl"]
    assert row["wrong"] == 0 and row["iters"] == 2
    # Each end spent some CPU on the two timed 4 MiB transfers, and the per-GB figure is that
    # CPU (user + system) over the bytes moved.
    for side in ("send", "recv"):
        v = row[f"cpu_{side}_s_per_GB"]
        assert v is not None and v > 0, (side, row)
        user, system = row[f"cpu_{side}"]
        assert abs((user + system) / (2 * 4 * 2**20 / 1e9) - v) < 1e-9, (side, row)
    # Copies per byte, each end: the socket backend copies nothing itself (the kernel's copies are
    # not the transport's); tests/test_verbs.py checks the verbs bounce path's 1 + 1.
    assert row["copies_per_byte"] == {"send": 0.0, "recv": 0.0}, row
    assert "copies/B" in text and "0.00+0.00" in text, text[-4000:]


@pytest.mark.timeout(200)
def test_io_thread_rows_run_on_their_own_threads(tmp_path):
    """--io-threads 0,2: each end of r2ccl-io2 ran its two loopback NICs' socket calls on two
    named I/O threads beside the engine thread (NICs are dealt by NIC, not by the interface
    "lo" they share); r2ccl-io0 ran none. Counted from /proc's threads, not from CPU ticks."""
    rcs, text, doc = _p2p(tmp_path, "--sizes", "4MiB", "--no-baselines", "--io-threads", "0,2")
    assert rcs == [0, 0], text[-4000:]
    rows = {r["impl"]: r for r in doc["results"]}
    assert {"r2ccl", "r2ccl-io0", "r2ccl-io2"} <= set(rows), text[-4000:]
    assert all(r["wrong"] == 0 and r["iters"] == 2 for r in rows.values()), rows
    for rank in ("0", "1"):
        io2 = doc["thread_cpu"][rank][f"r2ccl-io2/{4 << 20}"]["roles"]
        io0 = doc["thread_cpu"][rank][f"r2ccl-io0/{4 << 20}"]["roles"]
        assert io2["r2ccl-io"][1] == 2 and io2["r2ccl-engine"][1] == 1, (rank, io2)
        assert "r2ccl-io" not in io0 and io0["r2ccl-engine"][1] == 1, (rank, io0)
    assert "# cpu by thread, r2ccl-io2 4MiB" in text, text[-4000:]


@pytest.mark.timeout(200)
def test_the_tcp_threads_baseline_moves_the_same_buffers_checked(tmp_path):
    rcs, text, doc = _p2p(tmp_path, "--sizes", "4MiB", "--no-baselines", "--baseline", "tcp-threads")
    assert rcs == [0, 0], text[-4000:]
    rows = {r["impl"]: r for r in doc["results"]}
    assert set(rows) == {"r2ccl", "tcp-threads"}, text[-4000:]
    row = rows["tcp-threads"]
    assert row["rails"] == 2 and row["iters"] == 2 and row["wrong"] == 0, row
    assert row["algbw_GBps"] > 0 and row["cpu_send_s_per_GB"] > 0 and row["cpu_recv_s_per_GB"] > 0, row


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed (Debian: apt install iperf3)")
@pytest.mark.timeout(200)
def test_the_iperf3_baseline_runs_over_the_same_nics_in_the_same_run(tmp_path):
    rcs, text, doc = _p2p(tmp_path, "--sizes", "16MiB", "--no-baselines", "--baseline", "iperf3")
    assert rcs == [0, 0], text[-4000:]
    impls = {r["impl"]: r for r in doc["results"]}
    assert set(impls) == {"r2ccl", "iperf3", "iperf3-1"}, text[-4000:]
    assert impls["iperf3"]["rails"] == 2 and impls["iperf3-1"]["rails"] == 1
    for name in ("iperf3", "iperf3-1"):
        r = impls[name]
        assert r["wrong"] == 0 and r["iters"] == 2, r
        assert r["algbw_GBps"] and r["algbw_GBps"] > 0, r
        assert r["cpu_send_s_per_GB"] and r["cpu_recv_s_per_GB"], r
    # One-shot servers: none is left behind.
    left = subprocess.run(["pgrep", "-f", "iperf3 -s -1 -B 127.0.0"], capture_output=True, text=True).stdout
    assert not left.strip(), left
