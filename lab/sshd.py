"""SSH for the lab: keys, known_hosts, and one sshd per node in a private mount namespace.

Every host (and the ops box) runs Debian's ``/usr/sbin/sshd`` inside its network
namespace, listening only on its mgmt address. It is started as::

    ip netns exec NS unshare --mount --propagation private sh -c \
        'mount --bind NODE/etc /etc/clockmesh; ...; exec /usr/sbin/sshd -D -e -f CONF'

so it (and everything started over SSH, e.g. the collector) sees that node's own
``/etc/clockmesh``, ``/opt/clockmesh``, ``/var/lib/clockmesh`` and ``/run/clockmesh``,
while ``/sys/class/net`` shows that namespace's interfaces (``ip netns exec`` remounts
/sys before ``unshare`` copies the mount table). Each ``exec`` keeps the PID, so the
Popen PID is the sshd PID.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
from pathlib import Path

# production path -> per-node directory name under <state>/nodes/<node>/
PRIVATE_MOUNTS: dict[str, str] = {
    "/etc/clockmesh": "etc",
    "/opt/clockmesh": "opt",
    "/var/lib/clockmesh": "var",
    "/run/clockmesh": "run",
}
SSHD = "/usr/sbin/sshd"


class SshError(RuntimeError):
    pass


def keygen(path: Path, comment: str) -> str:
    """Create an ed25519 key pair at ``path`` (if missing); return the public key line."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                check=True,
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            raise SshError("ssh-keygen not found: install openssh-client (make deps)") from None
        except subprocess.CalledProcessError as exc:
            raise SshError(f"ssh-keygen {path}: {exc.stderr.strip()}") from None
    path.chmod(0o600)
    return Path(f"{path}.pub").read_text().strip()


def sshd_config(listen: str, host_key: Path, authorized_keys: Path, pid_file: Path) -> str:
    return "\n".join(
        [
            "# written by clockmesh lab: one sshd per lab node",
            f"ListenAddress {listen}",
            "Port 22",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "MaxStartups 100:30:200",
            "MaxSessions 50",
            "AcceptEnv LANG LC_*",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def launch_command(namespace: str, node_dir: Path, config: Path) -> list[str]:
    """argv that starts sshd in ``namespace`` with the node's private bind mounts."""
    binds = [
        f"mount --bind {shlex.quote(str(node_dir / sub))} {target}"
        for target, sub in PRIVATE_MOUNTS.items()
    ]
    script = " && ".join([*binds, f"exec {SSHD} -D -e -f {shlex.quote(str(config))}"])
    return [
        "ip",
        "netns",
        "exec",
        namespace,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
    ]


def wait_listening(addresses: list[str], timeout: float = 20.0) -> list[str]:
    """Wait until every address accepts TCP on port 22; return those that never did."""
    pending = set(addresses)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for addr in sorted(pending):
            try:
                with socket.create_connection((addr, 22), timeout=0.3) as sock:
                    sock.settimeout(1.0)
                    if sock.recv(4).startswith(b"SSH"):
                        pending.discard(addr)
            except OSError:
                pass
        if pending:
            time.sleep(0.1)
    return sorted(pending)


def port_open(address: str, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout):
            return True
    except OSError:
        return False
