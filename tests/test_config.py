"""Bootstrap config validation: errors name the JSON path, the value and what was expected."""

from __future__ import annotations

import json

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.composition import parse_dependency, service_schema
from svcframe.config import ServiceConfig, load_config, parse_config
from svcframe.errors import ConfigError


def test_defaults_filled_in() -> None:
    cfg = parse_config({})
    dumped = cfg.model_dump(mode="json")
    assert dumped["engine"]["progress_mode"] == "spindown"
    assert dumped["engine"]["progress_spindown_msec"] == 10.0
    assert dumped["engine"]["progress_timeout_ub_msec"] == 100.0
    assert dumped["admin"]["provider_id"] == 0
    assert dumped["providers"] == []
    assert parse_config(dumped) == cfg  # the filled-in document is itself a valid config


@pytest.mark.parametrize(
    ("doc", "path", "fragment"),
    [
        ({"engine": {"progress_mode": "fast"}}, "engine.progress_mode", "'block', 'busy' or 'spindown'"),
        ({"engine": {"address": "http://x"}}, "engine.address", "tcp://HOST:PORT"),
        ({"engine": {"adress": "tcp://127.0.0.1:0"}}, "engine.adress", "Extra inputs are not permitted"),
        ({"engine": {"progress_spindown_msec": -1}}, "engine.progress_spindown_msec", "greater than or equal to 0"),
        ({"providers": [{"name": "a", "type": "kv", "provider_id": 70000}]}, "providers[0].provider_id", "65535"),
        ({"providers": [{"name": "1bad", "type": "kv"}]}, "providers[0].name", "pattern"),
        ({"providers": [{"type": "kv"}]}, "providers[0].name", "Field required"),
        (
            {
                "providers": [
                    {"name": "a", "type": "kv", "provider_id": 3},
                    {"name": "b", "type": "kv", "provider_id": 3},
                ]
            },
            "providers",
            "share provider_id 3",
        ),
        ({"providers": [{"name": "a", "type": "kv", "provider_id": 0}]}, "providers", "reserved for the admin"),
    ],
)
def test_errors_name_path_and_expectation(doc: dict, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc, "svc.json")
    message = str(info.value)
    assert f"svc.json: {path}" in message or (path == "providers" and fragment in message)
    assert fragment in message


def test_value_shown_in_error() -> None:
    with pytest.raises(ConfigError, match=r"got 70000"):
        parse_config({"providers": [{"name": "a", "type": "kv", "provider_id": 70000}]})


def test_load_config_reports_json_syntax_position(tmp_path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{"engine": {"address": "tcp://127.0.0.1:0",}}')
    with pytest.raises(ConfigError, match=r"invalid JSON at line 1, column"):
        load_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_single_library_string_accepted() -> None:
    assert parse_config({"libraries": "providers.kv"}).libraries == ["providers.kv"]


def test_shipped_configs_are_valid() -> None:
    for path in (SELFTEST_CONFIG, "configs/kv.json"):
        cfg = load_config(path)
        assert cfg.providers


def test_schema_exported() -> None:
    schema = service_schema(())
    assert schema["title"] == "ServiceConfig"
    assert "engine" in schema["properties"]
    json.dumps(schema)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kv", ("kv", None, None, None)),
        ("kv@local", ("kv", None, None, None)),
        ("kv:3", (None, "kv", 3, None)),
        ("kv:3@tcp://127.0.0.1:4000", (None, "kv", 3, "tcp://127.0.0.1:4000")),
    ],
)
def test_dependency_grammar(text: str, expected: tuple) -> None:
    assert parse_dependency(text) == expected


@pytest.mark.parametrize("text", ["kv:x", ":3", "@local"])
def test_dependency_grammar_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_dependency(text)


def test_validate_assignment() -> None:
    cfg = ServiceConfig()
    with pytest.raises(ValueError):
        cfg.engine.progress_mode = "nope"  # type: ignore[assignment]


def test_provider_ids_are_0_to_65534_and_65535_means_choose_one() -> None:
    """Bedrock's convention: 65535 in a providers[] entry lets the server choose (the lowest free id)."""
    cfg = parse_config({"providers": [{"name": "a", "type": "kv", "provider_id": 65535}]})
    assert cfg.providers[0].provider_id is None
    assert parse_config({"admin": {"provider_id": 65534}}).admin.provider_id == 65534
    with pytest.raises(ConfigError, match=r"admin\.provider_id: Input should be less than or equal to 65534"):
        parse_config({"admin": {"provider_id": 65535}})
