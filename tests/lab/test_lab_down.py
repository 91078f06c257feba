"""`lab down` leaves nothing behind: namespaces, veths, bridge, mounts, processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import processes
from lab.fabric import Lab
from lab.state import LabState

pytestmark = [pytest.mark.root, pytest.mark.lab]


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _assert_gone(name: str, state_dir: Path, slot: int | None, pids: list[dict]) -> None:
    assert not [ns for ns in _netns_list() if ns.startswith(f"{name}-")]
    links = _root_links()
    if slot is not None:
        assert f"cmbr{slot}:" not in links and f" cm{slot}-" not in links
    assert f"clockmesh-lab:{name}\n" not in links and f"alias clockmesh-lab:{name} " not in links
    mounts = Path("/proc/mounts").read_text()
    assert str(state_dir) not in mounts and f"/run/netns/{name}-" not in mounts
    for rec in pids:
        assert not processes.alive(rec), rec


def test_down_removes_everything_and_is_idempotent(lab_factory: Callable[..., Lab]) -> None:
    lab = lab_factory("d", spines=1, leaves=2, hosts_per_leaf=1)
    state = LabState(lab.dir).read()
    slot = state["slot"]
    # something started inside a host (as the collector would be, over SSH)
    extra = lab.popen("h1-1", ["sleep", "300"])
    recs = [*state["processes"], processes.record(extra.pid)]
    assert len(_netns_list()) >= 6 and f"cmbr{slot}" in _root_links()
    report = lab.down()
    extra.wait(timeout=5)
    assert len(report.namespaces) == 6 and extra.pid in report.pids
    _assert_gone(lab.name, lab.dir, slot, recs)
    assert not lab.dir.exists()
    again = lab.down()
    assert (again.namespaces, again.root_links, again.pids) == ([], [], [])


def test_down_after_sigkilled_up(lab_factory: Callable[..., Lab]) -> None:
    lab = lab_factory("k", build=False)
    cmd = [sys.executable, "-m", "clockmesh.cli", "lab", "up", "--name", lab.name]
    cmd += ["--state-dir", str(lab.dir), "--leaves", "2", "--hosts-per-leaf", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file = lab.dir / "state.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if json.loads(state_file.read_text()).get("processes"):
                break  # namespaces wired, some sshd started: kill it mid-way
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = LabState(lab.dir).read()
    assert state.get("complete") is False
    assert [ns for ns in _netns_list() if ns.startswith(f"{lab.name}-")]
    lab.down()
    _assert_gone(lab.name, lab.dir, state.get("slot"), state.get("processes", []))


def test_down_without_state_file_scans(lab_factory: Callable[..., Lab]) -> None:
    lab = lab_factory("n", spines=1, leaves=1, hosts_per_leaf=1)
    state = LabState(lab.dir).read()
    (lab.dir / "state.json").unlink()  # crash lost the state: the scan must still find it all
    lab.down()
    _assert_gone(lab.name, lab.dir, state["slot"], state["processes"])


def test_up_refuses_a_running_lab(lab_factory: Callable[..., Lab]) -> None:
    from lab.fabric import LabError

    lab = lab_factory("r", spines=1, leaves=1, hosts_per_leaf=1)
    with pytest.raises(LabError, match="already up"):
        lab.up(spines=1, leaves=1, hosts_per_leaf=1)
    # the same name with its state elsewhere (two runs of one scenario seed): refused with
    # the reason, and the running lab is left whole
    other = Lab(lab.name, lab.dir.parent / "elsewhere")
    with pytest.raises(LabError, match=r"already exist .* choose another name"):
        other.up(spines=1, leaves=1, hosts_per_leaf=1)
    st = lab.status()
    assert st.bridge_exists and len(st.namespaces_present) == st.namespaces_expected
    lab.down()


def test_discover_finds_every_lab_for_down_all(lab_factory: Callable[..., Lab]) -> None:
    one = lab_factory("a", spines=1, leaves=1, hosts_per_leaf=1)
    two = lab_factory("b", spines=1, leaves=1, hosts_per_leaf=1)
    found = Lab.discover()
    assert {one.name, two.name} <= found
    # what `down --all` does for a lab whose state dir it does not know
    Lab(two.name, two.dir.parent / "elsewhere").down(keep_files=True)
    assert two.name not in Lab.discover() and one.name in Lab.discover()
    one.down()
