from __future__ import annotations

from pathlib import Path

import pytest

from collector import config
from collector.configfile import ConfigError

MINIMAL = """\
host: h01
backend: {address: 198.18.1.2}
ingest: {url: "http://198.19.0.1:8470"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "collector.yml"
    path.write_text(text)
    return path


def test_minimal_config_gets_documented_defaults(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, MINIMAL))
    assert cfg.probe.ports_per_buddy == 8
    assert cfg.probe.buddies_random == 10
    assert cfg.backend.probe_port == 7470


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("probe: {ports_per_buddy: eight}\n", "probe.ports_per_buddy: expected int, got str"),
        ("probe: {port_per_buddy: 8}\n", "probe.port_per_buddy: unknown key"),
        ("lab_clock: {offset_ns: 5}\n", "lab_clock: only allowed with lab: true"),
        (
            "backend: {address: 198.18.1.2, probe_port: 70000}\n",
            "backend.probe_port: expected a port",
        ),
    ],
)
def test_bad_values_name_file_key_and_expectation(
    tmp_path: Path, extra: str, expected: str
) -> None:
    text = (
        MINIMAL.replace("backend: {address: 198.18.1.2}\n", "") if "backend" in extra else MINIMAL
    )
    path = write(tmp_path, text + extra)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_missing_required_key_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="host: required key is missing"):
        config.load(write(tmp_path, "backend: {address: x}\ningest: {url: 'http://x'}\n"))
    with pytest.raises(ConfigError, match=r"line \d+"):
        config.load(write(tmp_path, "host: [unclosed\n"))
    with pytest.raises(ConfigError, match="file not found"):
        config.load(tmp_path / "absent.yml")
