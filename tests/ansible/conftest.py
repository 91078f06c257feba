"""Helpers for tests that run ansible-playbook or molecule against a real lab."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RECAP = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


def tool_env() -> dict[str, str]:
    """Environment for ansible/molecule: the venv's tools first, our ansible.cfg."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["PY_COLORS"] = "0"
    return env


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    return {
        m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
        for m in RECAP.finditer(output)
    }


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")


class Lab:
    """A lab built for one test module, with a unique name; always torn down."""

    def __init__(self, name: str, *up_args: str) -> None:
        self.name = name
        self.up_args = up_args
        self.inventory = ROOT / ".lab" / name / "inventory.yml"

    def up(self) -> None:
        subprocess.run(
            [str(BIN / "clockmesh"), "lab", "up", "--name", self.name, *self.up_args],
            cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    def down(self) -> None:
        subprocess.run(
            [str(BIN / "clockmesh"), "lab", "down", "--name", self.name],
            cwd=ROOT, check=False, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    def exec(self, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "clockmesh"), "lab", "exec", "--name", self.name, node, "--", *argv],
            cwd=ROOT, check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def playbook(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(self.inventory), *args],
            cwd=ROOT, env=tool_env(), check=False, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip


@pytest.fixture(scope="module")
def small_lab() -> Iterator[Lab]:
    """Two racks, one collector each, plus the ops box."""
    needs_root()
    lab = Lab(
        f"ans{os.getpid() % 100000}", "--spines", "1", "--leaves", "2", "--hosts-per-leaf", "1"
    )
    try:
        lab.up()
        yield lab
    finally:
        lab.down()
