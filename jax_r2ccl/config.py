"""Every R2CCL_* setting in one table: name, field, type, default, doc. The table is the C++
core's (csrc/base/settings.cc, read back through _core.settings()): the defaults are the C++
Config's initializers, and the environment is parsed by the core's one reader
(_core.read_settings), the same that the NCCL net plugin uses in a process without Python.
R2CCL_DEBUG is a level name here and an index (debug_level) in C++. `Config` is generated from
the table: `Config.from_env()` reads the environment, keyword arguments override, and
`to_core()` hands the result to the C++ struct. Must not know jax or anything above the core
tier."""

from __future__ import annotations

import dataclasses
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

_KINDS = {"int": int, "float": float, "bool": bool, "str": str, "level": str}


def _one_of(names) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


@dataclasses.dataclass(frozen=True)
class Setting:
    env: str
    field: str
    kind: type
    doc: str
    default: Any


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(row["env"], row["field"], _KINDS[row["kind"]], row["doc"], row["default"]) for row in _core.settings())


# Settings every process of a job must share before it dials a peer: the peers a process
# connects to at start-up follow from them (_core.startup_peers), so processes that disagree
# would wait for each other's rails until the bootstrap timeout. The bootstrap compares them.
START_UP_FIELDS = ("algo", "max_peers")


def start_up_settings(config) -> dict[str, Any]:
    """START_UP_FIELDS of `config`, by their R2CCL_* names."""
    env = {s.field: s.env for s in SETTINGS}
    return {env[f]: getattr(config, f) for f in START_UP_FIELDS}


def _read(env: dict[str, str] | None) -> dict[str, Any]:
    """The settings `env` sets (the process environment when None): field -> value."""
    if env is not None:
        env = {s.env: env[s.env] for s in SETTINGS if s.env in env}
    return _core.read_settings(env)


class _ConfigMethods:
    """The behaviour of Config; its fields are generated from SETTINGS below."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "Config":
        values = _read(env)
        unknown = set(overrides) - {s.field for s in SETTINGS}
        if unknown:
            raise R2cclError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values.update(overrides)
        cfg = cls(**values)
        cfg.check()
        return cfg

    def sources(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """Where each value came from: 'env', 'default' or 'override'."""
        from_env = _read(env)
        out = {}
        for s in SETTINGS:
            v = getattr(self, s.field)
            out[s.env] = "env" if s.field in from_env and from_env[s.field] == v else (
                "default" if v == s.default else "override")
        return out

    def check(self) -> None:
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
            if s.field in _CORE_DEFAULTS:
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
    """Non-loopback interfaces that are up and have an IPv4 address; else 127.0.0.1 (the core's
    rule, shared with the NCCL plugin: _core.default_nics)."""
    return list(_core.default_nics())


def settings_table() -> str:
    """The README's settings table (markdown), generated from SETTINGS."""
    rows = ["| Setting | Default | What it does |", "|---|---|---|"]
    for st in SETTINGS:
        d = st.default
        if st.kind is bool:
            d = "1" if d else "0"
        rows.append(f"| `{st.env}` | `{d if d != '' else '(empty)'}` | {st.doc} |")
    return "\n".join(rows) + "\n"
