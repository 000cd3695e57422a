"""The jax.distributed key-value store, a private JAX API (jax._src.distributed).
Isolated here so that a JAX change breaks one file and one test (tests/test_compat.py)."""

from __future__ import annotations

from ..errors import R2cclError


def distributed_client():
    """The DistributedRuntimeClient of jax.distributed.initialize(), or a clear error."""
    try:
        from jax._src import distributed
    except ImportError as e:  # pragma: no cover - depends on the installed jax
        raise R2cclError(f"this jax has no jax._src.distributed ({e})") from None
    client = getattr(distributed.global_state, "client", None)
    if client is None:
        raise R2cclError("jax.distributed.initialize() has not been called in this process")
    return client


def process_index_and_count() -> tuple[int, int]:
    from jax._src import distributed
    st = distributed.global_state
    return int(st.process_id), int(st.num_processes)


class JaxStore:
    """Bytes-valued set/get over the coordination service of jax.distributed."""

    def __init__(self, client=None):
        self._client = client or distributed_client()

    def set(self, key: str, value: bytes) -> None:
        self._client.key_value_set_bytes(key, value)

    def get(self, key: str, timeout_s: float) -> bytes:
        try:
            return self._client.blocking_key_value_get_bytes(key, int(timeout_s * 1000))
        except Exception as e:  # the client raises a plain XlaRuntimeError
            if "DEADLINE_EXCEEDED" in str(e):
                raise R2cclError(f"bootstrap: key {key!r} not published within {timeout_s} s "
                                 "(did every process start and call the same bootstrap?)",
                                 cause="timeout") from None
            raise
