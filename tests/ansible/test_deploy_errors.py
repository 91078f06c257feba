"""User mistakes stop a deployment cleanly, against a real lab over SSH.

- A malformed inventory variable fails the preflight play on every host with one line
  naming the variable and the expected type, before any host is changed.
- A collector.yml the collector would reject is caught by the template's `validate:`;
  the old file stays in place and the collector keeps running.
- Check mode on a converged fleet reports nothing to change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.ansible.conftest import ROOT, Lab, recap

pytestmark = [pytest.mark.root, pytest.mark.lab]

PACKAGES = ("clockmesh", "collector", "analytics", "tui", "lab")
COLLECTORS = ("h1-1", "h2-1")


@pytest.fixture(scope="module")
def deploy_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A frozen copy of the source (edits elsewhere cannot change the wheelhouse mid-test)
    and a private wheelhouse directory."""
    base = tmp_path_factory.mktemp("deploy")
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return [
        "playbooks/deploy.yml",
        "-e", f"clockmesh_wheelhouse_source_dir={source}",
        "-e", f"clockmesh_wheelhouse_dir={base / 'wheelhouse'}",
    ]  # fmt: skip


def _absent(lab: Lab, host: str, path: str) -> bool:
    return lab.exec(host, "test", "-e", path).returncode == 1


def test_malformed_variable_fails_everywhere_before_any_change(
    small_lab: Lab, deploy_args: list[str], tmp_path: Path
) -> None:
    inventory = yaml.safe_load(small_lab.inventory.read_text())
    rack = inventory["all"]["children"]["collectors"]["children"]["leaf1"]
    rack["hosts"]["h1-1"]["clockmesh_collector_probe_ports"] = "eight"
    bad_inventory = tmp_path / "inventory.yml"
    bad_inventory.write_text(yaml.safe_dump(inventory))

    result = small_lab.playbook(*deploy_args, "-i", str(bad_inventory))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    message = "clockmesh_collector_probe_ports: expected int, got str ('eight')"
    assert message in output
    assert f"msg: '{message}" in output.replace("''", "'") or f'"msg": "{message}' in output
    stats = recap(output)
    assert set(stats) == {"ops", *COLLECTORS}
    assert all(s["changed"] == 0 for s in stats.values()), stats
    # Nothing was installed or written anywhere, the ops box included.
    for host in (*COLLECTORS, "ops"):
        assert _absent(small_lab, host, "/opt/clockmesh/venv"), host
        assert _absent(small_lab, host, "/etc/clockmesh/fleet.key"), host


@pytest.mark.timeout(1800)
def test_invalid_collector_yml_keeps_the_old_file_and_check_mode_is_clean(
    small_lab: Lab, deploy_args: list[str]
) -> None:
    limit = ["--limit", "collectors"]  # the ops box is the molecule scenario's business
    first = small_lab.playbook(*deploy_args, *limit)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    before = {
        h: small_lab.exec(h, "sha256sum", "/etc/clockmesh/collector.yml").stdout for h in COLLECTORS
    }
    assert all(before.values())

    bad = small_lab.playbook(
        *deploy_args,
        *limit,
        "-e",
        '{"clockmesh_collector_extra_config": {"probe": {"port_per_buddy": 8}}}',
    )
    output = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert "failed to validate" in output
    assert "probe.port_per_buddy: unknown key" in output
    for host in COLLECTORS:
        after = small_lab.exec(host, "sha256sum", "/etc/clockmesh/collector.yml").stdout
        assert after == before[host], f"{host}: collector.yml changed although validation failed"
        assert (
            "port_per_buddy"
            not in small_lab.exec(host, "cat", "/etc/clockmesh/collector.yml").stdout
        )
        status = small_lab.exec(
            host, "/opt/clockmesh/venv/bin/clockmesh", "daemon", "status",
            "--name", "clockmesh-collector", "--pidfile", "/run/clockmesh/collector.pid",
        )  # fmt: skip
        assert status.returncode == 0, f"{host}: {status.stdout}{status.stderr}"

    check = small_lab.playbook(*deploy_args, *limit, "--check", "--diff")
    assert check.returncode == 0, (check.stdout + check.stderr)[-4000:]
    stats = recap(check.stdout)
    assert set(stats) == set(COLLECTORS)
    assert all(s["changed"] == 0 for s in stats.values()), check.stdout[-4000:]
