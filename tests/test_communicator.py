"""Ownership you can see (issue 13, item 2): the communicator (_core.Communicator) owns the
executor, the monitor and the collective runtime over an endpoint and closes them in one
order; every part holds what it uses by shared_ptr, so a handle Python keeps (a request, an
executor) never reaches a part that was freed under it. Each case runs in a child process:
a use-after-free here is a crash and must fail the test, not the session. Also run under
ASan/UBSan by test_sanitizers.py."""

from __future__ import annotations

import textwrap

from test_core_faults import SECRET, explain, run_child

ONE = f"""
import gc, threading, time
import numpy as np
from jax_r2ccl import _core
cfg = _core.Config()
cfg.timeout_s = 20.0
ep = _core.Endpoint(cfg, 0, 1, ["127.0.0.1"], {SECRET})
"""


def test_a_request_outlives_the_handle_of_its_endpoint():
    # Before: a Python Request kept a raw Endpoint*; dropping the endpoint's handle freed the
    # endpoint, and waiting on the request then read freed memory. Now the request holds it.
    code = f"""
        import gc, time
        import numpy as np
        from jax_r2ccl import _core
        a = _core.Endpoint(_core.Config(), 0, 2, ["127.0.0.1"], {SECRET})
        b = _core.Endpoint(_core.Config(), 1, 2, ["127.0.0.1"], {SECRET})
        a.add_peer(1, b.addresses)
        b.add_peer(0, a.addresses)
        a.wait_ready([1], 20.0)
        got = np.zeros(1 << 16, np.uint8)
        r = a.irecv(1, got, 3, got)
        del a
        gc.collect()
        t0 = time.monotonic()
        try:
            r.wait(0.3)
            raise AssertionError("the receive finished with nothing sent")
        except Exception as e:
            print("WAIT", type(e).__name__, str(e)[:120])
            assert getattr(e, "cause", None) == "timeout", e
        assert time.monotonic() - t0 < 5
        del r
        gc.collect()
        b.close()
        print("OK")
    """
    r = run_child(code)
    assert r.returncode == 0 and "OK" in r.stdout, explain(r)


def test_closing_the_communicator_fails_a_waiting_local_rendezvous_at_once():
    # Two local ranks of one process; only rank 0 makes its call, so it waits for rank 1.
    # Closing the communicator fails it with 'closed' at once (before: it waited for the
    # runtime's watchdog, R2CCL_TIMEOUT, here 20 s), and the runtime is gone afterwards.
    code = ONE + textwrap.dedent("""
        comm = _core.Communicator(ep, 0)
        _core.register_comm(77, [[0, 0]], "two local ranks")
        pool = _core.StagingPool(1 << 20)
        x = np.arange(1000, dtype=np.float32)
        out = np.zeros_like(x)
        res = {}
        def rank0():
            try:
                _core.testing_staged_call(77, 0, 0, 1, 1, "all_reduce", "float32", "sum", 0, x, out, pool,
                                          4096, timeout=20.0, device_fold=False)
                res["err"] = None
            except Exception as e:
                res["err"] = e
        t = threading.Thread(target=rank0)
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), res
        t0 = time.monotonic()
        comm.close()
        t.join(10)
        took = time.monotonic() - t0
        print("ERR", repr(res.get("err")), round(took, 3))
        assert not t.is_alive()
        assert res["err"] is not None and "shut down" in str(res["err"]), res
        assert took < 5, took
        assert comm.closed
        try:
            _core.register_comm(78, [[0]], "after close")
            raise AssertionError("a communicator registered after close")
        except Exception as e:
            assert "initialize()" in str(e), e
        print("OK")
    """)
    r = run_child(code)
    assert r.returncode == 0 and "OK" in r.stdout, explain(r)


def test_parts_kept_by_python_outlive_the_communicator_and_fail_cleanly():
    # The communicator closes its parts in order (runtime, monitor, executor, endpoint) when
    # it is closed or dropped; a handle Python kept to one of them still works as an object
    # and reports that it is closed.
    code = ONE + textwrap.dedent("""
        comm = _core.Communicator(ep, 0)
        ex, mon = comm.executor, comm.monitor
        assert mon is not None                  # R2CCL_MONITOR_MS defaults on
        assert comm.endpoint is ep              # the same endpoint, not a copy
        x = np.arange(64, dtype=np.float32)
        y = np.zeros_like(x)
        ex.run("all_reduce", "float32", "sum", 0, 1, [0], [0], [x], [y], 64, 10.0)
        assert np.array_equal(x, y)
        del comm
        gc.collect()                            # the communicator is gone: its parts closed
        try:
            ex.run("all_reduce", "float32", "sum", 0, 2, [0], [0], [x], [y], 64, 10.0)
            raise AssertionError("the executor ran after its communicator closed")
        except Exception as e:
            assert getattr(e, "cause", None) == "closed", e
        assert isinstance(mon.rails(), list)
        try:
            ep.isend(0, x, 1, x).wait(1.0)
            raise AssertionError("the endpoint sent after its communicator closed")
        except Exception as e:
            assert getattr(e, "cause", None) == "closed", e
        print("OK")
    """)
    r = run_child(code)
    assert r.returncode == 0 and "OK" in r.stdout, explain(r)


def test_a_communicator_needs_a_process_of_its_endpoint():
    code = ONE + textwrap.dedent("""
        for bad in (-1, 1):
            try:
                _core.Communicator(ep, bad)
                raise AssertionError("opened")
            except Exception as e:
                assert "is not one of the endpoint" in str(e), e
        print("OK")
    """)
    r = run_child(code)
    assert r.returncode == 0 and "OK" in r.stdout, explain(r)
