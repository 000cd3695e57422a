"""Every R2CCL_* setting in one table: name, field, type, doc. Defaults are not written here
for the settings the C++ core has (csrc/base/config.h is their one source; they are read back
through _core.config_defaults()); the Python-only settings (NICs, NIC affinity,
bootstrap timeout, secret) carry theirs in their row, and R2CCL_DEBUG's is the name of the core's
default log level. `Config` is generated from the table: `Config.from_env()` reads the
environment, keyword arguments override, and `to_core()` hands the result to the C++ struct.
Must not know jax or anything above the core tier."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from . import _core
from .errors import R2cclError

_CORE_DEFAULTS: dict[str, Any] = _core.config_defaults()
_NAMES: dict[str, list[str]] = _core.names()
CONSTANTS: dict[str, int] = _core.constants()

# R2CCL_DEBUG's names -> the core's debug_level (the index into its level names).
_LEVELS = {name: i for i, name in enumerate(_NAMES["log_levels"])}
_LEVELS["WARNING"] = _LEVELS["WARN"]

# Fields of the C++ Config that have no setting of their own: R2CCL_DEBUG (`debug`, a name)
# becomes debug_level in to_core().
CORE_ONLY_FIELDS = frozenset({"debug_level"})

_FROM_CORE = object()   # a row's default: the C++ struct's


def _size(n: int) -> str:
    """65536 -> '64 KiB' (what the docs say of a size constant)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _one_of(names) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


@dataclasses.dataclass(frozen=True)
class Setting:
    env: str
    field: str
    kind: type
    doc: str
    default: Any = _FROM_CORE

    def __post_init__(self):
        # A default is written once: in C++ for the core's fields, in the row for the others.
        if self.default is _FROM_CORE:
            if self.field not in _CORE_DEFAULTS:
                raise TypeError(f"{self.env}: {self.field} is not a field of the C++ Config; give its default")
            object.__setattr__(self, "default", self.kind(_CORE_DEFAULTS[self.field]))
        elif self.field in _CORE_DEFAULTS:
            raise TypeError(f"{self.env}: the default of {self.field} comes from the C++ Config; do not repeat it")

    @property
    def python_only(self) -> bool:
        return self.field not in _CORE_DEFAULTS


