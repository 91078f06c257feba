"""The molecule scenario: create (lab up) -> converge (playbooks/deploy.yml over SSH)
-> idempotence -> verify (the collector runs on every host) -> destroy (lab down)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ansible.conftest import BIN, ROOT, needs_root, tool_env

pytestmark = [pytest.mark.root, pytest.mark.lab, pytest.mark.molecule]

PACKAGES = ("clockmesh", "collector", "analytics", "tui", "lab")


def frozen_source(target: Path) -> Path:
    """Copy the package sources, so edits made during the run cannot fake a change."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return target


def molecule_test(scenario: str, lab: str | None, env: dict[str, str], timeout: float) -> str:
    """``molecule test`` of one scenario (its lab torn down whatever happens); returns the
    output without colours after checking every step of the sequence succeeded."""
    env.pop("ANSIBLE_CONFIG", None)  # molecule writes its own ansible.cfg (molecule.yml)
    try:
        result = subprocess.run(
            [str(BIN / "molecule"), "test", "--scenario-name", scenario],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    finally:
        # molecule destroys on failure too; this covers a molecule that died or timed out.
        if lab is not None:
            subprocess.run(
                [str(BIN / "clockmesh"), "lab", "down", "--name", lab],
                cwd=ROOT, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, output[-6000:]
    for action in ("create", "converge", "idempotence", "verify", "destroy"):
        assert re.search(rf"{scenario} > {action}: Executed: Successful", output), action
    return output


@pytest.mark.timeout(1800)
def test_molecule_scenario_converges_idempotently_and_verifies(tmp_path: Path) -> None:
    needs_root()
    env = tool_env()
    env["CLOCKMESH_WHEELHOUSE_SOURCE_DIR"] = str(frozen_source(tmp_path / "src"))
    env["CLOCKMESH_WHEELHOUSE_DIR"] = str(tmp_path / "wheelhouse")
    output = molecule_test("default", "molecule", env, 1700)
    # The converge run really deployed: every collector and the ops box changed something.
    assert "Start the collector under clockmesh daemon" in output
    assert not (ROOT / ".lab" / "molecule" / "inventory.yml").exists()


@pytest.mark.timeout(900)
def test_molecule_fabric_link_scenario_routes_around_and_restores() -> None:
    """The remediation role against the lab's FRR routers: converge (leaf1-spine2 out of
    service on both ends) -> idempotence -> verify (converged around it; restored)."""
    needs_root()
    output = molecule_test("fabric_link", "molfab", tool_env(), 800)
    # converge really changed both switches (idempotence then found nothing to change)
    for switch in ("switch-leaf1", "switch-spine2"):
        assert re.search(rf"{switch}\s*:\s*ok=\d+\s+changed=1", output), switch


@pytest.mark.timeout(600)
def test_molecule_drain_scenario_drains_only_free_nodes_and_resumes_only_its_own() -> None:
    """The drain role against a real one-node Slurm controller: converge (h1-1 and h2-1
    drained, h1-2 left with someone else's reason) -> idempotence -> verify (reasons;
    resume; h1-2 still drained)."""
    needs_root()
    from lab.slurm import missing_tools

    if missing_tools():
        pytest.skip(f"not installed: {', '.join(missing_tools())} (make deps installs them)")
    output = molecule_test("drain", None, tool_env(), 500)
    assert re.search(r"clockmesh-slurm-controller\s*:\s*ok=\d+\s+changed=1", output)


@pytest.mark.timeout(900)
def test_molecule_nccl_conf_scenario_sets_both_roles_lines_and_restores() -> None:
    """The host-side remediation roles over SSH on lab hosts: converge (each host's RoCE v2
    index from its own GID table, four queue pairs) -> idempotence -> verify (the file;
    restore; gone again)."""
    needs_root()
    output = molecule_test("nccl_conf", "molnccl", tool_env(), 800)
    for host in ("h1-1", "h1-2"):
        assert re.search(rf"{host}\s*:\s*ok=\d+\s+changed=2", output), host
