"""`python -m jax_r2ccl doctor [--json]`: what this host offers jax_r2ccl. NICs with link
state, speed, MTU, NUMA node and PCIe address; GPUs with their PCIe address and the NICs
nearest each (NVML, when a driver and nvidia-ml-py are present); RDMA devices and port
states (sysfs, and pyverbs when installed); which NICs jax_r2ccl would use; every setting in
force and where its value came from. Anything missing is a line in the report, not an error."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from ..config import SETTINGS, Config

SYS_NET = "/sys/class/net"
SYS_IB = "/sys/class/infiniband"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="the report as JSON")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _int(path: str) -> int | None:
    v = _read(path)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _ipv4(name: str) -> str | None:
    import fcntl
    import struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        r = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))   # SIOCGIFADDR
        return socket.inet_ntoa(r[20:24])
    except OSError:
        return None
    finally:
        s.close()


def pci_path(dev_link: str) -> str | None:
    """The device's real sysfs path (.../pci0000:00/0000:00:01.0/0000:3b:00.0), or None."""
    try:
        p = os.path.realpath(dev_link)
    except OSError:
        return None
    return p if "/pci" in p else None


def pci_address(path: str | None) -> str | None:
    """The PCIe function (0000:3b:00.0) a sysfs device path ends in or sits under."""
    import re
    for part in reversed((path or "").split("/")):
        if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", part):
            return part
    return None


def pci_distance(a: str | None, b: str | None) -> int | None:
    """Hops between two PCIe devices through their deepest common bridge (sysfs paths); None
    when either is unknown. 2: same switch; larger: further (through the root complex)."""
    if not a or not b:
        return None
    pa, pb = a.split("/"), b.split("/")
    common = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        common += 1
    return (len(pa) - common) + (len(pb) - common)


def nics() -> list[dict]:
    out = []
    try:
        names = sorted(os.listdir(SYS_NET))
    except OSError:
        names = [n for _, n in socket.if_nameindex()]
    for name in names:
        base = f"{SYS_NET}/{name}"
        dev = pci_path(f"{base}/device")
        speed = _int(f"{base}/speed")
        out.append({
            "name": name,
            "ipv4": _ipv4(name),
            "operstate": _read(f"{base}/operstate"),
            "carrier": _int(f"{base}/carrier"),
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "mtu": _int(f"{base}/mtu"),
            "numa_node": _int(f"{base}/device/numa_node"),
            "pci": pci_address(dev),
            "pci_path": dev,
            "driver": os.path.basename(os.path.realpath(f"{base}/device/driver")) if os.path.exists(
                f"{base}/device/driver") else None,
            "infiniband": sorted(os.listdir(f"{base}/device/infiniband")) if os.path.isdir(
                f"{base}/device/infiniband") else [],
        })
    return out


def gpus(nic_list: list[dict]) -> tuple[list[dict], str]:
    try:
        import pynvml   # nvidia-ml-py
    except ImportError:
        return [], "NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py); GPU topology unknown"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no driver
        return [], f"NVML: no NVIDIA driver ({e}); GPU topology unknown"
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            bus = bus.lower()[-12:]   # 0000:3b:00.0
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            path = pci_path(f"/sys/bus/pci/devices/{bus}")
            near = sorted(((pci_distance(path, n["pci_path"]), n["name"]) for n in nic_list if n["pci_path"]),
                          key=lambda x: (x[0] is None, x[0]))
            out.append({"index": i, "name": name, "pci": bus, "numa_node": _int(f"/sys/bus/pci/devices/{bus}/numa_node"),
                        "nearest_nics": [n for d, n in near if d is not None and d == near[0][0]] if near else [],
                        "nic_distance": {n: d for d, n in near}})
    finally:
        pynvml.nvmlShutdown()
    return out, f"NVML: {len(out)} GPU(s)"


