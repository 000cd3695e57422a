"""Cluster shapes for the simulator: servers, GPUs and NICs per server, link rates."""

from __future__ import annotations

import dataclasses
import re

# Payload fraction of a TCP/IPv4 stream over Ethernet at MTU 1500 (1448 of 1514 bytes on
# the wire): what tbf-shaped test-bed links deliver. RoCE at 4096 MTU is ~0.97.
TCP_PAYLOAD = 0.957


def parse_rate(text: str | float) -> float:
    """'500mbit', '100Mbit', '400gbit', '12.5MB/s' or a number of bits/s -> bits per second."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|b/s|bps|B/s)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a rate: {text!r} (e.g. 500mbit, 400gbit, 12.5MB/s)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    return value * 8 if m.group(3) == "B/s" else value


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Servers of `gpus_per_server` GPUs and `nics_per_server` NICs of `nic_bps` each.
    Defaults: the paper's shape (8 H100 + 8 NICs of 400 Gbit/s per server)."""
    servers: int
    gpus_per_server: int = 8
    nics_per_server: int = 8
    nic_bps: float = 400e9
    payload: float = 0.97          # payload fraction of the line rate
    alpha_s: float = 10e-6         # per-message latency
    nvlink_Bps: float = 450e9      # intra-server, per GPU

    @property
    def nic_Bps(self) -> float:
        """Payload bytes per second one healthy NIC delivers (each direction)."""
        return self.nic_bps / 8 * self.payload

    @classmethod
    def testbed(cls, hosts: int, nics: int, rate: str | float, alpha_s: float = 150e-6) -> "Cluster":
        """The netns test bed: one process (one CPU device) per host, tbf-shaped TCP links."""
        return cls(servers=hosts, gpus_per_server=1, nics_per_server=nics, nic_bps=parse_rate(rate),
                   payload=TCP_PAYLOAD, alpha_s=alpha_s, nvlink_Bps=float("inf"))
