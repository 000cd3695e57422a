"""The settings table: one place, parsed strictly, documented in the README, mirrored in C++."""

import os

import pytest

from jax_r2ccl.config import SETTINGS, Config
from jax_r2ccl.errors import R2cclError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_settings_table_is_the_generated_one():
    from jax_r2ccl.config import settings_table
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert settings_table() in readme, "README's settings table is stale: paste `python -m jax_r2ccl settings`"
    for s in SETTINGS:
        assert f"| `{s.env}` |" in readme, f"{s.env} missing from README's settings table"


def test_every_setting_is_a_config_field_and_reaches_the_core():
    fields = {f for f in Config.__dataclass_fields__}
    assert {s.field for s in SETTINGS} == fields
    cfg = Config.from_env(env={"R2CCL_CHUNK_BYTES": "65536", "R2CCL_CRC": "1", "R2CCL_TIMEOUT": "2.5",
                               "R2CCL_DEBUG": "info"})
    core = cfg.to_core()
    assert core.chunk_bytes == 65536 and core.crc is True and core.timeout_s == 2.5 and core.debug_level == 2
    assert cfg.sources(env={"R2CCL_CHUNK_BYTES": "65536"})["R2CCL_CHUNK_BYTES"] == "env"


@pytest.mark.parametrize("env,needle", [
    ({"R2CCL_CHUNK_BYTES": "lots"}, "R2CCL_CHUNK_BYTES"),
    ({"R2CCL_CHUNK_BYTES": "12"}, "R2CCL_CHUNK_BYTES"),
    ({"R2CCL_RAIL_WINDOW_BYTES": "2048"}, "R2CCL_RAIL_WINDOW_BYTES"),
    ({"R2CCL_CRC": "maybe"}, "R2CCL_CRC"),
    ({"R2CCL_TIMEOUT": "-1"}, "R2CCL_TIMEOUT"),
    ({"R2CCL_TRANSPORT": "rdma"}, "R2CCL_TRANSPORT"),
    ({"R2CCL_IB_TIMEOUT": "0"}, "R2CCL_IB_TIMEOUT"),
    ({"R2CCL_IB_RETRY_COUNT": "8"}, "R2CCL_IB_RETRY_COUNT"),
    ({"R2CCL_DEBUG": "LOUD"}, "R2CCL_DEBUG"),
    ({"R2CCL_PORT": "70000"}, "R2CCL_PORT"),
    ({"R2CCL_CHUNK_BYTES": "-65536"}, "R2CCL_CHUNK_BYTES='-65536' is not a valid int"),
    ({"R2CCL_MAX_PEERS": "99999999999"}, "R2CCL_MAX_PEERS"),
    ({"R2CCL_TIMEOUT": "nan"}, "R2CCL_TIMEOUT"),
    ({"R2CCL_NIC_AFFINITY": "near"}, "R2CCL_NIC_AFFINITY"),
    ({"R2CCL_BOOTSTRAP_TIMEOUT": "0"}, "R2CCL_BOOTSTRAP_TIMEOUT"),
    ({"R2CCL_SECRET": "abc"}, "R2CCL_SECRET must be hex"),
    ({"R2CCL_SECRET": "ab" * 15}, "R2CCL_SECRET must hold at least 16 bytes"),
])
def test_bad_values_are_refused_with_the_setting_named(env, needle):
    with pytest.raises(R2cclError, match=needle):
        Config.from_env(env=env)


def test_the_core_parser_reads_what_people_write():
    cfg = Config.from_env(env={"R2CCL_CHUNK_BYTES": " 0x10000 ", "R2CCL_CRC": "On", "R2CCL_DEBUG": "warning",
                               "R2CCL_TIMEOUT": "1e1", "R2CCL_IB_GID_INDEX": "-1", "R2CCL_BIND_DEVICE": ""})
    assert (cfg.chunk_bytes, cfg.crc, cfg.debug, cfg.timeout_s, cfg.ib_gid_index, cfg.bind_device) == (
        65536, True, "WARN", 10.0, -1, False)
    assert cfg.sources(env={"R2CCL_CHUNK_BYTES": "65536"})["R2CCL_CRC"] == "override"


def test_unknown_override_is_refused():
    with pytest.raises(R2cclError, match="unknown setting"):
        Config.from_env(env={}, chunk_size=1)


def test_bad_secret_and_nic_are_clear_errors():
    from jax_r2ccl.transport import Endpoint
    with pytest.raises(R2cclError, match="R2CCL_SECRET"):
        Config.from_env(env={"R2CCL_SECRET": "zz"}).secret_bytes()
    with pytest.raises(R2cclError, match="no-such-nic0"):
        Endpoint(0, 2, nics=["no-such-nic0"], secret=b"s" * 32, config=Config.from_env(env={}))
    with pytest.raises(R2cclError, match="at least 16 bytes"):
        Endpoint(0, 2, nics=["127.0.0.1"], secret=b"short", config=Config.from_env(env={}))
    with pytest.raises(R2cclError, match="outside world"):
        Endpoint(2, 2, nics=["127.0.0.1"], secret=b"s" * 32, config=Config.from_env(env={}))
