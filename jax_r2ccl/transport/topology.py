"""PCIe topology from sysfs: where NICs and GPUs sit, how far apart, and the NIC order that
puts the ones nearest this process's GPUs first (R2CCL_NIC_AFFINITY). Standard library only;
every function that reads sysfs takes its root (default "/sys") so tests can use a fake tree."""

from __future__ import annotations

import os
import re

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")   # VGA controller, 3D controller (class code's first 4 hex digits)
_PCI_FUNCTION = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def read_text(path: str) -> str | None:
    """A sysfs file's stripped text, or None when it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def pci_path(dev_link: str, sys_root: str = "/sys") -> str | None:
    """The real sysfs path (<root>/devices/pci0000:00/0000:00:01.0/0000:3b:00.0) a device link
    leads to, or None when it leads nowhere on the PCI tree. dev_link: absolute, or relative
    to sys_root ("class/net/eth0/device")."""
    p = os.path.realpath(os.path.join(sys_root, dev_link))
    rel = os.path.relpath(p, os.path.realpath(sys_root)).split(os.sep)
    return p if os.path.exists(p) and len(rel) > 1 and rel[0] == "devices" and rel[1].startswith("pci") else None


def pci_address(path: str | None) -> str | None:
    """The PCIe function (0000:3b:00.0) a sysfs device path ends in or sits under."""
    for part in reversed((path or "").split("/")):
        if _PCI_FUNCTION.fullmatch(part):
            return part
    return None


def pci_distance(a: str | None, b: str | None) -> int | None:
    """Hops between two PCIe devices (their sysfs paths) through their deepest common bridge;
    None when either is unknown. 2: same switch; larger: further (through the root complex)."""
    if not a or not b:
        return None
    pa, pb = a.split("/"), b.split("/")
    common = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        common += 1
    return (len(pa) - common) + (len(pb) - common)


def nic_pci_paths(sys_root: str = "/sys") -> dict[str, str | None]:
    """Every interface in <root>/class/net (sorted by name) -> its PCIe path, or None
    (loopback, virtual, or an unreadable tree). Empty when the directory cannot be read."""
    try:
        names = sorted(os.listdir(os.path.join(sys_root, "class", "net")))
    except OSError:
        return {}
    return {n: pci_path(f"class/net/{n}/device", sys_root) for n in names}


def local_gpu_pci(sys_root: str = "/sys") -> list[str]:
    """PCI addresses of this process's NVIDIA GPUs, from sysfs alone (no NVML, no CUDA).

    Every NVIDIA display or 3D function in <root>/bus/pci/devices, in PCI-address order; when
    CUDA_VISIBLE_DEVICES holds integer indices, only those (index i = the i-th in that order).
    That is CUDA's numbering under CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default
    (FASTEST_FIRST) agrees only when all GPUs are the same model. UUIDs or MIG names in
    CUDA_VISIBLE_DEVICES cannot be mapped without NVML: then every GPU is returned."""
    base = os.path.join(sys_root, "bus", "pci", "devices")
    try:
        addrs = sorted(os.listdir(base))
    except OSError:
        return []
    gpus = [a for a in addrs if read_text(f"{base}/{a}/vendor") == NVIDIA
            and (read_text(f"{base}/{a}/class") or "").startswith(GPU_CLASSES)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(re.fullmatch(r"-?\d+", e) for e in entries):
        return gpus
    out = []
    for e in entries:   # like CUDA, stop at the first index that names no device
        i = int(e)
        if not 0 <= i < len(gpus):
            break
        out.append(gpus[i])
    return out


def order_by_affinity(nic_names: list[str], gpu_pci_addresses: list[str],
                      sys_root: str = "/sys") -> tuple[list[str], dict[str, int | None]]:
    """The NICs sorted nearest-first: by their smallest PCIe distance to any of the GPUs
    (0000:3b:00.0 addresses). Stable: ties keep their order, NICs of unknown distance (IPv4
    addresses, virtual interfaces, GPUs not found) go last. Returns (names, {nic: distance})."""
    gpu_paths = [p for p in (pci_path(f"bus/pci/devices/{a.lower()}", sys_root) for a in gpu_pci_addresses) if p]
    table: dict[str, int | None] = {}
    for name in nic_names:
        path = pci_path(f"class/net/{name}/device", sys_root)   # None for an IPv4 address
        dists = [d for d in (pci_distance(path, g) for g in gpu_paths) if d is not None]
        table[name] = min(dists) if dists else None
    ordered = sorted(nic_names, key=lambda n: (table[n] is None, table[n] or 0))
    return ordered, table


def nic_order(config, gpu_pci: list[str] | None = None,
              sys_root: str = "/sys") -> tuple[list[str], dict[str, int | None], str]:
    """The NICs this process uses, in rail order (rail 0 first), under config's R2CCL_NICS and
    R2CCL_NIC_AFFINITY. Returns (names, {nic: distance}, mode); mode is "R2CCL_NICS" (an
    explicit list, used exactly as given), "off" (interface order) or "auto" (nearest-first to
    gpu_pci; interface order when that is empty)."""
    names = config.nic_list()
    if config.nics.strip():
        return names, {}, "R2CCL_NICS"
    if config.nic_affinity != "auto":
        return names, {}, "off"
    if not gpu_pci:
        return names, {n: None for n in names}, "auto"
    ordered, table = order_by_affinity(names, gpu_pci, sys_root)
    return ordered, table, "auto"
