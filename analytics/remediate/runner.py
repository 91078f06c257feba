"""Run ``playbooks/remediate.yml`` / ``undo.yml``: a check-mode preview, then (after an
explicit yes) the real run, each streamed line by line. ``clockmesh remediate`` and the TUI
call the same code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


@dataclass
class RunResult:
    rc: int
    changed: dict[str, int] = field(default_factory=dict)  # host -> changed count
    failed: dict[str, int] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Exit 0, no host failed, and some host ran at all (a recap was printed)."""
        return self.rc == 0 and bool(self.changed) and not any(self.failed.values())


def playbook_argv(
    inventory: Path,
    playbook: str,
    extra: dict[str, str],
    check: bool,
    ansible_playbook: str | None = None,
) -> list[str]:
    exe = ansible_playbook or str(Path(sys.executable).with_name("ansible-playbook"))
    argv = [exe, "-i", str(inventory), str(PLAYBOOKS / playbook)]
    for k, v in extra.items():  # JSON: a value with spaces (abandon --why) arrives whole
        argv += ["-e", json.dumps({k: v})]
    if check:
        argv += ["--check", "--diff"]
    return argv


def stream(
    argv: list[str],
    echo: Callable[[str], None],
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
) -> RunResult:
    """Run ``argv``, hand every output line to ``echo`` as it comes, parse the recap.
    ``on_start`` gets the process (to cancel it: ``terminate()``)."""
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1"}
    result = RunResult(rc=-1)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        cwd=PLAYBOOKS.parent,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        if on_start is not None:
            on_start(proc)
        for line in _lines(proc.stdout):
            result.lines.append(line)
            echo(line)
            m = _RECAP.match(line)
            if m:
                result.changed[m[1]] = int(m[3])
                result.failed[m[1]] = int(m[4]) + int(m[5])
        result.rc = proc.wait()
    return result


def _lines(f: object) -> Iterator[str]:
    for line in f:  # type: ignore[attr-defined]
        yield line.rstrip("\n")