def rdma() -> tuple[list[dict], str]:
    devs = []
    if os.path.isdir(SYS_IB):
        for d in sorted(os.listdir(SYS_IB)):
            ports = []
            pdir = f"{SYS_IB}/{d}/ports"
            for p in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
                ports.append({"port": int(p), "state": _read(f"{pdir}/{p}/state"),
                              "phys_state": _read(f"{pdir}/{p}/phys_state"), "rate": _read(f"{pdir}/{p}/rate"),
                              "link_layer": _read(f"{pdir}/{p}/link_layer")})
            net = sorted(os.listdir(f"{SYS_IB}/{d}/device/net")) if os.path.isdir(f"{SYS_IB}/{d}/device/net") else []
            devs.append({"name": d, "ports": ports, "netdevs": net})
    try:
        import pyverbs.device  # noqa: F401
        verbs = "pyverbs: installed"
    except ImportError:
        verbs = "pyverbs: not installed (optional: the RDMA report comes from sysfs)"
    if not devs:
        return [], f"RDMA: no devices in {SYS_IB}; {verbs}"
    return devs, f"RDMA: {len(devs)} device(s); {verbs}"


def report() -> dict:
    try:
        cfg = Config.from_env()
        cfg_error = None
    except Exception as e:  # noqa: BLE001 - a bad setting is part of the report
        cfg, cfg_error = Config(), str(e)
    nic_list = nics()
    gpu_list, nvml_line = gpus(nic_list)
    rdma_list, rdma_line = rdma()
    try:
        used = cfg.nic_list()
    except Exception as e:  # noqa: BLE001
        used, cfg_error = [], cfg_error or str(e)
    sources = cfg.sources()
    settings = [{"env": s.env, "value": getattr(cfg, s.field) if s.env != "R2CCL_SECRET" or not cfg.secret
                 else "(set)", "source": sources[s.env]} for s in SETTINGS]
    notes = [nvml_line, rdma_line]
    if cfg_error:
        notes.append(f"configuration error: {cfg_error}")
    return {"host": socket.gethostname(), "nics": nic_list, "nics_used": used, "gpus": gpu_list,
            "rdma": rdma_list, "settings": settings, "notes": notes}


def main(args: argparse.Namespace) -> int:
    r = report()
    if args.json:
        json.dump(r, sys.stdout, indent=1, default=str)
        print()
        return 0
    print(f"jax_r2ccl doctor on {r['host']}")
    print("\nNICs (* = used by jax_r2ccl with this configuration)")
    print(f"  {'':1} {'name':12} {'ipv4':15} {'state':14} {'speed':>8} {'mtu':>6} {'numa':>4}  pci")
    used = set(r["nics_used"])
    for n in r["nics"]:
        mark = "*" if n["name"] in used or (n["ipv4"] and n["ipv4"] in used) else ""
        state = f"{n['operstate']}{'' if n['carrier'] in (1, None) else ' no-carrier'}"
        speed = f"{n['speed_mbps']}M" if n["speed_mbps"] else "-"
        print(f"  {mark:1} {n['name']:12} {n['ipv4'] or '-':15} {state:14} {speed:>8} {n['mtu'] or '-':>6} "
              f"{n['numa_node'] if n['numa_node'] is not None else '-':>4}  {n['pci'] or '-'}"
              f"{'  ib: ' + ','.join(n['infiniband']) if n['infiniband'] else ''}")
    print(f"  used: {', '.join(r['nics_used']) or '(none)'}")
    print("\nGPUs")
    for g in r["gpus"]:
        print(f"  GPU {g['index']} {g['name']} pci {g['pci']} numa {g['numa_node']}: nearest NICs "
              f"{', '.join(g['nearest_nics']) or '(unknown)'}")
    if not r["gpus"]:
        print("  (none found)")
    print("\nRDMA")
    if not r["rdma"]:
        print("  (none found)")
    for d in r["rdma"]:
        for p in d["ports"]:
            print(f"  {d['name']} port {p['port']}: {p['state']} ({p['phys_state']}), {p['rate']}, "
                  f"{p['link_layer']}; netdev {','.join(d['netdevs']) or '-'}")
    print("\nNotes")
    for line in r["notes"]:
        print(f"  {line}")
    print("\nSettings in force (source: env, default or override)")
    for s in r["settings"]:
        print(f"  {s['env']:28} {str(s['value']):>20}  {s['source']}")
    return 0
