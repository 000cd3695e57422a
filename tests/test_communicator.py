"""Ownership you can see (issue 13, item 2): the communicator (_core.Communicator) owns the
executor, the monitor and the collective runtime over an endpoint and closes them in one
order; every part holds what it uses by shared_ptr, so a handle Python keeps (a request, an
executor) never reaches a part that was freed under it. Each case runs in a child process:
a use-after-free here is a crash and must fail the test, not the session. Also run under
ASan/UBSan by test_sanitizers.py."""

from __future__ import annotations

import textwrap

from test_core_faults import SECRET, explain, pair, run_child

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
        pool = _core.StagingPool(1 << 20, 4096)
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
        # The staged call (what the CUDA handler runs) counts as in progress: shutdown's drain
        # waits for it, and gives up at its deadline with the call still there.
        assert comm.calls_in_progress == 1, comm.calls_in_progress
        t0 = time.monotonic()
        assert comm.drain(0.3) == 1
        assert 0.25 < time.monotonic() - t0 < 5
        t0 = time.monotonic()
        comm.close()
        t.join(10)
        took = time.monotonic() - t0
        print("ERR", repr(res.get("err")), round(took, 3))
        assert not t.is_alive()
        assert comm.calls_in_progress == 0 and comm.drain(0.0) == 0
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


def test_closing_an_executor_under_small_collectives_ends_every_call_at_once():
    # Small all-reduces complete on the engine thread and wait in the executor's queue
    # without waking it; the peer's halves arrive while the executor closes. Before the fix
    # the closing executor held its queue lock while each op cancelled its requests (a wait
    # for the engine thread), and the engine thread, delivering a half, waited for that lock:
    # every cancel waited out Engine::call's deadline (30 s; 2 s here), then failed, leaving
    # the engine free to write into buffers freed with the op. Now close() returns at once and
    # every call has ended (exact, or failed with `closed` naming it).
    code = pair("""
        import random, threading
        a.testing_set_call_timeout(2.0)
        rng = random.Random(7)
        worst, ended, exact, closed = 0.0, 0, 0, 0
        N = 32
        for rnd in range(25):
            exa, exb = _core.Collectives(a, 0), _core.Collectives(b, 1)
            res = {}
            go = threading.Event()
            def call(ex, who, i):
                if who == 1:
                    go.wait(10)
                x = np.full(16, float(i + 1), np.float32)
                y = np.zeros_like(x)
                try:
                    ex.run("all_reduce", "float32", "sum", 0, 1000 * rnd + i, [0, 1], [who], [x], [y], 16, 20.0)
                    res[(who, i)] = "exact" if np.array_equal(y, 2 * x) else "WRONG"
                except Exception as e:
                    res[(who, i)] = getattr(e, "cause", "?") + ": " + str(e)[:160]
            ts = [threading.Thread(target=call, args=(exa, 0, i)) for i in range(N)]
            tb = [threading.Thread(target=call, args=(exb, 1, i)) for i in range(N)]
            for t in ts + tb:
                t.start()
            time.sleep(0.05)   # a's calls are all posted and wait for b's halves
            go.set()           # b's halves leave now, while a's executor closes
            time.sleep(rng.uniform(0.0, 0.002))
            t0 = time.monotonic()
            exa.close()
            worst = max(worst, time.monotonic() - t0)
            for t in ts:
                t.join(10)
            assert not any(t.is_alive() for t in ts), ("a call on the closed executor never ended", rnd, res)
            exb.close()   # its calls that wanted the closed one fail at once too
            for t in tb:
                t.join(10)
            assert not any(t.is_alive() for t in tb), ("a call on the peer never ended", rnd, res)
            for k, v in res.items():
                assert v == "exact" or v.startswith("closed:"), (rnd, k, v)
                if k[0] == 0:
                    ended += 1
                    exact += v == "exact"
                    closed += v.startswith("closed:") and "all_reduce" in v
        print("WORST_CLOSE_S", round(worst, 3), "ENDED", ended, "EXACT", exact, "CLOSED_NAMED", closed)
        assert ended == 25 * N and exact + closed == ended, (ended, exact, closed)
        assert worst < 1.0, worst
        print("OK")
    """)
    r = run_child(code, timeout=240)
    assert r.returncode == 0 and "OK" in r.stdout, explain(r)
