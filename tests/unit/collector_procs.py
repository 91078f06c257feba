"""Start real collector processes on loopback addresses for tests and benchmarks."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KEY = b"clockmesh-test-fleet-key-0123456789abcdef"


def free_udp_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def loopback_net() -> str:
    """A random 127.x.y.0/24 prefix so parallel test runs do not collide."""
    return f"127.{random.randint(64, 250)}.{random.randint(1, 250)}"


def write_config(
    tmp: Path, host: str, address: str, peers: list[dict[str, str]], ingest_url: str, **extra: Any
) -> Path:
    base = tmp / host
    base.mkdir(parents=True, exist_ok=True)
    key = tmp / "fleet.key"
    if not key.exists():
        key.write_bytes(KEY + b"\n")
        key.chmod(0o600)
    doc: dict[str, Any] = {
        "host": host,
        "rack": "r1",
        "fleet_key_file": str(key),
        "backend": {"address": address, "interface": "lo", "probe_port": extra.pop("port")},
        "peers": peers,
        "probe": {"base_sport": extra.pop("base_sport")},
        "ingest": {"url": ingest_url, "retry_max_s": 2.0, "timeout_s": 2.0},
        "spool": {"dir": str(base / "spool"), "roll_s": 0.5},
        "inband": {"socket": str(base / "inband.sock")},
        "status_file": str(base / "status.json"),
        "counters": {
            "sysfs_root": str(ROOT / "tests/data/sysfs/mlx5_roce"),
            "interfaces": ["ens1f0np0"],
        },
        "rdma": {
            "nccl_conf": str(ROOT / "tests/data/sysfs/mlx5_roce/etc/nccl.conf"),
            "configfs_root": str(ROOT / "tests/data/sysfs/mlx5_roce/sys/kernel/config"),
            "pyverbs": False,
        },
    }
    for key_name, value in extra.items():
        if isinstance(value, dict) and isinstance(doc.get(key_name), dict):
            doc[key_name].update(value)
        else:
            doc[key_name] = value
    path = base / "collector.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


class CollectorProcess:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.doc = yaml.safe_load(config.read_text())
        self.status_file = Path(self.doc["status_file"])
        self.log = config.with_name("collector.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> CollectorProcess:
        if self.status_file.exists():
            self.status_file.unlink()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clockmesh.cli",
                    "collector",
                    "run",
                    "--config",
                    str(self.config),
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
        if wait:
            self.wait_status(lambda s: True)
        return self

    def status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def wait_status(self, pred: Any, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st and pred(st):
                return st
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"collector exited {self.proc.returncode}: {self.log.read_text()[-2000:]}"
                )
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for status; last: {self.status()}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
