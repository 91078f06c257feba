"""Netdev and RDMA port counters from sysfs, sampled as deltas (records.COUNTER).

Read under a configurable root (``counters.sysfs_root``; ``/`` in production,
a recorded tree in tests, the per-host fake tree in the lab):

* ``sys/class/net/<if>/{operstate,carrier_changes,carrier_up_count,carrier_down_count}``
  and every file in ``statistics/``  (source 0)
* ``sys/class/infiniband/<dev>/ports/<p>/{state,phys_state,rate,link_layer}``
  (source 1) and every file in ``counters/`` (source 1) and ``hw_counters/``
  (source 2). A device without ``counters/`` (soft-RoCE, some VFs) is fine.

Text attributes become numbers: ``operstate`` -> RFC 2863 code (IF_OPER_*, up
= 6), ``state`` "4: ACTIVE" -> 4, ``phys_state`` "5: LinkUp" -> 5, ``rate``
"100 Gb/sec (4X EDR)" -> ``rate_mbps`` 100000, ``link_layer`` -> ``link_layer_ethernet``
1/0. Unreadable files are skipped (and counted), never fatal.

Files stay open between samples and are read with ``pread`` at offset 0, which
makes sysfs (seq_file) regenerate the value: one system call per file and second
instead of open + read + close. All are reopened every ``REOPEN_S`` and a file is
reopened after a failed read, so a re-created device (sysfs answers ENODEV on
the old file) or a replaced file (the lab's fake tree) is picked up. At most
``MAX_OPEN`` stay open (fd limits); the rest are opened per sample.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from collector import records

SOURCE_NETDEV, SOURCE_RDMA, SOURCE_RDMA_HW = 0, 1, 2
OPERSTATE = {
    "unknown": 0,
    "notpresent": 1,
    "down": 2,
    "lowerlayerdown": 3,
    "testing": 4,
    "dormant": 5,
    "up": 6,
}
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
_LEADING_INT = re.compile(r"^\s*(\d+)")
REOPEN_S = 10.0
MAX_OPEN = 256
_O_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def parse_value(name: str, text: str) -> tuple[str, int] | None:
    """(counter name, value) for one sysfs attribute's text, or None if unparsable."""
    text = text.strip()
    if name == "operstate":
        return name, OPERSTATE.get(text, 0)
    if name == "rate":
        m = _RATE.match(text)
        return ("rate_mbps", round(float(m.group(1)) * 1000)) if m else None
    if name == "link_layer":
        return "link_layer_ethernet", int(text == "Ethernet")
    if name in ("state", "phys_state"):
        m = _LEADING_INT.match(text)
        return (name, int(m.group(1))) if m else None
    try:
        return name, int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(256).decode("ascii", "replace")
    except OSError:
        return None


@dataclass
class _Source:
    device: str
    port: int
    source: int
    files: list[tuple[str, str]] = field(default_factory=list)  # (name, path)


