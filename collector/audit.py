"""Active audit of one host before a long job: ``clockmesh collector audit --json``.

Every check ends ``pass``, ``fail`` or ``skipped`` with a reason — skipped, never a fake
pass, where the hardware or tool is absent. Categories, as operators sort them:

- ``configuration``: kernel, memory, RDMA kernel modules, PCIe link of each RDMA device,
  the clockmesh collector running;
- ``frontend``: the ops box answers (``/healthz``) over the management network;
- ``backend``: the backend interface up with its inventory address and MTU, a route to
  the fabric through it, RDMA devices initialised and ports ACTIVE, the GID index jobs
  will use is RoCE v2 (``NCCL_IB_GID_INDEX`` in nccl.conf; when unset, as the NCCL
  installed on the host picks it: 2.21 and later select a GID of
  ``NCCL_IB_ROCE_VERSION_NUM`` themselves, older ones take index 0; no NCCL found: skipped,
  the index depends on the version a job brings),
  full-mesh connectivity to every peer's backend address with RTT against a threshold
  (ICMP echo on a raw socket: root, as the playbook runs it);
- ``collective``: nccl-tests' ``all_reduce_perf`` when installed.

Standard library only: it runs from the collector's venv on every fleet host.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import struct
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from collector import job_nccl
from collector.rdma_config import parse_nccl_conf

V1, V2 = "IB/RoCE v1", "RoCE v2"
NCCL_DEFAULT_INDEX = 0  # NCCL_IB_GID_INDEX's default before NCCL 2.21
# Where a host's NCCL is installed (distribution packages, NVIDIA's, CUDA's, by hand).
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
            "/usr/lib", "/usr/local/lib", "/usr/local/cuda/lib64", "/opt/nccl/lib")  # fmt: skip
RDMA_MODULES = ("ib_core", "ib_uverbs", "rdma_ucm")


@dataclass
class Check:
    category: str
    check: str
    status: str  # pass, fail, skipped
    reason: str
    value: str = ""


@dataclass
class AuditArgs:
    backend_interface: str = "bk0"
    backend_address: str = ""
    peers: dict[str, str] = field(default_factory=dict)  # name -> backend address
    ingest_url: str = ""
    sysfs_root: str = "/"
    nccl_conf: str = "/etc/nccl.conf"
    status_file: str = "/run/clockmesh/collector.status.json"
    min_mtu: int = 1500
    min_mem_gib: float = 0.0
    max_rtt_ms: float = 1.0
    lab: bool = False  # the sysfs root is the lab's fake RDMA tree
    lib_dirs: tuple[str, ...] = LIB_DIRS  # where to look for libnccl.so.X.Y.Z


def installed_nccl(lib_dirs: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """Versions of the libnccl.so.X.Y.Z files in ``lib_dirs`` (newest first)."""
    found = set()
    for d in lib_dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if n.startswith("libnccl.so."):
                v = job_nccl.parse_version(n[len("libnccl.so.") :])
                if v is not None and n.count(".") == 4:
                    found.add(v)
    return sorted(found, reverse=True)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def configuration(a: AuditArgs) -> list[Check]:
    out = []
    release = platform.release()
    major_minor = tuple(int(x) for x in release.split("-")[0].split(".")[:2] if x.isdigit())
    out.append(Check("configuration", "kernel",
                     "pass" if major_minor >= (5, 4) else "fail",
                     "5.4 or later (RoCE v2 GID attributes in sysfs)", release))  # fmt: skip
    mem_kib = 0
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    gib = mem_kib / 2**20
    out.append(Check("configuration", "memory", "pass" if gib >= a.min_mem_gib else "fail",
                     f"at least {a.min_mem_gib:g} GiB", f"{gib:.1f} GiB"))  # fmt: skip
    ib = Path(a.sysfs_root) / "sys/class/infiniband"
    devices = sorted(os.listdir(ib)) if ib.is_dir() else []
    if a.lab:
        out.append(Check("configuration", "rdma_modules", "skipped",
                         "lab: fake RDMA tree, no RDMA kernel modules to check"))  # fmt: skip
    elif not devices:
        out.append(Check("configuration", "rdma_modules", "skipped", "no RDMA devices"))
    else:
        loaded = {ln.split()[0] for ln in (_read(Path("/proc/modules")) or "").splitlines() if ln}
        missing = [m for m in RDMA_MODULES if m not in loaded]
        out.append(Check("configuration", "rdma_modules", "fail" if missing else "pass",
                         f"missing: {', '.join(missing)}" if missing else "loaded",
                         ", ".join(m for m in RDMA_MODULES if m in loaded)))  # fmt: skip
    for dev in devices:
        pci = ib / dev / "device"
        cur, top = _read(pci / "current_link_width"), _read(pci / "max_link_width")
        speed, top_speed = _read(pci / "current_link_speed"), _read(pci / "max_link_speed")
        if cur is None or top is None:
            out.append(Check("configuration", f"pcie {dev}", "skipped",
                             "no PCIe link attributes (virtual or lab device)"))  # fmt: skip
            continue
        ok = cur == top and speed == top_speed
        out.append(Check("configuration", f"pcie {dev}", "pass" if ok else "fail",
                         "link at its maximum width and speed" if ok else "link degraded",
                         f"x{cur} {speed} (max x{top} {top_speed})"))  # fmt: skip
    status = _read(Path(a.status_file))
    if status is None:
        out.append(Check("configuration", "collector", "fail",
                         f"no status file {a.status_file}: the collector is not running"))  # fmt: skip
    else:
        try:
            age = time.time() - float(json.loads(status).get("updated_unix", 0))
        except (ValueError, TypeError, AttributeError):
            age = float("inf")
        out.append(Check("configuration", "collector", "pass" if age < 30 else "fail",
                         "status updated in the last 30 s", f"{age:.0f} s ago"))  # fmt: skip
    return out


def frontend(a: AuditArgs) -> list[Check]:
    if not a.ingest_url:
        return [Check("frontend", "ops_box", "skipped", "no ingest URL given")]
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(a.ingest_url.rstrip("/") + "/healthz", timeout=3) as r:
            code = r.status
    except OSError as exc:
        return [Check("frontend", "ops_box", "fail", f"{a.ingest_url}: {exc}")]
    ms = (time.monotonic() - t0) * 1e3
    return [Check("frontend", "ops_box", "pass" if code == 200 else "fail",
                  f"{a.ingest_url}/healthz answers", f"HTTP {code} in {ms:.1f} ms")]  # fmt: skip


def _gid_types(port: Path) -> dict[int, str]:
    types = port / "gid_attrs" / "types"
    out = {}
    if types.is_dir():
        for n in os.listdir(types):
            t = _read(types / n)
            if n.isdigit() and t:
                out[int(n)] = t
    return out


def backend(a: AuditArgs) -> list[Check]:
    out = []
    net = Path("/sys/class/net") / a.backend_interface
    oper = _read(net / "operstate")
    carrier = _read(net / "carrier")
    if oper is None:
        out.append(
            Check("backend", "interface", "fail", f"{a.backend_interface}: no such interface")
        )
    else:
        up = oper == "up" and carrier == "1"
        out.append(Check("backend", "interface", "pass" if up else "fail",
                         f"{a.backend_interface} up with carrier" if up
                         else f"{a.backend_interface} is {oper}, carrier {carrier or 'unknown'}",
                         oper))  # fmt: skip
        mtu = int(_read(net / "mtu") or 0)
        out.append(Check("backend", "mtu", "pass" if mtu >= a.min_mtu else "fail",
                         f"at least {a.min_mtu}", str(mtu)))  # fmt: skip
    addrs = _addresses(a.backend_interface)
    if a.backend_address:
        ok = a.backend_address in addrs
        out.append(Check("backend", "topology", "pass" if ok else "fail",
                         "the inventory's backend address is on the backend interface" if ok
                         else f"inventory says {a.backend_address}, the interface has "
                         f"{', '.join(addrs) or 'none'}", ", ".join(addrs)))  # fmt: skip
    out += _rdma(a)
    out += _mesh(a)
    return out


def _addresses(ifname: str) -> list[str]:
    import fcntl

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", ifname.encode()[:15])
            raw = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
            return [socket.inet_ntoa(raw[20:24])]
    except OSError:
        return []


def _rdma(a: AuditArgs) -> list[Check]:
    ib = Path(a.sysfs_root) / "sys/class/infiniband"
    devices = sorted(os.listdir(ib)) if ib.is_dir() else []
    if not devices:
        return [Check("backend", "rdma_devices", "skipped",
                      "no RDMA devices on this host (UDP probing only)")]  # fmt: skip
    note = " (lab: fake RDMA tree)" if a.lab else ""
    out = [Check("backend", "rdma_devices", "pass", f"initialised{note}", ", ".join(devices))]
    index_text = _read(Path(a.nccl_conf))
    index = parse_nccl_conf(index_text) if index_text else None
    versions = [] if index is not None else installed_nccl(a.lib_dirs)
    for dev in devices:
        ports = ib / dev / "ports"
        for p in sorted(os.listdir(ports)) if ports.is_dir() else []:
            port = ports / p
            state = _read(port / "state") or "unknown"
            out.append(Check("backend", f"port {dev}/{p}", "pass" if "ACTIVE" in state else "fail",
                             "ACTIVE", state))  # fmt: skip
            types = _gid_types(port)
            v2 = sorted(n for n, t in types.items() if t == V2)
            here = f"RoCE v2 indices here: {', '.join(map(str, v2)) or 'none'}"
            if index is not None:
                uses = [(index, f"NCCL_IB_GID_INDEX={index} in {a.nccl_conf}")]
            elif not versions:
                out.append(Check("backend", f"gid {dev}/{p}", "skipped",
                                 f"NCCL_IB_GID_INDEX unset in {a.nccl_conf} and no "
                                 f"libnccl.so.X.Y.Z in {', '.join(a.lib_dirs)}: the index depends "
                                 "on the NCCL version a job brings (2.21 and later select a RoCE "
                                 f"v2 GID themselves, older ones take index 0: "
                                 f"{types.get(0, 'no such GID')} here); {here}"))  # fmt: skip
                continue
            else:
                table = job_nccl.port_gids(a.sysfs_root, dev, int(p) if p.isdigit() else 1)
                uses = []
                for v in versions:
                    name = f"NCCL {job_nccl.version_text(v)}"
                    if v[:2] >= job_nccl.AUTO_GID_SINCE:
                        i = job_nccl.nccl_auto_gid(table, job_nccl.DEFAULT_ROCE_VERSION, 4, None)
                        uses.append((i, f"NCCL_IB_GID_INDEX unset in {a.nccl_conf}: {name} "
                                        f"selects index {i} by default"))  # fmt: skip
                    else:
                        uses.append((NCCL_DEFAULT_INDEX, f"NCCL_IB_GID_INDEX unset in "
                                     f"{a.nccl_conf}: {name} (before 2.21) uses index "
                                     f"{NCCL_DEFAULT_INDEX}"))  # fmt: skip
            bad = [(i, how) for i, how in uses if types.get(i) != V2]
            if not bad:
                out.append(Check("backend", f"gid {dev}/{p}", "pass",
                                 "; ".join(f"{how}: RoCE v2" for _, how in uses),
                                 ", ".join(str(i) for i, _ in uses)))  # fmt: skip
            else:
                out.append(Check("backend", f"gid {dev}/{p}", "fail",
                                 "; ".join(f"{how}: {types.get(i) or 'no such GID'}, not RoCE v2"
                                           for i, how in bad) + f"; {here}",
                                 ", ".join(str(i) for i, _ in bad)))  # fmt: skip
    return out


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def ping_all(peers: dict[str, str], count: int = 3, timeout_s: float = 1.0) -> dict[str, float]:
    """ICMP echo to every peer (raw socket), ``count`` rounds: name -> best RTT in ms
    (inf: no answer). Each round waits for its answers (up to ``timeout_s``) before the
    next, so an RTT is never inflated by the sends that follow it."""
    import select

    ident = os.getpid() & 0xFFFF
    best = dict.fromkeys(peers, float("inf"))
    by_addr = {addr: name for name, addr in peers.items()}
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        for seq in range(count):
            sent: dict[str, float] = {}
            for addr in by_addr:
                hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
                pkt = struct.pack("!BBHHH", 8, 0, _checksum(hdr), ident, seq)
                sent[addr] = time.monotonic()
                with contextlib.suppress(OSError):  # unreachable: shows as no answer
                    s.sendto(pkt, (addr, 0))
            waiting = set(sent)
            deadline = time.monotonic() + timeout_s
            while waiting and (left := deadline - time.monotonic()) > 0:
                if not select.select([s], [], [], left)[0]:
                    break
                data, (src, _) = s.recvfrom(2048)
                now = time.monotonic()
                ihl = (data[0] & 0x0F) * 4
                typ, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
                if typ == 0 and rid == ident and rseq == seq and src in waiting:
                    waiting.discard(src)
                    name = by_addr[src]
                    best[name] = min(best[name], (now - sent[src]) * 1e3)
    return best


def _mesh(a: AuditArgs) -> list[Check]:
    if not a.peers:
        return [Check("backend", "mesh", "skipped", "no peers given")]
    try:
        rtts = ping_all(a.peers)
    except PermissionError:
        return [Check("backend", "mesh", "skipped", "ICMP needs root (raw socket)")]
    dead = sorted(n for n, r in rtts.items() if r == float("inf"))
    slow = sorted(f"{n} {r:.2f} ms" for n, r in rtts.items() if a.max_rtt_ms < r < float("inf"))
    alive = [r for r in rtts.values() if r < float("inf")]
    worst = f"worst {max(alive):.3f} ms" if alive else "no answers"
    if dead or slow:
        parts = ([f"no answer from {', '.join(dead)}"] if dead else []) + (
            [f"over {a.max_rtt_ms:g} ms: {', '.join(slow)}"] if slow else []
        )
        return [Check("backend", "mesh", "fail", "; ".join(parts),
                      f"{len(alive)}/{len(rtts)} peers, {worst}")]  # fmt: skip
    return [Check("backend", "mesh", "pass", f"every peer answers within {a.max_rtt_ms:g} ms",
                  f"{len(alive)}/{len(rtts)} peers, {worst}")]  # fmt: skip


def collective(a: AuditArgs) -> list[Check]:
    if shutil.which("all_reduce_perf") is None:
        return [Check("collective", "nccl_tests", "skipped", "nccl-tests is not installed")]
    return [Check("collective", "nccl_tests", "skipped",
                  "nccl-tests found; a multi-host run needs MPI and is not automated yet")]  # fmt: skip


def run(a: AuditArgs) -> list[Check]:
    return [*configuration(a), *frontend(a), *backend(a), *collective(a)]


def as_json(checks: list[Check]) -> str:
    return json.dumps([asdict(c) for c in checks])
