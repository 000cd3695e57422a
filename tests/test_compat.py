"""The private jax.distributed key-value store API, isolated in jax_r2ccl/_compat/jax_kv.py:
if a JAX release moves it, this test says so first."""

import os
import subprocess
import sys
import textwrap


from jax_rank_main import _free_port  # noqa: E402


def test_jax_distributed_key_value_store_round_trip():
    code = textwrap.dedent(f"""
        import os
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        jax.distributed.initialize(coordinator_address="127.0.0.1:{_free_port()}", num_processes=1, process_id=0)
        from jax_r2ccl._compat.jax_kv import JaxStore, process_index_and_count
        from jax_r2ccl.errors import R2cclError
        kv = JaxStore()
        kv.set("r2ccl-test/k", b"\\x00\\xffbytes")
        assert kv.get("r2ccl-test/k", 5) == b"\\x00\\xffbytes"
        assert process_index_and_count() == (0, 1)
        try:
            kv.get("r2ccl-test/missing", 0.2)
        except R2cclError as e:
            assert e.cause == "timeout" and "missing" in str(e)
        else:
            raise AssertionError("no timeout")
        jax.distributed.shutdown()
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_missing_initialize_is_a_clear_error():
    code = textwrap.dedent("""
        from jax_r2ccl._compat.jax_kv import distributed_client
        from jax_r2ccl.errors import R2cclError
        try:
            distributed_client()
        except R2cclError as e:
            assert "jax.distributed.initialize" in str(e)
            print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "OK" in out.stdout, out.stdout + out.stderr


def test_keep_when_unused_survives_jax_dead_code_elimination():
    """jaxapi.keep_when_unused registers a rule in JAX's private DCE table, whose rule
    signature changed in jax 0.11 ((used_outputs, eqn) -> (used_outputs, live_ins, eqn))."""
    import pytest
    pytest.importorskip("jax")
    import jax
    from jax_r2ccl._compat import jaxapi

    def make(name):
        p = jaxapi.Primitive(name)
        p.def_impl(lambda x: x)
        p.def_abstract_eval(lambda aval: aval)
        return p

    kept, dropped = make("r2ccl_test_kept"), make("r2ccl_test_dropped")
    jaxapi.keep_when_unused(kept)
    jaxpr = jax.make_jaxpr(lambda x: (kept.bind(x), dropped.bind(x), x)[2])(1.0).jaxpr
    assert [e.primitive for e in jaxpr.eqns] == [kept, dropped]
    new, used_inputs = jaxapi._pe.dce_jaxpr(jaxpr, [True])
    assert [e.primitive for e in new.eqns] == [kept]
    assert used_inputs == [True]
