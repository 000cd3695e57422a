"""NIC affinity: PCIe paths and distances from sysfs, this process's GPUs, the NIC order of
R2CCL_NIC_AFFINITY and doctor's report of it, on a fake sysfs tree built in tmp_path.

These tests run the checkout's code even when pytest, run from outside the checkout, imports
an installed copy of the package: `topo` loads transport/topology.py (standard library only)
from its file; `src` puts the checkout's jax_r2ccl/ in front of the installed package's path
for this module's tests only (the compiled _core still comes from the installed copy, and
they are skipped when that _core is older than the checkout's settings)."""

import argparse
import importlib
import importlib.util
import json
import os
import sys
import types

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jax_r2ccl")

GPU0, GPU1 = "0000:3b:00.0", "0000:af:00.0"
DEVICES = {   # path under devices/ -> (vendor, class)
    f"pci0000:00/0000:00:01.0/{GPU0}": ("0x10de", "0x030000"),          # GPU (VGA)
    "pci0000:00/0000:00:01.0/0000:3b:00.1": ("0x10de", "0x040300"),     # its audio function
    "pci0000:00/0000:00:01.0/0000:3c:00.0": ("0x15b3", "0x020000"),     # eth_near: same switch
    "pci0000:00/0000:00:01.0/0000:3d:00.0": ("0x15b3", "0x020000"),     # eth_twin: same switch
    "pci0000:00/0000:00:02.0/0000:5e:00.0": ("0x8086", "0x020000"),     # eth_mid: same root
    "pci0000:00/0000:00:03.0/0000:60:00.0": ("0x1a03", "0x030000"),     # not an NVIDIA GPU
    f"pci0000:80/0000:80:01.0/{GPU1}": ("0x10de", "0x030200"),          # GPU (3D controller)
    "pci0000:80/0000:80:01.0/0000:b0:00.0": ("0x15b3", "0x020000"),     # eth_far: GPU1's switch
}
NICS = {"eth_near": "0000:3c:00.0", "eth_twin": "0000:3d:00.0", "eth_mid": "0000:5e:00.0",
        "eth_far": "0000:b0:00.0", "veth0": None}


