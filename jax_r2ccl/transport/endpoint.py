"""The multi-rail transport from Python: an endpoint over several NICs, point-to-point
sends and receives of numpy buffers, per-rail counters and software fault injection.
Collectives are built on this (next layer); tests and benchmarks use it directly."""

from __future__ import annotations

import secrets as _secrets
from typing import Sequence

import numpy as np

from .. import _core
from ..config import Config
from ..errors import R2cclError
from .topology import local_gpu_pci, nic_order

FAULTS = ("close", "stall", "rate", "heal")


def _as_buffer(arr, writable: bool) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise R2cclError(f"expected a numpy array, got {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise R2cclError("the buffer must be C-contiguous (use np.ascontiguousarray)")
    if writable and not arr.flags.writeable:
        raise R2cclError("the receive buffer is read-only")
    # A byte view: the core moves bytes and must not care about the dtype.
    return arr.reshape(-1).view(np.uint8)


class Request:
    """A posted send or receive; `wait()` raises R2cclError on failure or timeout."""

    def __init__(self, core_req, array):
        self._req = core_req
        self._array = array

    def wait(self, timeout: float | None = None):
        self._req.wait(-1.0 if timeout is None else float(timeout))
        return self._array

    def done(self) -> bool:
        return self._req.done()


class Endpoint:
    """This process's end of the transport: one listener per NIC, a channel per peer.

    Args:
      rank, world: this process's rank and the number of processes.
      nics: interface names or IPv4 addresses; default: the config's R2CCL_NICS, else the
        interfaces that are up, nearest this process's GPUs first (R2CCL_NIC_AFFINITY).
      secret: the job secret (bytes, >= 16), identical on every rank.
      config: a Config; default Config.from_env().
    """

    def __init__(self, rank: int, world: int, nics: Sequence[str] | None = None,
                 secret: bytes | None = None, config: Config | None = None):
        self.config = config or Config.from_env()
        self.nics = list(nics) if nics is not None else nic_order(self.config, local_gpu_pci())[0]
        if secret is None:
            secret = self.config.secret_bytes()
        if secret is None:
            raise R2cclError("an endpoint needs the job secret (bootstrap shares one)")
        self._ep = _core.Endpoint(self.config.to_core(), int(rank), int(world), self.nics, bytes(secret))
        self._registered: dict[int, np.ndarray] = {}   # register_memory: id -> the array it keeps alive
        self.rank, self.world = int(rank), int(world)
        self.peers: list[int] = []

    @staticmethod
    def new_secret() -> bytes:
        return _secrets.token_bytes(32)

    @property
    def addresses(self) -> list[str]:
        """'ip:port' of this endpoint's listener on each NIC, in NIC order ('ibverbs:ip:port'
        where the NIC's rails run over RDMA verbs)."""
        return list(self._ep.addresses)

    @property
    def transports(self) -> list[str]:
        """Each NIC's transport, 'socket' or 'ibverbs' (R2CCL_TRANSPORT), in NIC order."""
        return list(self._ep.transports)

    def add_peer(self, peer: int, addresses: Sequence[str], open: bool = True) -> None:
        """Declares a peer. open: its rails start connecting now; else on first use (the first
        send or receive with it, open(), or the peer's own first rail)."""
        self._ep.add_peer(int(peer), list(addresses), bool(open))
        self.peers.append(int(peer))

    def open(self, peers: Sequence[int]) -> None:
        """The peers' rails start connecting (no-op for a peer already open)."""
        self._ep.open([int(p) for p in peers])

    def opened_peers(self) -> list[int]:
        """The peers whose rails are wanted (connected or connecting), in rank order."""
        return list(self._ep.opened_peers())

    def wait_ready(self, peers: Sequence[int] | None = None, timeout: float | None = None,
                   degraded_after: float | None = None) -> None:
        """Waits until every rail to the peers (default: the opened ones) is up (R2cclError naming the missing ones on
        timeout). degraded_after: after that many seconds, settle for at least one rail per
        peer (the rest are logged and keep re-dialling)."""
        peers = self.opened_peers() if peers is None else list(peers)
        self._ep.wait_ready(peers, self.config.timeout_s if timeout is None else float(timeout),
                            -1.0 if degraded_after is None else float(degraded_after))

    def isend(self, peer: int, array: np.ndarray, tag: int = 0) -> Request:
        """Sends `array` to `peer`. Completes when the peer acknowledged every byte, or, for a
        send up to R2CCL_EAGER_BYTES, as soon as its bytes are copied (see the README)."""
        buf = _as_buffer(array, writable=False)
        return Request(self._ep.isend(int(peer), buf, int(tag), array), array)

    def irecv(self, peer: int, array: np.ndarray, tag: int = 0) -> Request:
        buf = _as_buffer(array, writable=True)
        return Request(self._ep.irecv(int(peer), buf, int(tag), array), array)

    def register_memory(self, array: np.ndarray) -> int:
        """Registers `array`'s memory with every transport of this endpoint (RDMA: with every
        device) for zero-copy transfers, and returns its id: a send from it is written straight
        into a receive its peer registered too (one-sided RDMA writes, no copy on either side),
        and a receive into it is offered to its sender. Requests find it by address. The
        endpoint keeps `array` alive until deregister_memory(id)."""
        buf = _as_buffer(array, writable=True)
        rid = self._ep.register_memory(buf)
        self._registered[rid] = array
        return rid

    def register_dmabuf(self, array: np.ndarray, fd: int, offset: int = 0) -> int:
        """register_memory for memory a dma-buf backs (`fd`, `array`'s bytes at `offset` in it):
        the GPUDirect registration (ibv_reg_dmabuf_mr on every device). The memory must be
        readable by the CPU at `array`'s address (host memory exported through udmabuf): the
        endpoint does not move device memory yet. Raises R2cclError("invalid_argument") naming
        why where a transport takes no dma-buf (see dmabuf_support()). `fd` may be closed after."""
        buf = _as_buffer(array, writable=True)
        rid = self._ep.register_dmabuf(buf, fd, offset)
        self._registered[rid] = array
        return rid

    def dmabuf_support(self) -> str:
        """Empty when every transport of this endpoint takes dma-buf registrations; else why not,
        per transport and device (the driver's answer to the probe)."""
        return self._ep.dmabuf_support()

    def deregister_memory(self, rid: int) -> None:
        """Drops the endpoint's registration `rid`; requests still using it keep it until they end."""
        self._ep.deregister_memory(int(rid))
        self._registered.pop(int(rid), None)

    def send(self, peer: int, array: np.ndarray, tag: int = 0, timeout: float | None = None) -> None:
        self.isend(peer, array, tag).wait(timeout)

    def recv(self, peer: int, array: np.ndarray, tag: int = 0, timeout: float | None = None) -> np.ndarray:
        return self.irecv(peer, array, tag).wait(timeout)

    def rail_stats(self, peer: int) -> list[dict]:
        return self._ep.rail_stats(int(peer))

    def inject(self, peer: int, rail: int, fault: str, rate_bytes_per_s: float = 0.0) -> dict:
        """Software fault on this side of one rail (sticky until 'heal'):
        'close' shuts the connection and keeps it down, 'stall' stops reading and writing
        (a black hole), 'rate' caps its sending rate, 'heal' ends the fault.

        Returns what the rail held unacknowledged at that moment, measured on the engine
        thread: {'unacked_chunks': n, 'unacked_bytes': b}. After 'close' those chunks go to
        the other rails; zero means the fault fell between transfers."""
        if fault not in FAULTS:
            raise R2cclError(f"unknown fault {fault!r}; use one of {', '.join(FAULTS)}")
        return self._ep.inject(int(peer), int(rail), fault, float(rate_bytes_per_s))

    def set_rail_weight(self, peer: int, rail: int, weight: float) -> None:
        self._ep.set_rail_weight(int(peer), int(rail), float(weight))

    def set_nic_state(self, nic: int, up: bool, why: str = "set by the caller") -> None:
        """Declares local NIC `nic` (index into self.nics) down or up: down fails its rails at
        once on both ends and keeps them from re-dialling; up re-dials them. The health
        monitor calls this on the kernel's link events."""
        self._ep.set_nic_state(int(nic), bool(up), str(why))

    def close(self) -> None:
        self._ep.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
