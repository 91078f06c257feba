"""A fleet in a lab without Ansible: collectors in the hosts, an ingest daemon beside.

Used by the lab tests and by ``clockmesh lab scenario run``: each collector gets its own
config, spool and log under ``base/<host>/`` (in its host's network and mount
namespaces) and ships to ``url`` over the management network; :func:`start_opsbox` runs
``clockmesh ingest run`` in the root namespace on the management bridge. ``make demo``
deploys the same programs with Ansible instead.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from lab import fake_rdma

ROOT = Path(__file__).resolve().parents[1]  # the checkout
NCCL_CONF = "/etc/clockmesh/nccl.conf"  # inside a lab host's mount namespace


def write_configs(
    lab: Any, base: Path, key: bytes, url: str | list[str], probe: dict[str, Any] | None = None
) -> dict[str, Path]:
    """Each lab host's fake RDMA tree and ``base/<host>/collector.yml``; returns host ->
    its config. ``url``: the ops box, or a list of ops boxes (a standby pair)."""
    topo = lab.topology
    base.mkdir(parents=True, exist_ok=True)
    (base / "fleet.key").write_bytes(key)
    peers = [{"name": h.name, "address": h.backend_address, "rack": h.rack} for h in topo.hosts]
    out = {}
    for h in topo.hosts:
        tree = fake_rdma.write_tree(
            fake_rdma.tree_root(lab.node_dir(h.name)),
            h.name,
            h.backend_interface,
            h.backend_address,
        )
        assert tree.exists()
        d = base / h.name
        d.mkdir(exist_ok=True)
        cfg: dict[str, Any] = {
            "host": h.name,
            "rack": h.rack,
            "lab": True,
            "fleet_key_file": str(base / "fleet.key"),
            "backend": {"address": h.backend_address, "interface": h.backend_interface},
            "peers": peers,
            "probe": {"buddies_random": 10, **(probe or {})},
            "ingest": {"urls": url} if isinstance(url, list) else {"url": url},
            "spool": {"dir": str(d / "spool"), "roll_s": 0.5},
            "counters": {"sysfs_root": fake_rdma.IN_HOST_PATH},
            "rdma": {
                "configfs_root": fake_rdma.IN_HOST_PATH + "/sys/kernel/config",
                "pyverbs": False,
                # Lab hosts share /etc: each reads its private /etc/clockmesh (as deployed).
                "nccl_conf": NCCL_CONF,
            },
            "inband": {"socket": "/run/clockmesh/inband.sock"},
            "status_file": str(d / "status.json"),
        }
        if h.clock is not None:
            cfg["lab_clock"] = {"offset_ns": h.clock.offset_ns, "drift_ppm": h.clock.drift_ppm}
        (d / "collector.yml").write_text(yaml.safe_dump(cfg))
        out[h.name] = d / "collector.yml"
    return out


def start(
    lab: Any, base: Path, key: bytes, url: str | list[str], probe: dict[str, Any] | None = None
) -> dict[str, subprocess.Popen[bytes]]:
    """One collector per lab host; returns host name -> process (stop with :func:`stop`)."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, config in write_configs(lab, base, key, url, probe).items():
            argv = [sys.executable, "-m", "clockmesh.cli", "collector", "run", "--config"]
            with open(config.parent / "collector.log", "wb") as log:
                procs[name] = lab.popen(
                    name, [*argv, str(config)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
                )
    except BaseException:
        stop(procs)
        raise
    return procs


def step_clock(config: Path, proc: subprocess.Popen[bytes], step_ns: int) -> int:
    """Step a lab host's clock by ``step_ns`` (a PTP servo re-locking, chrony or ntpd
    stepping): its collector's ``lab_clock.offset_ns`` in ``config`` (written whole, then
    renamed) and a reload (SIGHUP). Returns the new offset."""
    cfg = yaml.safe_load(config.read_text())
    clock = cfg.get("lab_clock") or {"offset_ns": 0, "drift_ppm": 0.0}
    clock["offset_ns"] = int(clock["offset_ns"]) + step_ns
    cfg["lab_clock"] = clock
    tmp = config.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg))
    tmp.replace(config)
    proc.send_signal(signal.SIGHUP)
    return int(clock["offset_ns"])


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


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_opsbox(
    lab: Any, base: Path, key: bytes, **config: Any
) -> tuple[subprocess.Popen[bytes], str]:
    """``clockmesh ingest run`` on the lab's management bridge, the store in ``base/store``
    and the lab's topology file for link names. Returns (process, base URL)."""
    gateway = lab.topology.mgmt.gateway
    port = free_port(gateway)
    base.mkdir(parents=True, exist_ok=True)
    (base / "opsbox.key").write_bytes(key + b"\n")
    cfg = {
        "listen": f"{gateway}:{port}",
        "store_dir": str(base / "store"),
        "fleet_key_file": str(base / "opsbox.key"),
        "min_free_bytes": 0,
        "live_refresh_s": 1,
        "topology_file": str(lab.topology_path),
        **config,
    }
    (base / "ingest.yml").write_text(json.dumps(cfg))
    url = f"http://{gateway}:{port}"
    return restart_opsbox(base, url), url


