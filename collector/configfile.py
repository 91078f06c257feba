"""Load a YAML config file into a typed structure, or fail with one clear line.

Every clockmesh config (collector.yml, ingest.yml, the lab topology) goes through
:func:`load`, so a user mistake always reads the same way::

    /etc/clockmesh/collector.yml: probe.ports_per_buddy: expected int, got str ('eight')
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

T = TypeVar("T")


class ConfigError(Exception):
    """A config file is missing, unreadable, or does not match its schema.

    ``str(error)`` is a single line naming the file, the key and what was expected.
    """

    def __init__(self, path: str | Path, key: str | None, message: str) -> None:
        self.path = str(path)
        self.key = key
        self.message = message
        where = f"{self.path}: {key}: " if key else f"{self.path}: "
        super().__init__(where + message)


_PATH_RE = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _key_from_msgspec(path: str) -> str:
    # msgspec reports "$.probe.ports[2]"; users read "probe.ports[2]".
    return path.lstrip(".") or "(top level)"


def convert(data: Any, type_: type[T], source: str | Path) -> T:
    """Validate already-parsed ``data`` against ``type_`` (a msgspec Struct)."""
    try:
        return msgspec.convert(data, type_, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_RE.search(text)
        key = _key_from_msgspec(match.group("path")) if match else None
        message = _PATH_RE.sub("", text)
        field = re.search(r"field `([^`]*)`", message)
        if field and message.startswith(("Object contains unknown", "Object missing required")):
            key = field.group(1) if key in (None, "(top level)") else f"{key}.{field.group(1)}"
            if message.startswith("Object contains unknown"):
                message = "unknown key (check its spelling against the documented keys)"
            else:
                message = "required key is missing"
        else:
            message = re.sub(r"Expected `([^`]*)`, got `([^`]*)`", r"expected \1, got \2", message)
            message = message.replace("`", "")
        raise ConfigError(source, key, message) from None


def load(path: str | Path, type_: type[T]) -> T:
    """Read the YAML file at ``path`` and validate it against ``type_``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(path, None, f"{where}{problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            path, None, f"expected a mapping at the top level, got {type(data).__name__}"
        )
    return convert(data, type_, path)
