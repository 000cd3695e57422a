"""Bootstrap: exchange listen addresses and the job secret through a key-value store, then
connect every pair of ranks. Stores: jax.distributed's (JaxStore, the usual multi-host
path), a shared directory (FileStore, for processes on one machine), or explicit addresses
(Endpoint.add_peer)."""

from __future__ import annotations

import json
import os
import time
from typing import Protocol

from .. import _core
from ..config import Config, start_up_settings
from ..errors import R2cclError
from .endpoint import Endpoint


class KeyValueStore(Protocol):
    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str, timeout_s: float) -> bytes: ...


class FileStore:
    """Keys as files in a directory shared by processes on one machine (mode 0700)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(path, mode=0o700, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key.replace("/", "__"))

    def set(self, key: str, value: bytes) -> None:
        tmp = self._file(key) + f".tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.rename(tmp, self._file(key))

    def get(self, key: str, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise R2cclError(f"bootstrap: key {key!r} not published within {timeout_s} s "
                                     "(did every process start?)", cause="timeout") from None
                time.sleep(0.005)


def _same_start_up(mine: dict, raw: bytes, rank: int, peer: int) -> None:
    """Raises a mismatch naming the first start-up setting process `peer` has otherwise."""
    try:
        theirs = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        theirs = None
    if not isinstance(theirs, dict):
        raise R2cclError(f"bootstrap: process {peer}'s start-up settings are malformed ({raw[:80]!r}); "
                         "is every process running the same jax_r2ccl?", cause="protocol", peer=peer)
    for name, value in mine.items():
        if name not in theirs or theirs[name] != value:
            other = repr(theirs[name]) if name in theirs else "no value (another jax_r2ccl version?)"
            raise R2cclError(f"bootstrap: process {peer} started with {name}={other}, process {rank} (this one) "
                             f"with {name}={value!r}; {name} decides which peers a process connects to at "
                             f"start-up, so every process of a job must use the same value", cause="mismatch",
                             peer=peer)


def connect(store: KeyValueStore, rank: int, world: int, *, nics=None, config: Config | None = None,
            prefix: str = "r2ccl", timeout: float | None = None) -> Endpoint:
    """Opens an endpoint on this rank, publishes its addresses, connects to every other
    rank and waits until every rail is up (or, after a grace period, until every peer has
    one: a NIC down at start does not hold the job). The secret comes from R2CCL_SECRET or is made
    by rank 0 and shared through the store."""
    config = config or Config.from_env()
    timeout = config.bootstrap_timeout_s if timeout is None else timeout
    if not 0 <= rank < world:
        raise R2cclError(f"rank {rank} is outside world size {world}")
    secret = config.secret_bytes()
    if secret is None:
        if rank == 0:
            secret = Endpoint.new_secret()
            store.set(f"{prefix}/secret", secret)
        else:
            secret = store.get(f"{prefix}/secret", timeout)
    # The settings that decide whom a process dials, compared before anyone dials: processes
    # started with different ones fail here, every one of them, naming the setting.
    mine = start_up_settings(config)
    store.set(f"{prefix}/start-up/{rank}", json.dumps(mine).encode())
    for peer in range(world):
        if peer != rank:
            _same_start_up(mine, store.get(f"{prefix}/start-up/{peer}", timeout), rank, peer)
    ep = Endpoint(rank, world, nics=nics, secret=secret, config=config)
    try:
        store.set(f"{prefix}/addr/{rank}", json.dumps(ep.addresses).encode())
        # Connections on demand: only the peers a collective over every process uses (all of
        # them up to R2CCL_MAX_PEERS, else the two ring neighbours) are dialled now; any other
        # peer's rails come up on first use.
        first = set(_core.startup_peers(config.algo, rank, world, config.max_peers))
        for peer in range(world):
            if peer != rank:
                addrs = json.loads(store.get(f"{prefix}/addr/{peer}", timeout).decode())
                ep.add_peer(peer, addrs, open=peer in first)
        # A NIC that is down at start must not hold the job: after a grace period, one rail per
        # peer is enough (the others keep re-dialling and join when their link comes up).
        ep.wait_ready(sorted(first), timeout=timeout, degraded_after=max(2.0, 2 * config.connect_timeout_ms / 1000))
        # Everyone's rails are up before anyone starts: a rank that returned early could
        # otherwise act on its rails while a peer still waits for them.
        store.set(f"{prefix}/ready/{rank}", b"1")
        for peer in range(world):
            store.get(f"{prefix}/ready/{peer}", timeout)
    except BaseException:
        ep.close()
        raise
    return ep


def connect_jax(*, nics=None, config: Config | None = None, prefix: str = "r2ccl",
                timeout: float | None = None) -> Endpoint:
    """connect() through jax.distributed's key-value store (after jax.distributed.initialize())."""
    from .._compat.jax_kv import JaxStore, process_index_and_count
    rank, world = process_index_and_count()
    return connect(JaxStore(), rank, world, nics=nics, config=config, prefix=prefix, timeout=timeout)
