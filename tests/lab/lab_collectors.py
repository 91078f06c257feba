"""Start real collectors in lab hosts (their network and mount namespaces); stop them all.

Shared by the lab tests that need a fleet: each collector gets its own config, spool and
log under ``base/<host>/`` and ships to ``url`` over the management network.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from lab import fake_rdma

ROOT = Path(__file__).resolve().parents[2]


def start(
    lab: Any, base: Path, key: bytes, url: str, probe: dict[str, Any] | None = None
) -> dict[str, subprocess.Popen[bytes]]:
    """One collector per lab host; returns host name -> process (stop with :func:`stop`)."""
    topo = lab.topology
    (base / "fleet.key").write_bytes(key)
    peers = [{"name": h.name, "address": h.backend_address, "rack": h.rack} for h in topo.hosts]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for h in topo.hosts:
            tree = fake_rdma.write_tree(
                fake_rdma.tree_root(lab.node_dir(h.name)),
                h.name,
                h.backend_interface,
                h.backend_address,
            )
            assert tree.exists()
            d = base / h.name
            d.mkdir()
            cfg: dict[str, Any] = {
                "host": h.name,
                "rack": h.rack,
                "lab": True,
                "fleet_key_file": str(base / "fleet.key"),
                "backend": {"address": h.backend_address, "interface": h.backend_interface},
                "peers": peers,
                "probe": {"buddies_random": 10, **(probe or {})},
                "ingest": {"url": url},
                "spool": {"dir": str(d / "spool"), "roll_s": 0.5},
                "counters": {"sysfs_root": fake_rdma.IN_HOST_PATH},
                "rdma": {
                    "configfs_root": fake_rdma.IN_HOST_PATH + "/sys/kernel/config",
                    "pyverbs": False,
                },
                "inband": {"socket": "/run/clockmesh/inband.sock"},
                "status_file": str(d / "status.json"),
            }
            if h.clock is not None:
                cfg["lab_clock"] = {"offset_ns": h.clock.offset_ns, "drift_ppm": h.clock.drift_ppm}
            (d / "collector.yml").write_text(yaml.safe_dump(cfg))
            argv = [sys.executable, "-m", "clockmesh.cli", "collector", "run", "--config"]
            with open(d / "collector.log", "wb") as log:
                procs[h.name] = lab.popen(
                    h.name,
                    [*argv, str(d / "collector.yml")],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM every collector, SIGKILL any still running 15 s later."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
