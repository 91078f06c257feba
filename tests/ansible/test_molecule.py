"""The molecule scenario: create (lab up) -> converge (playbooks/deploy.yml over SSH)
-> idempotence -> verify (the collector runs on every host) -> destroy (lab down)."""

from __future__ import annotations

import subprocess

import pytest

from tests.ansible.conftest import BIN, ROOT, needs_root, tool_env

pytestmark = [pytest.mark.root, pytest.mark.lab, pytest.mark.molecule]


@pytest.mark.timeout(1800)
def test_molecule_scenario_converges_idempotently_and_verifies() -> None:
    needs_root()
    env = tool_env()
    env.pop("ANSIBLE_CONFIG")  # molecule writes its own ansible.cfg (molecule.yml)
    try:
        result = subprocess.run(
            [str(BIN / "molecule"), "test", "--scenario-name", "default"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
    finally:
        # molecule destroys on failure too; this covers a molecule that died or timed out.
        subprocess.run(
            [str(BIN / "clockmesh"), "lab", "down", "--name", "molecule"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "Idempotence completed successfully" in output or "idempotence" in output.lower()
    assert "Verifier completed successfully" in output or "verify" in output.lower()
    assert not (ROOT / ".lab" / "molecule" / "inventory.yml").exists()
