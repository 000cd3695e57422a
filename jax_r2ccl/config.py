"""Every R2CCL_* setting in one table: name, type, default, doc. The C++ core mirrors it
(csrc/base/config.h); `Config.from_env()` reads the environment, keyword arguments
override, and `to_core()` hands the result to the C++ struct."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .errors import R2cclError

_LEVELS = {"ERROR": 0, "WARN": 1, "WARNING": 1, "INFO": 2, "TRACE": 3}


@dataclasses.dataclass(frozen=True)
class Setting:
    env: str
    field: str
    kind: type
    default: Any
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("R2CCL_NICS", "nics", str, "",
            "Comma-separated NICs (interface names or IPv4 addresses) to stripe over; empty: every "
            "non-loopback interface that is up, else 127.0.0.1."),
    Setting("R2CCL_TRANSPORT", "transport", str, "socket",
            "Transport backend: socket (TCP). ibverbs is not built yet."),
    Setting("R2CCL_CHUNK_BYTES", "chunk_bytes", int, 256 << 10,
            "Payload bytes per chunk; chunks are dealt to rails by weight."),
    Setting("R2CCL_RAIL_WINDOW_BYTES", "rail_window_bytes", int, 1 << 20,
            "Unacknowledged bytes one rail may carry (what a failure re-sends at most per rail). Keep "
            "it near the bandwidth-delay product: more only fills switch and qdisc queues, which delays "
            "the acks of traffic in the other direction (measured: 4 MiB cost 12% of all-reduce busbw)."),
    Setting("R2CCL_CONNS_PER_NIC", "conns_per_nic", int, 1,
            "TCP connections per NIC pair (each is a rail of its own)."),
    Setting("R2CCL_TIMEOUT", "timeout_s", float, 30.0,
            "Seconds an operation may wait, and how long every rail to a peer may stay down, "
            "before it fails with an error naming the peer."),
    Setting("R2CCL_BOOTSTRAP_TIMEOUT", "bootstrap_timeout_s", float, 300.0,
            "Seconds bootstrap waits for every rank to publish its addresses and for rails to come up."),
    Setting("R2CCL_HEARTBEAT_MS", "heartbeat_ms", int, 100,
            "Heartbeat period on idle rails."),
    Setting("R2CCL_HEARTBEAT_MISSES", "heartbeat_misses", int, 3,
            "Heartbeat periods of silence after which a rail is declared failed."),
    Setting("R2CCL_STALL_MS", "stall_ms", int, 250,
            "A rail with unacknowledged chunks and no ack for this long, while a sibling rail "
            "is alive, is declared failed (black-hole detection)."),
    Setting("R2CCL_REPROBE_MS", "reprobe_ms", int, 200,
            "Period of reconnect attempts on a failed rail (failback)."),
    Setting("R2CCL_CONNECT_TIMEOUT_MS", "connect_timeout_ms", int, 2000,
            "Deadline of one connect plus handshake."),
    Setting("R2CCL_TCP_USER_TIMEOUT_MS", "tcp_user_timeout_ms", int, 5000,
            "TCP_USER_TIMEOUT on every connection: the kernel's bound on unacknowledged data."),
    Setting("R2CCL_SOCKET_BUFFER_BYTES", "socket_buffer_bytes", int, 4 << 20,
            "SO_SNDBUF and SO_RCVBUF of every connection (0: kernel default)."),
    Setting("R2CCL_CRC", "crc", bool, False,
            "CRC32C over every chunk's payload, checked by the receiver."),
    Setting("R2CCL_BIND_DEVICE", "bind_device", bool, True,
            "Also bind sockets to their NIC's device (SO_BINDTODEVICE) where permitted."),
    Setting("R2CCL_PORT", "port", int, 0,
            "First listen port (NIC i listens on PORT+i); 0 picks free ports."),
    Setting("R2CCL_MAX_MESSAGE_BYTES", "max_message_bytes", int, 1 << 36,
            "Largest message a receiver accepts from the network."),
    Setting("R2CCL_MONITOR_MS", "monitor_ms", int, 50,
            "Sampling period of the health monitor (rail bandwidth, weights, events); 0 turns the "
            "monitor off (link events are then seen only through rail timers)."),
    Setting("R2CCL_ADAPTIVE_WEIGHTS", "adaptive_weights", bool, True,
            "Rail weights follow each rail's measured delivered bandwidth (with hysteresis), so a "
            "degraded NIC carries only what it can finish in time. Off: every rail weighs 1."),
    Setting("R2CCL_LINK_HOLDDOWN_MS", "link_holddown_ms", int, 100,
            "A NIC whose link comes back up is re-admitted after this long, doubled for every "
            "further link failure in the last 10 s (up to 16x): a flapping link stays out."),
    Setting("R2CCL_PLAN", "plan", str, "auto",
            "All-reduce plan for large messages: which share each process owns (reduces and sends "
            "back). balance: equal; r2cc: R2CCL's R2CC-AllReduce; weighted: by capacity; optimal: "
            "min-max of the cost model; auto: the model's fastest. Capacities come from the health "
            "monitor and travel with each call, so every process runs the same plan. Results are "
            "bit-identical under every plan. Must be equal on every process."),
    Setting("R2CCL_SYNC_WAIT_US", "sync_wait_us", int, 1000,
            "Microseconds XLA's thread waits inside the custom call for a small collective (<= 64 "
            "KiB) that is the process's only one in flight, so the program continues on that thread "
            "without a hand-over (latency); after that the call completes asynchronously. 0: never wait."),
    Setting("R2CCL_SECRET", "secret", str, "",
            "The job secret (hex). Empty: rank 0 makes a random one and shares it at bootstrap."),
    Setting("R2CCL_DEBUG", "debug", str, "WARN",
            "Log level of the one logger: ERROR, WARN, INFO or TRACE."),
)


def _parse(s: Setting, raw: str) -> Any:
    try:
        if s.kind is bool:
            v = raw.strip().lower()
            if v in ("1", "true", "yes", "on"):
                return True
            if v in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if s.kind is int:
            return int(raw, 0)
        if s.kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise R2cclError(f"{s.env}={raw!r} is not a valid {s.kind.__name__}") from None


@dataclasses.dataclass(frozen=True)
class Config:
    nics: str = ""
    transport: str = "socket"
    chunk_bytes: int = 256 << 10
    rail_window_bytes: int = 1 << 20
    conns_per_nic: int = 1
    timeout_s: float = 30.0
    bootstrap_timeout_s: float = 300.0
    heartbeat_ms: int = 100
    heartbeat_misses: int = 3
    stall_ms: int = 250
    reprobe_ms: int = 200
    connect_timeout_ms: int = 2000
    tcp_user_timeout_ms: int = 5000
    socket_buffer_bytes: int = 4 << 20
    crc: bool = False
    bind_device: bool = True
    port: int = 0
    max_message_bytes: int = 1 << 36
    monitor_ms: int = 50
    adaptive_weights: bool = True
    link_holddown_ms: int = 100
    plan: str = "auto"
    sync_wait_us: int = 1000
    secret: str = ""
    debug: str = "WARN"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "Config":
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for s in SETTINGS:
            if s.env in env:
                values[s.field] = _parse(s, env[s.env])
        unknown = set(overrides) - {s.field for s in SETTINGS}
        if unknown:
            raise R2cclError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values.update(overrides)
        cfg = cls(**values)
        cfg.check()
        return cfg

    def sources(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """Where each value came from: 'env', 'default' or 'override'."""
        env = os.environ if env is None else env
        out = {}
        for s in SETTINGS:
            v = getattr(self, s.field)
            out[s.env] = "env" if s.env in env and _parse(s, env[s.env]) == v else (
                "default" if v == s.default else "override")
        return out

    def check(self) -> None:
        if self.transport not in ("socket", "auto"):
            raise R2cclError(f"R2CCL_TRANSPORT={self.transport!r}: only 'socket' is built "
                             "(ibverbs is planned)")
        if self.debug.upper() not in _LEVELS:
            raise R2cclError(f"R2CCL_DEBUG={self.debug!r}: use ERROR, WARN, INFO or TRACE")
        msg = self.to_core().validate()
        if msg:
            raise R2cclError(msg)

    def nic_list(self) -> list[str]:
        if self.nics.strip():
            return [n.strip() for n in self.nics.split(",") if n.strip()]
        return default_nics()

    def secret_bytes(self) -> bytes | None:
        if not self.secret:
            return None
        try:
            b = bytes.fromhex(self.secret)
        except ValueError:
            raise R2cclError("R2CCL_SECRET must be hex") from None
        if len(b) < 16:
            raise R2cclError("R2CCL_SECRET must hold at least 16 bytes (32 hex digits)")
        return b

    def to_core(self):
        from . import _core
        c = _core.Config()
        for s in SETTINGS:
            if hasattr(c, s.field):
                setattr(c, s.field, getattr(self, s.field))
        c.debug_level = _LEVELS.get(self.debug.upper(), 1)
        return c


def default_nics() -> list[str]:
    """Non-loopback interfaces that are up and have an IPv4 address; else 127.0.0.1."""
    import socket
    import struct
    import fcntl
    names = []
    try:
        for _, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                with open(f"/sys/class/net/{name}/operstate") as f:
                    if f.read().strip() not in ("up", "unknown"):
                        continue
            except OSError:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                names.append(name)
            except OSError:
                pass
            finally:
                s.close()
    except OSError:
        pass
    return names or ["127.0.0.1"]


def settings_table() -> str:
    """The README's settings table (markdown), generated from SETTINGS."""
    rows = ["| Setting | Default | What it does |", "|---|---|---|"]
    for st in SETTINGS:
        d = st.default
        if st.kind is bool:
            d = "1" if d else "0"
        rows.append(f"| `{st.env}` | `{d if d != '' else '(empty)'}` | {st.doc} |")
    return "\n".join(rows) + "\n"