SETTINGS: tuple[Setting, ...] = (
    Setting("R2CCL_NICS", "nics", str,
            "Comma-separated NICs (interface names or IPv4 addresses) to stripe over; empty: every "
            "non-loopback interface that is up, else 127.0.0.1.",
            default=""),
    Setting("R2CCL_NIC_AFFINITY", "nic_affinity", str,
            "Order of the default NICs. auto: nearest first (PCIe distance) to this process's GPUs "
            "(rail 0 = nearest; collectives still stripe over all of them); off: interface order. "
            "An explicit R2CCL_NICS is used exactly as given.",
            default="auto"),
    Setting("R2CCL_TRANSPORT", "transport", str,
            "Transport per NIC: socket (TCP), ibverbs (RDMA verbs, RoCE or InfiniBand: every NIC must map "
            "to an ACTIVE RDMA port, else an error names it) or auto (ibverbs on the NICs that map to "
            "an ACTIVE RDMA port, sockets elsewhere). Every rank must reach the same choice for a NIC "
            "pair. `jax-r2ccl doctor` shows the NIC-to-port map."),
    Setting("R2CCL_IB_TIMEOUT", "ib_timeout", int,
            "Verbs ACK timeout exponent (1..31): 4.096 us x 2^this per try; with R2CCL_IB_RETRY_COUNT "
            "retries it bounds how long a dead path takes to error a queue pair (the default: about "
            "0.5 s; NCCL's 20 and 7 take 34 s). Heartbeats and port events usually find it first."),
    Setting("R2CCL_IB_RETRY_COUNT", "ib_retry_count", int, "Verbs transport retries (0..7) before a queue pair errors."),
    Setting("R2CCL_IB_GID_INDEX", "ib_gid_index", int,
            "RoCE GID index (-1: the RoCEv2 GID that holds the NIC's IPv4 address)."),
    Setting("R2CCL_CHUNK_BYTES", "chunk_bytes", int,
            f"Largest payload per chunk ({_size(CONSTANTS['min_chunk_bytes'])} to "
            f"{_size(CONSTANTS['max_chunk_bytes'])}); a rail's chunks are a quarter of its window, "
            "at least 16 KiB (or this, when smaller), at most this."),
    Setting("R2CCL_RAIL_WINDOW_BYTES", "rail_window_bytes", int,
            "Most unacknowledged bytes one rail may carry (what a failure re-sends at most per rail). "
            "Below it each rail's window follows its own measured bandwidth x R2CCL_RAIL_QUEUE_MS "
            "(plus its round trip; at least 32 KiB), and its chunks are a quarter of that window."),
    Setting("R2CCL_RAIL_QUEUE_MS", "rail_queue_ms", int,
            "Target queueing delay per rail: its window holds its measured bandwidth x this. Small "
            "enough that NIC and switch queues shared by many peers do not overflow; large enough to "
            "cover the acks' turnaround. Stall detection allows each rail this drain time too."),
    Setting("R2CCL_CONNS_PER_NIC", "conns_per_nic", int,
            "TCP connections per NIC pair (each is a rail of its own)."),
    Setting("R2CCL_IO_THREADS", "io_threads", int,
            "Threads that run the TCP send and receive calls, so one process moves bytes on several "
            "cores: the NICs are dealt to them in order (NIC k to thread k mod N), and a thread whose "
            "NICs share a known NUMA node runs on that node. Frames of at most "
            f"{_size(CONSTANTS['caller_path_bytes'])} onto an idle "
            "connection are still moved by the thread that posts them (no hand-over). 0: the progress "
            "thread makes every socket call itself. -1 (auto): one per NIC where there are two NICs or "
            f"more and this process may run on at least {CONSTANTS['io_cpus_per_nic']} CPUs per NIC, "
            "else 0 (with fewer cores the threads compete for them and striping skews) "
            f"(at most {CONSTANTS['io_threads_max']})."),
    Setting("R2CCL_TIMEOUT", "timeout_s", float,
            "Seconds an operation may wait, and how long every rail to a peer may stay down, "
            "before it fails with an error naming the peer."),
    Setting("R2CCL_MISMATCH_MS", "mismatch_ms", int,
            "A collective that has waited this long for a peer whose announcement of a different "
            "collective is already here (another program, or the same collectives in another "
            "order) fails with a mismatch naming both, instead of waiting for R2CCL_TIMEOUT."),
    Setting("R2CCL_BOOTSTRAP_TIMEOUT", "bootstrap_timeout_s", float,
            "Seconds bootstrap waits for every rank to publish its addresses and for rails to come up.",
            default=300.0),
    Setting("R2CCL_HEARTBEAT_MS", "heartbeat_ms", int,
            "Heartbeat period on idle rails."),
    Setting("R2CCL_HEARTBEAT_MISSES", "heartbeat_misses", int,
            "Heartbeat periods of silence after which a rail is declared failed."),
    Setting("R2CCL_STALL_MS", "stall_ms", int,
            "A rail with unacknowledged chunks and no ack for this long plus the time its own "
            "measured bandwidth needs to drain them, while a sibling rail is alive, is declared "
            "failed (black-hole detection)."),
    Setting("R2CCL_REPROBE_MS", "reprobe_ms", int,
            "Period of reconnect attempts on a failed rail (failback)."),
    Setting("R2CCL_CONNECT_TIMEOUT_MS", "connect_timeout_ms", int,
            "Deadline of one connect plus handshake."),
    Setting("R2CCL_TCP_USER_TIMEOUT_MS", "tcp_user_timeout_ms", int,
            "TCP_USER_TIMEOUT on every connection: the kernel's bound on unacknowledged data."),
    Setting("R2CCL_SOCKET_BUFFER_BYTES", "socket_buffer_bytes", int,
            "SO_SNDBUF and SO_RCVBUF of every connection (0: kernel default)."),
    Setting("R2CCL_CRC", "crc", bool,
            "CRC32C over every chunk's payload, checked by the receiver."),
    Setting("R2CCL_BIND_DEVICE", "bind_device", bool,
            "Also bind sockets to their NIC's device (SO_BINDTODEVICE) where permitted."),
    Setting("R2CCL_PORT", "port", int,
            "First listen port (NIC i listens on PORT+i); 0 picks free ports."),
    Setting("R2CCL_MAX_MESSAGE_BYTES", "max_message_bytes", int,
            "Largest message a receiver accepts from the network."),
    Setting("R2CCL_MONITOR_MS", "monitor_ms", int,
            "Sampling period of the health monitor (rail bandwidth, weights, events); 0 turns the "
            "monitor off (link events are then seen only through rail timers)."),
    Setting("R2CCL_ADAPTIVE_WEIGHTS", "adaptive_weights", bool,
            "Rail weights follow each rail's measured delivered bandwidth (with hysteresis), so a "
            "degraded NIC carries only what it can finish in time. Off: every rail weighs 1."),
    Setting("R2CCL_LINK_HOLDDOWN_MS", "link_holddown_ms", int,
            "A NIC whose link comes back up is re-admitted after this long, doubled for every "
            "further link failure in the last 10 s (up to 16x): a flapping link stays out."),
    Setting("R2CCL_PLAN", "plan", str,
            "All-reduce plan for large messages: which share each process owns (reduces and sends "
            "back). balance: equal; r2cc: R2CCL's R2CC-AllReduce; weighted: by capacity; optimal: "
            "min-max of the cost model; auto: the model's fastest. Capacities come from the health "
            "monitor and travel with each call, so every process runs the same plan. Results are "
            "bit-identical under every plan. Must be equal on every process."),
    Setting("R2CCL_ALGO", "algo", str,
            "Collective algorithm. direct: every process exchanges with every other (the least "
            "data: the all-reduce moves 2(P-1)/P of the vector per process; P-1 peers). ring: each "
            "process exchanges with its two ring neighbours only (the all-reduce moves about twice "
            "the vector per process, in pieces, so the canonical summation order holds); "
            "all-to-all is always direct. doubling: small all-reduces in log2(P) rounds with "
            "2 log2(P) peers (other kinds then run the ring). auto: direct up to R2CCL_MAX_PEERS "
            "peers; beyond, doubling for all-reduces of at most 64 KiB (while P x size <= 16 MiB) "
            "and the ring for the rest. Results are bit-identical under every algorithm. Must be "
            "equal on every process (checked with each call)."),
    Setting("R2CCL_MAX_PEERS", "max_peers", int,
            "Under R2CCL_ALGO=auto: the most processes one process exchanges data with directly in "
            "a collective; a larger group runs the ring."),
    Setting("R2CCL_STAGING_BYTES", "staging_bytes", int,
            "GPU platform: bound on the pinned host staging of one GPU: a pool of slots of two steps each, "
            "reused across calls (a collective uses up to three at once). jax_r2ccl.initialize() allocates "
            "three; none is freed before the process ends."),
    Setting("R2CCL_STAGING_CHUNK_BYTES", "staging_chunk_bytes", int,
            "GPU platform: bytes of one step of the device -> host -> network -> host -> device "
            "pipeline (copies, network and reduction of different steps overlap). Must be equal on "
            "every process."),
    Setting("R2CCL_EAGER_BYTES", "eager_bytes", int,
            "Sends up to this size complete as soon as they are copied (at most "
            f"{_size(CONSTANTS['eager_bytes_max'])}): the transport keeps the copy until the peer "
            "acknowledges it and re-sends it over another rail if one fails, and the receiver "
            "acknowledges such sends lazily (batched), so neither side waits for an ack. If every "
            "rail to the peer then stays down past R2CCL_TIMEOUT, the next operation with that peer "
            "fails and names the undelivered send (the receive fails too). While "
            f"{_size(CONSTANTS['eager_held_bytes'])} of copies to one peer await acks, further sends "
            "complete when acknowledged. 0: every send completes when acknowledged."),
    Setting("R2CCL_POLL_US", "poll_us", int,
            f"Small sends and receives (<= {_size(CONSTANTS['caller_path_bytes'])}) take the caller's "
            "path: a send leaves from the caller's thread when the progress thread is idle, and a "
            "thread waiting for one reads and writes the sockets itself for up to this many "
            "microseconds before it sleeps (latency: no hand-over between threads; costs that much "
            "CPU per wait at most). 0: every request goes through the progress thread."),
    Setting("R2CCL_SYNC_WAIT_US", "sync_wait_us", int,
            "Microseconds XLA's thread waits inside the custom call for a small collective (<= "
            f"{_size(CONSTANTS['small_collective_bytes'])}) that is the process's only one in flight, "
            "so the program continues on that thread "
            "without a hand-over (latency); after that the call completes asynchronously. 0: never wait."),
    Setting("R2CCL_SECRET", "secret", str,
            "The job secret (hex). Empty: rank 0 makes a random one and shares it at bootstrap.",
            default=""),
    Setting("R2CCL_DEBUG", "debug", str,
            f"Log level of the one logger: {_one_of(_NAMES['log_levels'])}.",
            default=_NAMES["log_levels"][_CORE_DEFAULTS["debug_level"]]),
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


class _ConfigMethods:
    """The behaviour of Config; its fields are generated from SETTINGS below."""

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
        if self.transport not in _NAMES["transports"]:
            raise R2cclError(f"R2CCL_TRANSPORT={self.transport!r}: use {_one_of(_NAMES['transports'])}")
        if self.nic_affinity not in ("auto", "off"):
            raise R2cclError(f"R2CCL_NIC_AFFINITY={self.nic_affinity!r}: use auto or off")
        if self.debug.upper() not in _LEVELS:
            raise R2cclError(f"R2CCL_DEBUG={self.debug!r}: use {_one_of(_NAMES['log_levels'])}")
        msg = self.to_core().validate()
        if msg:
            raise R2cclError(msg)

    def nic_list(self) -> list[str]:
        """R2CCL_NICS, else default_nics() in interface order. The order R2CCL_NIC_AFFINITY
        asks for needs the PCIe topology, a tier above: transport.topology.nic_order()."""
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
        c = _core.Config()
        for s in SETTINGS:
            if not s.python_only:
                setattr(c, s.field, getattr(self, s.field))
        c.debug_level = _LEVELS.get(self.debug.upper(), _CORE_DEFAULTS["debug_level"])
        return c


Config = dataclasses.make_dataclass(
    "Config", [(s.field, s.kind, dataclasses.field(default=s.default)) for s in SETTINGS],
    namespace={k: v for k, v in vars(_ConfigMethods).items() if k not in ("__dict__", "__weakref__")},
    frozen=True)
Config.__module__ = __name__
Config.__doc__ = ("Every R2CCL_* setting's value, one frozen field per row of SETTINGS (same name, "
                  "type and default).")


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