class SysfsCounters:
    """Samples a fixed list of sysfs files; :meth:`sample` returns COUNTER rows."""

    def __init__(self, root: str | Path, interfaces: list[str], rdma_devices: list[str]) -> None:
        self.root = Path(root)
        self.unreadable = 0
        self.sources: list[_Source] = []
        for ifname in interfaces:
            self._add_netdev(ifname)
        ib = self.root / "sys/class/infiniband"
        devices = rdma_devices or (sorted(os.listdir(ib)) if ib.is_dir() else [])
        for dev in devices:
            self._add_rdma(dev)
        renamed = {"rate": "rate_mbps", "link_layer": "link_layer_ethernet"}
        self._paths = [path for src in self.sources for _, path in src.files]
        self._attrs = [name for src in self.sources for name, _ in src.files]
        self._template = np.zeros(len(self._paths), records.COUNTER)
        i = 0
        for src in self.sources:
            for name, _ in src.files:
                row = self._template[i]
                row["device"] = src.device.encode()[:16]
                row["port"] = src.port
                row["source"] = src.source
                row["name"] = renamed.get(name, name).encode()[:40]
                i += 1
        self._prev: tuple[np.ndarray, np.ndarray] | None = None
        self._fds = [-1] * len(self._paths)  # open files (first MAX_OPEN), -1: closed
        self._opened = time.monotonic()

    def _add_netdev(self, ifname: str) -> None:
        base = self.root / "sys/class/net" / ifname
        src = _Source(ifname, 0, SOURCE_NETDEV)
        for name in ("operstate", "carrier_changes", "carrier_up_count", "carrier_down_count"):
            if (base / name).exists():
                src.files.append((name, str(base / name)))
        stats = base / "statistics"
        if stats.is_dir():
            src.files += [(n, str(stats / n)) for n in sorted(os.listdir(stats))]
        if src.files:
            self.sources.append(src)

    def _add_rdma(self, dev: str) -> None:
        ports = self.root / "sys/class/infiniband" / dev / "ports"
        if not ports.is_dir():
            return
        for port in sorted(os.listdir(ports), key=lambda p: int(p) if p.isdigit() else 0):
            if not port.isdigit():
                continue
            base = ports / port
            attrs = _Source(dev, int(port), SOURCE_RDMA)
            for name in ("state", "phys_state", "rate", "link_layer"):
                if (base / name).exists():
                    attrs.files.append((name, str(base / name)))
            for sub, source in (("counters", SOURCE_RDMA), ("hw_counters", SOURCE_RDMA_HW)):
                directory = base / sub
                if not directory.is_dir():
                    continue
                target = attrs if source == SOURCE_RDMA else _Source(dev, int(port), source)
                files = sorted(f for f in os.listdir(directory) if (directory / f).is_file())
                target.files += [(n, str(directory / n)) for n in files]
                if target is not attrs and target.files:
                    self.sources.append(target)
            if attrs.files:
                self.sources.insert(len(self.sources), attrs)

    def __len__(self) -> int:
        return len(self._paths)

    def sample(self, ts_ns: int, host: int) -> np.ndarray:
        """One COUNTER row per readable file; ``delta`` is 0 on the first sample.

        A negative delta means the counter was reset (driver reload, wrap).
        """
        n = len(self._paths)
        ok = np.zeros(n, bool)
        values = np.zeros(n, np.uint64)
        if time.monotonic() - self._opened > REOPEN_S:
            self.close()
            self._opened = time.monotonic()
        fds, pread = self._fds, os.pread
        for i in range(n):
            fd = fds[i]
            if fd < 0:
                if i >= MAX_OPEN:
                    text = _read(self._paths[i])
                else:
                    try:
                        fd = fds[i] = os.open(self._paths[i], _O_FLAGS)
                    except OSError:
                        text = None
            if fd >= 0:
                try:
                    text = pread(fd, 256, 0).decode("ascii", "replace")
                except OSError:  # e.g. ENODEV: the device went away; reopen next time
                    os.close(fd)
                    fds[i] = -1
                    text = None
            parsed = parse_value(self._attrs[i], text) if text is not None else None
            if parsed is None:
                self.unreadable += 1
                continue
            values[i] = parsed[1] & 0xFFFF_FFFF_FFFF_FFFF
            ok[i] = True
        rows = self._template.copy()
        rows["ts_ns"] = ts_ns
        rows["host"] = host
        rows["value"] = values
        if self._prev is not None:
            rows["delta"] = np.where(
                self._prev[1] & ok, values.astype(np.int64) - self._prev[0].astype(np.int64), 0
            )
        self._prev = (values, ok)
        return rows[ok]

    def close(self) -> None:
        """Close the files kept open between samples (the next sample reopens them)."""
        for i, fd in enumerate(self._fds):
            if fd >= 0:
                os.close(fd)
                self._fds[i] = -1
