"""The fleet key: one reader for every process that signs or verifies with it.

The roles write it to ``/etc/clockmesh/fleet.key`` (mode 0600) from an Ansible Vault
variable; configs name the file, never the key. The key is the file's bytes with
surrounding whitespace removed (so an editor's trailing newline does not change it).
"""

from __future__ import annotations

from pathlib import Path

from collector.configfile import ConfigError

MIN_BYTES = 16


def read(path: str | Path, config_path: str | Path) -> bytes:
    """Read the key named by ``fleet_key_file`` in ``config_path``; never logs it."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(
            config_path, "fleet_key_file", f"cannot read {path}: {exc.strerror or exc}"
        ) from None
    if len(key) < MIN_BYTES:
        raise ConfigError(
            config_path,
            "fleet_key_file",
            f"{path} holds {len(key)} bytes, expected at least {MIN_BYTES}",
        )
    return key