def restart_opsbox(base: Path, url: str) -> subprocess.Popen[bytes]:
    """``clockmesh ingest run`` with the config :func:`start_opsbox` wrote in ``base`` (the
    same store and port: an ops box coming back); returns once it answers."""
    with open(base / "ingest.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clockmesh.cli", "ingest", "run", "--config",
             str(base / "ingest.yml")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ingest daemon exited; see {base / 'ingest.log'}")
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).read()
            return proc
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"ingest daemon did not answer on {url}; see {base / 'ingest.log'}")


def stop_opsbox(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def opsbox_inventory(
    lab: Any, store: Path | list[Path], out: Path, hosts: Path | None = None
) -> Path:
    """The lab's inventory with its ``opsbox`` replaced by this machine, where
    :func:`start_opsbox` runs the daemon: the remediation playbooks' preflight and record
    then read and write ``store`` with this checkout's ``clockmesh``. A list of stores is a
    standby pair: ops boxes ``ops`` and ``ops2``, each with its own store. With ``hosts``
    (the base :func:`start` was given), each host's playbooks use this checkout's CLI and
    the collector.yml :func:`start` wrote for it. Returns ``out``."""

    inv = yaml.safe_load(Path(lab.inventory_path).read_text())
    python = Path(sys.executable)
    stores = store if isinstance(store, list) else [store]
    inv["all"]["children"]["opsbox"] = {
        "hosts": {
            f"ops{i + 1 if i else ''}": {
                "ansible_connection": "local",
                "ansible_python_interpreter": str(python),
                **({"clockmesh_ops_store_dir": str(s)} if len(stores) > 1 else {}),
            }
            for i, s in enumerate(stores)
        }
    }
    inv["all"]["vars"].update(
        clockmesh_ops_cli=str(python.with_name("clockmesh")),
        clockmesh_ops_store_dir=str(stores[0]),
        clockmesh_ops_topology_file=str(lab.topology_path),
    )
    if hosts is not None:
        for rack in inv["all"]["children"]["collectors"]["children"].values():
            for name, hv in rack["hosts"].items():
                hv["clockmesh_host_cli"] = str(python.with_name("clockmesh"))
                hv["clockmesh_host_collector_config"] = str(hosts / name / "collector.yml")
    out.write_text(yaml.safe_dump(inv, sort_keys=False))
    out.chmod(0o600)  # holds the fleet key
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m lab.fleet configs --name LAB --out DIR``: every host's collector.yml (and
    fake RDMA tree) without starting anything: what host-side roles need to run against a
    lab host (the molecule scenario nccl_conf)."""
    import argparse

    from lab.fabric import Lab

    ap = argparse.ArgumentParser(prog="python -m lab.fleet", description=main.__doc__)
    ap.add_argument("action", choices=["configs"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    lab = Lab(args.name, state_dir=args.state_dir)
    for name, path in write_configs(lab, args.out, b"unused-fleet-key-0123456789abcdef",
                                    "http://127.0.0.1:9").items():  # fmt: skip
        print(f"{name} {path}")


if __name__ == "__main__":
    main()
