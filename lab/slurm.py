"""A real one-node Slurm cluster for the drain remediation's tests (Debian's slurm-wlm).

munged, slurmctld and one slurmd run from a directory of their own, on free ports, each
daemonized with its pid file there; ``stop`` ends exactly those pids. Nodes ``h1-1``,
``h1-2``, ``h2-1``: h1-1 has the slurmd (a node in service), the others never answer;
h1-2 is drained by "someone else" (``bad GPU 3``) at start, so a drain remediation has a
drain that is not its own to leave alone.

    python -m lab.slurm start DIR    # prints DIR/slurm.conf once the controller answers
    python -m lab.slurm stop DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ("h1-1", "h1-2", "h2-1")
TOOLS = ("munged", "slurmctld", "slurmd", "scontrol")


class SlurmError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


class SlurmCluster:
    def __init__(self, base: str | Path) -> None:
        self.base = Path(base)
        self.conf = self.base / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _pidfiles(self) -> list[Path]:
        b = self.base
        return [b / "slurmd.pid", b / "slurmctld.pid", b / "munge" / "munged.pid"]

    def start(self) -> Path:
        if missing_tools():
            raise SlurmError(f"not installed: {', '.join(missing_tools())} (make deps)")
        b = self.base
        for d in ("state", "spool", "munge"):
            (b / d).mkdir(parents=True, exist_ok=True)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = b / "munge" / "munge.sock"
        self._run(["munged", f"--key-file={key}", f"--socket={sock}",
                   f"--pid-file={b / 'munge/munged.pid'}", f"--log-file={b / 'munge/log'}",
                   f"--seed-file={b / 'munge/seed'}", "--force"])  # fmt: skip
        self._wait(sock.exists, "munged")
        self.conf.write_text(
            "\n".join([
                "ClusterName=cmtest", "SlurmctldHost=localhost",
                f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
                "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
                f"StateSaveLocation={b / 'state'}", f"SlurmdSpoolDir={b / 'spool'}",
                f"SlurmctldPidFile={b / 'slurmctld.pid'}", f"SlurmdPidFile={b / 'slurmd.pid'}",
                "SlurmUser=root", "ReturnToService=2", "SchedulerType=sched/builtin",
                "SelectType=select/linear", "ProctrackType=proctrack/linuxproc",
                "MpiDefault=none",
                f"NodeName={','.join(NODES)} NodeHostname=localhost CPUs=1 State=UNKNOWN",
                "PartitionName=gpu Nodes=ALL Default=YES State=UP", "",
            ])
        )  # fmt: skip
        self._run(["slurmctld", "-c", "-i", "-L", str(b / "slurmctld.log")])
        self._wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld")
        self._run(["slurmd", "-N", NODES[0], "-L", str(b / "slurmd.log")])
        self._wait(lambda: "State=IDLE" in self.scontrol("show", "node", NODES[0]).stdout,
                   f"{NODES[0]} idle")  # fmt: skip
        self.scontrol("update", f"nodename={NODES[1]}", "state=drain", "reason=bad GPU 3")
        return self.conf

    def _run(self, argv: list[str]) -> None:
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise SlurmError(f"{argv[0]}: {(res.stderr or res.stdout).strip()[:300]}")

    def _wait(self, ready, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        raise SlurmError(f"{what} not ready in {timeout:.0f} s (logs in {self.base})")

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True)

    def node(self, name: str) -> tuple[bool, str]:
        """(drained, reason without its [user@time] stamp): what a drain changes. (The base
        state of nodes without their own slurmd moves between UNKNOWN and IDLE by itself.)"""
        out = self.scontrol("show", "node", "--oneliner", name).stdout
        fields = dict(f.split("=", 1) for f in out.split(" Reason=")[0].split() if "=" in f)
        reason = out.split(" Reason=", 1)[1].rsplit(" [", 1)[0].strip() if " Reason=" in out else ""
        return "DRAIN" in fields.get("State", "").split("+"), reason

    def stop(self) -> None:
        """End the daemons this directory started (by their pid files)."""
        for pidfile in self._pidfiles():
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.slurm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    cluster = SlurmCluster(args.dir)
    if args.action == "stop":
        cluster.stop()
        return
    try:
        print(cluster.start())
    except SlurmError as exc:
        cluster.stop()
        raise SystemExit(f"lab.slurm: {exc}") from None


if __name__ == "__main__":
    main()