@pytest.fixture(scope="module")
def topo():
    """The checkout's transport/topology.py (standard library only: loaded from its file)."""
    path = os.path.join(SRC, "transport", "topology.py")
    spec = importlib.util.spec_from_file_location("_r2ccl_topology_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def src():
    """The checkout's config, errors, transport.topology and tools.doctor modules."""
    import jax_r2ccl
    names = ("config", "errors", "transport.topology", "tools.doctor")
    load = lambda: types.SimpleNamespace(   # noqa: E731
        **{n.split(".")[-1]: importlib.import_module(f"jax_r2ccl.{n}") for n in names})
    if os.path.dirname(os.path.realpath(jax_r2ccl.__file__)) == os.path.realpath(SRC):
        yield load()
        return
    ours = lambda k: k.startswith("jax_r2ccl.") and k != "jax_r2ccl._core"   # noqa: E731
    saved_mods = {k: sys.modules.pop(k) for k in [k for k in sys.modules if ours(k)]}
    saved_attrs, saved_path = dict(vars(jax_r2ccl)), list(jax_r2ccl.__path__)
    jax_r2ccl.__path__[:] = [SRC, *saved_path]
    try:
        try:
            mods = load()
        except TypeError as e:   # the checkout's settings name core fields the installed _core lacks
            if "is not a field of the C++ Config" not in str(e):
                raise
            pytest.skip(f"the installed jax_r2ccl._core is older than the checkout's config.py ({e}): reinstall")
        yield mods
    finally:
        jax_r2ccl.__path__[:] = saved_path
        for k in [k for k in sys.modules if ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved_mods)
        for k in set(vars(jax_r2ccl)) - set(saved_attrs):
            delattr(jax_r2ccl, k)
        vars(jax_r2ccl).update(saved_attrs)


@pytest.fixture
def fake_sys(tmp_path):
    root = tmp_path / "sys"
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for path, (vendor, cls) in DEVICES.items():
        d = root / "devices" / path
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (bus / d.name).symlink_to(os.path.relpath(d, bus))
    for name, addr in NICS.items():
        n = root / "class" / "net" / name
        n.mkdir(parents=True)
        (n / "operstate").write_text("up\n")
        if addr:
            (n / "device").symlink_to(os.path.relpath(os.path.realpath(bus / addr), n))
    return str(root)


def test_the_source_tree_is_under_test(src):
    for mod in (src.config, src.topology, src.doctor):
        assert os.path.realpath(mod.__file__).startswith(os.path.realpath(SRC)), mod.__file__
    # doctor keeps no copies of the sysfs helpers
    for name in ("pci_path", "pci_address", "pci_distance"):
        assert getattr(src.doctor, name) is getattr(src.topology, name)


def test_pci_address_and_distance(topo):
    t = topo
    gpu = f"/sys/devices/pci0000:00/0000:00:01.0/{GPU0}"
    assert t.pci_address(gpu) == GPU0 and t.pci_address(gpu + "/net/eth0") == GPU0
    assert t.pci_address("/sys/devices/virtual/net/lo") is None
    assert t.pci_distance(gpu, "/sys/devices/pci0000:00/0000:00:01.0/0000:3c:00.0") == 2   # same switch
    assert t.pci_distance(gpu, "/sys/devices/pci0000:00/0000:00:02.0/0000:5e:00.0") == 4   # same root complex
    assert t.pci_distance(gpu, "/sys/devices/pci0000:80/0000:80:01.0/0000:b0:00.0") == 6   # other root
    assert t.pci_distance(gpu, gpu) == 0
    assert t.pci_distance(gpu, None) is None and t.pci_distance(None, gpu) is None


def test_pci_paths_in_a_fake_tree(topo, fake_sys):
    t = topo
    paths = t.nic_pci_paths(fake_sys)
    assert list(paths) == sorted(NICS)
    assert paths["veth0"] is None
    assert t.pci_address(paths["eth_near"]) == "0000:3c:00.0"
    assert paths["eth_near"] == t.pci_path("class/net/eth_near/device", fake_sys)
    assert t.pci_path(os.path.join(fake_sys, "class/net/eth_near/device"), fake_sys) == paths["eth_near"]
    assert t.pci_path("class/net/no_such/device", fake_sys) is None
    assert t.nic_pci_paths(os.path.join(fake_sys, "nowhere")) == {}


def test_nics_are_ordered_nearest_first_ties_stable_unknown_last(topo, fake_sys):
    t = topo
    given = ["veth0", "10.0.0.1", "eth_far", "eth_twin", "eth_mid", "eth_near"]
    order, table = t.order_by_affinity(given, [GPU0], fake_sys)
    assert order == ["eth_twin", "eth_near", "eth_mid", "eth_far", "veth0", "10.0.0.1"]
    assert table == {"eth_twin": 2, "eth_near": 2, "eth_mid": 4, "eth_far": 6, "veth0": None, "10.0.0.1": None}
    # two GPUs: each NIC's distance is to its nearest GPU
    order, table = t.order_by_affinity(given, [GPU0, GPU1.upper()], fake_sys)
    assert order == ["eth_far", "eth_twin", "eth_near", "eth_mid", "veth0", "10.0.0.1"]
    assert table["eth_far"] == 2
    # no GPUs, or GPUs sysfs does not know: the order is unchanged
    for gpus in ([], ["0000:99:00.0"]):
        order, table = t.order_by_affinity(given, gpus, fake_sys)
        assert order == given and set(table.values()) == {None}


@pytest.mark.parametrize("visible,want", [
    (None, [GPU0, GPU1]),               # every NVIDIA display/3D function, in PCI-address order
    ("1", [GPU1]),
    ("1,0", [GPU1, GPU0]),
    ("", []),
    ("-1", []),
    ("0,7,1", [GPU0]),                  # like CUDA: stop at the first index that names no GPU
    ("GPU-8e3b7c1a-0000", [GPU0, GPU1]),  # a UUID cannot be mapped without NVML: no filter
])
def test_local_gpus_from_sysfs_and_cuda_visible_devices(topo, fake_sys, monkeypatch, visible, want):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert topo.local_gpu_pci(fake_sys) == want


def test_no_pci_bus_means_no_gpus(topo, tmp_path):
    assert topo.local_gpu_pci(str(tmp_path)) == []


def test_the_affinity_setting_is_validated(src):
    assert src.config.Config.from_env(env={}).nic_affinity == "auto"
    assert src.config.Config.from_env(env={"R2CCL_NIC_AFFINITY": "off"}).nic_affinity == "off"
    with pytest.raises(src.errors.R2cclError, match="R2CCL_NIC_AFFINITY='nearest': use auto or off"):
        src.config.Config.from_env(env={"R2CCL_NIC_AFFINITY": "nearest"})


def test_nic_order_modes_and_the_explicit_list_overrides(src, fake_sys, monkeypatch):
    monkeypatch.setattr(src.config, "default_nics", lambda: ["veth0", "eth_far", "eth_near"])
    cfg = src.config.Config.from_env
    order, table, mode = src.topology.nic_order(cfg(env={}), [GPU0], fake_sys)
    assert (order, mode) == (["eth_near", "eth_far", "veth0"], "auto")
    assert table == {"eth_near": 2, "eth_far": 6, "veth0": None}
    assert src.topology.nic_order(cfg(env={}), [], fake_sys)[0] == ["veth0", "eth_far", "eth_near"]
    assert src.topology.nic_order(cfg(env={"R2CCL_NIC_AFFINITY": "off"}), [GPU0], fake_sys) == (
        ["veth0", "eth_far", "eth_near"], {}, "off")
    explicit = cfg(env={"R2CCL_NICS": "eth_far, 10.0.0.1,eth_near"})
    assert src.topology.nic_order(explicit, [GPU0], fake_sys) == (["eth_far", "10.0.0.1", "eth_near"], {}, "R2CCL_NICS")
    assert cfg(env={}).nic_list() == ["veth0", "eth_far", "eth_near"]   # Config alone: interface order


def _doctor(src, fake_sys, monkeypatch, capsys, as_json, **env):
    for k in ("R2CCL_NICS", "R2CCL_NIC_AFFINITY", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(src.doctor, "SYS", fake_sys)
    monkeypatch.setattr(src.config, "default_nics", lambda: ["eth_mid", "veth0", "eth_near"])
    assert src.doctor.main(argparse.Namespace(json=as_json)) == 0
    out = capsys.readouterr().out
    return json.loads(out) if as_json else out


def test_doctor_reports_the_affinity(src, fake_sys, monkeypatch, capsys):
    r = _doctor(src, fake_sys, monkeypatch, capsys, True, CUDA_VISIBLE_DEVICES="0")
    aff = r["affinity"]
    assert aff["mode"] == "auto" and aff["gpu_pci"] == [GPU0] and aff["cuda_visible_devices"] == "0"
    assert aff["order"] == r["nics_used"] == ["eth_near", "eth_mid", "veth0"]
    assert aff["distance"] == {"eth_near": 2, "eth_mid": 4, "veth0": None}
    assert aff["line"] == "affinity: nic order eth_near (distance 2), eth_mid (distance 4), veth0 (distance unknown)"
    assert {n["name"]: n["pci"] for n in r["nics"]}["eth_near"] == "0000:3c:00.0"
    assert {"env": "R2CCL_NIC_AFFINITY", "value": "auto", "source": "default"} in r["settings"]

    text = _doctor(src, fake_sys, monkeypatch, capsys, False, CUDA_VISIBLE_DEVICES="0")
    assert f"GPUs of this process (sysfs, for affinity): {GPU0}" in text
    assert "affinity: nic order eth_near (distance 2), eth_mid (distance 4)" in text

    r = _doctor(src, fake_sys, monkeypatch, capsys, True, R2CCL_NICS="veth0,eth_mid")
    assert r["affinity"]["mode"] == "R2CCL_NICS" and r["nics_used"] == ["veth0", "eth_mid"]
    assert "R2CCL_NICS overrides it" in r["affinity"]["line"]
    r = _doctor(src, fake_sys, monkeypatch, capsys, True, R2CCL_NIC_AFFINITY="off")
    assert r["affinity"]["mode"] == "off" and r["nics_used"] == ["eth_mid", "veth0", "eth_near"]
    assert "off (R2CCL_NIC_AFFINITY=off)" in r["affinity"]["line"]
    r = _doctor(src, fake_sys, monkeypatch, capsys, True, CUDA_VISIBLE_DEVICES="")
    assert r["affinity"]["gpu_pci"] == [] and "no GPU of this process" in r["affinity"]["line"]
