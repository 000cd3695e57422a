"""`python -m jax_r2ccl doctor [--json]`: what this host offers jax_r2ccl. NICs with link
state, speed, MTU, NUMA node and PCIe address; GPUs with their PCIe address and the NICs
nearest each (NVML, when a driver and nvidia-ml-py are present); RDMA devices and port
states (sysfs, and pyverbs when installed); which NICs jax_r2ccl would use, in rail order,
with this process's GPUs (sysfs) and each NIC's PCIe distance to them (R2CCL_NIC_AFFINITY);
every setting in force and where its value came from. Anything missing is a line in the
report, not an error."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from ..config import SETTINGS, Config
from ..transport.topology import (local_gpu_pci, nic_order, nic_pci_paths, pci_address, pci_distance, pci_path,
                                  read_text)

SYS = "/sys"   # the sysfs root of the NIC and affinity reports (tests point it at a fake tree)
SYS_IB = "/sys/class/infiniband"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="the report as JSON")


def _int(path: str) -> int | None:
    v = read_text(path)
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


def nics(sys_root: str | None = None) -> list[dict]:
    root = sys_root or SYS
    paths = nic_pci_paths(root) or {n: None for _, n in socket.if_nameindex()}
    out = []
    for name, dev in paths.items():
        base = f"{root}/class/net/{name}"
        speed = _int(f"{base}/speed")
        out.append({
            "name": name,
            "ipv4": _ipv4(name),
            "operstate": read_text(f"{base}/operstate"),
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


def cuda_line() -> str:
    """What the CUDA part of this build is and sees."""
    from .. import _core
    i = _core.cuda_info()
    if not i["built"]:
        return f"CUDA part: not built ({i['error']})"
    v = i["runtime_version"]
    line = f"CUDA part: built for {', '.join(i['archs'])} (cudart {v // 1000}.{v % 1000 // 10}, static)"
    if i["devices"]:
        return line + f"; {i['devices']} GPU(s): {', '.join(i['pci_bus_ids'])}"
    return line + f"; no GPU visible ({i['error'] or 'none'})"


def rdma(nics_used: list[str], sys_root: str | None = None) -> tuple[list[dict], dict, str]:
    """RDMA ports (the core's own sysfs map: the one the verbs transport uses), and what
    R2CCL_TRANSPORT=auto would pick for each NIC in use, with a summary line."""
    from .. import _core
    ports = _core.rdma_ports(sys_root or "")
    status = _core.verbs_status([n for n in nics_used])
    try:
        import pyverbs.device as pvd
        verbs = f"pyverbs: {len(pvd.get_device_list())} device(s)"
    except ImportError:
        verbs = "pyverbs: not installed (optional: the map comes from sysfs)"
    except Exception as e:  # noqa: BLE001 - pyverbs present but unusable: say so
        verbs = f"pyverbs: {e}"
    why = status["unavailable"]
    backend = "verbs transport: available" if not why else f"verbs transport: unavailable ({why})"
    backend += f"; GPUDirect RDMA: {status['gpudirect']}"
    if not ports:
        return [], status, f"RDMA: no ports in {sys_root or SYS}/class/infiniband; {backend}; {verbs}"
    return ports, status, f"RDMA: {len(ports)} port(s); {backend}; {verbs}"


def affinity(cfg: Config, sys_root: str | None = None) -> dict:
    """The NIC order this process would use, its GPUs and each NIC's distance, with a line."""
    root = sys_root or SYS
    gpu_pci = local_gpu_pci(root)
    order, table, mode = nic_order(cfg, gpu_pci, root)
    if mode == "R2CCL_NICS":
        line = f"R2CCL_NICS overrides it: nic order {', '.join(order)} (as given)"
    elif mode == "off":
        line = f"off (R2CCL_NIC_AFFINITY=off): nic order {', '.join(order)} (interface order)"
    elif not gpu_pci:
        line = f"auto, but no GPU of this process found in sysfs: nic order {', '.join(order)} (interface order)"
    else:
        line = "nic order " + ", ".join(
            f"{n} (distance {table[n] if table[n] is not None else 'unknown'})" for n in order)
    return {"mode": mode, "gpu_pci": gpu_pci, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "order": order, "distance": table, "line": f"affinity: {line}"}


def report(sys_root: str | None = None) -> dict:
    try:
        cfg = Config.from_env()
        cfg_error = None
    except Exception as e:  # noqa: BLE001 - a bad setting is part of the report
        cfg, cfg_error = Config(), str(e)
    nic_list = nics(sys_root)
    gpu_list, nvml_line = gpus(nic_list)
    try:
        aff = affinity(cfg, sys_root)
    except Exception as e:  # noqa: BLE001
        aff, cfg_error = {"order": [], "line": f"affinity: unknown ({e})"}, cfg_error or str(e)
    rdma_list, transports, rdma_line = rdma(aff["order"], sys_root)
    sources = cfg.sources()
    settings = [{"env": s.env, "value": getattr(cfg, s.field) if s.env != "R2CCL_SECRET" or not cfg.secret
                 else "(set)", "source": sources[s.env]} for s in SETTINGS]
    notes = [nvml_line, rdma_line, cuda_line()]
    if cfg_error:
        notes.append(f"configuration error: {cfg_error}")
    from ..transport import nccl
    return {"host": socket.gethostname(), "nics": nic_list, "nics_used": aff["order"], "affinity": aff,
            "gpus": gpu_list, "rdma": rdma_list, "transports": transports["nics"], "settings": settings,
            "nccl": nccl.report(), "notes": notes}


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
    aff = r["affinity"]
    print(f"  GPUs of this process (sysfs, for affinity): {', '.join(aff.get('gpu_pci') or []) or '(none)'}")
    print(f"  {aff['line']}")
    print("\nGPUs")
    for g in r["gpus"]:
        print(f"  GPU {g['index']} {g['name']} pci {g['pci']} numa {g['numa_node']}: nearest NICs "
              f"{', '.join(g['nearest_nics']) or '(unknown)'}")
    if not r["gpus"]:
        print("  (none found)")
    print("\nRDMA ports (netdev <-> device:port, RoCEv2 GIDs of IPv4 addresses)")
    if not r["rdma"]:
        print("  (none found)")
    for p in r["rdma"]:
        gids = ", ".join(f"{g['ipv4']} (GID {g['index']})" for g in p["roce_v2_ipv4"]) or "-"
        print(f"  {p['netdev'] or '-':10} {p['device']}:{p['port']}  {p['state']:8} {p['link_layer']:10} "
              f"{p['rate'] or '-'}  {gids}")
    print("\nTransport per NIC in use (R2CCL_TRANSPORT=auto would pick)")
    for nic, t in r["transports"].items():
        print(f"  {nic:15} {t}")
    n = r["nccl"]
    print("\nNCCL net plugin (every NCCL collective of a GPU job over these rails)")
    print(f"  plugin:  {n['plugin'] or '(not built)'}")
    print(f"  NCCL:    {n['nccl'] or '(none)'} ({n['how'] or '-'}), version {n['version'] or 'unknown'}, "
          f"looks up tables {', '.join('v' + str(t) for t in n['tables']) or '(unknown)'}")
    print(f"  used:    {'yes' if n['would_use'] else 'no'}: {n['why']}")
    print("\nNotes")
    for line in r["notes"]:
        print(f"  {line}")
    print("\nSettings in force (source: env, default or override)")
    for s in r["settings"]:
        print(f"  {s['env']:28} {str(s['value']):>20}  {s['source']}")
    return 0
