"""How an RDMA job's NCCL (or UCX) will use the fabric, learned from the process itself.

For every process holding an RDMA device open the collector works out what its library
does, the way that library does it (docs/detect.md, "RoCE v1 jobs" and "What a job
survives"):

* **Version.** The ``libnccl.so.X.Y.Z`` the process maps (``/proc/PID/maps``); where the
  mapped file's name carries no version (pip wheels ship ``libnccl.so.2``), the library's
  own ``NCCL version X.Y.Z`` string; else a container's ``NCCL_VERSION`` environment
  variable. A process mapping UCX's ``libuct_ib`` and no NCCL is a UCX job.
* **Settings**, read where NCCL reads them (``src/misc/param.cc``): the process
  environment first; then ``NCCL_CONF_FILE`` (NCCL 2.23 and later; it *replaces*
  ``~/.nccl.conf``), else the job user's ``~/.nccl.conf`` (the home directory of the
  process's real uid in its own ``/etc/passwd``); then ``/etc/nccl.conf``. A file sets
  a variable only where nothing before it did (``setenv(..., 0)``), so within a file the
  first assignment counts. Files are read under the process's root (``/proc/PID/root``)
  when it runs in another mount namespace root (a container).
* **GID index** as that version picks it: ``NCCL_IB_GID_INDEX`` when set; else NCCL 2.21
  and later select one themselves (``NCCL_IB_ROCE_VERSION_NUM``, default 2,
  ``NCCL_IB_ADDR_FAMILY``, default ``AF_INET``, ``NCCL_IB_ADDR_RANGE``) over the port's
  whole GID table, exactly as ``ncclIbGetGidIndex`` walks it; before 2.21 index 0. UCX:
  ``UCX_IB_GID_INDEX``, else its own choice (RoCE v2 over IPv4, then v2 over IPv6, v1 over
  IPv4, v1 over IPv6; the first entry of the table that matches).
* **What the job survives**: a queue pair gives up after about ``4.096 µs ×
  2^NCCL_IB_TIMEOUT × (NCCL_IB_RETRY_CNT + 1)``. Defaults by version (NCCL's
  ``NCCL_PARAM`` lines): timeout 14 before 2.14, 18 from 2.14, 20 from 2.23; retry count 7
  in every release.

Standard library only (the collector's rule); the ops box imports the formulas from here.

Over 500 lines: NCCL's and UCX's own choices (version, settings, GID, timeouts), one copy.
"""

from __future__ import annotations

import ipaddress
import mmap
import os
import re
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

QP_UNIT_S = 4.096e-6  # the IB local ACK timeout unit: 4.096 µs × 2^timeout
AUTO_GID_SINCE = (2, 21)  # NCCL_IB_GID_INDEX default -1: the library selects a GID
CONF_FILE_SINCE = (2, 23)  # NCCL_CONF_FILE
DEFAULT_RETRY_CNT = 7  # NCCL_IB_RETRY_CNT, every release
DEFAULT_ROCE_VERSION = 2  # NCCL_IB_ROCE_VERSION_NUM (2.21 and later)
# NCCL_IB_TIMEOUT's default: (first version, value), newest first.
TIMEOUT_DEFAULTS: tuple[tuple[tuple[int, int], int], ...] = (((2, 23), 20), ((2, 14), 18),
                                                               ((0, 0), 14))  # fmt: skip
SETTINGS = (
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
)

_MAPPED_NCCL = re.compile(r"libnccl\.so(?:\.(\d+)\.(\d+)\.(\d+))?")
_VERSION_STRING = re.compile(rb"NCCL version (\d+)\.(\d+)\.(\d+)")
_CONTAINER_VERSION = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)")
_UCX = re.compile(r"libuct_ib[.-]")
_STRING_SCAN_LIMIT = 1 << 30  # never read more than this of a library for its version


class From(IntEnum):
    """Where a setting came from (``job_nccl`` ``*_from`` columns)."""

    DEFAULT = 0  # not set anywhere: the library's default
    ENVIRON = 1
    CONF_FILE = 2  # NCCL_CONF_FILE
    USER_CONF = 3  # the job user's ~/.nccl.conf
    ETC_CONF = 4  # /etc/nccl.conf (the collector's rdma.nccl_conf)


FROM_WORDS = {
    From.DEFAULT: "default",
    From.ENVIRON: "environ",
    From.CONF_FILE: "NCCL_CONF_FILE",
    From.USER_CONF: "~/.nccl.conf",
    From.ETC_CONF: "nccl.conf",
}


class VersionFrom(IntEnum):
    UNKNOWN = 0
    MAPS = 1  # the mapped file's name, libnccl.so.X.Y.Z
    LIBRARY = 2  # the mapped library's own "NCCL version X.Y.Z" string
    CONTAINER_ENV = 3  # NCCL_VERSION in the process environment


VERSION_FROM_WORDS = {
    VersionFrom.UNKNOWN: "unknown",
    VersionFrom.MAPS: "libnccl.so in /proc/PID/maps",
    VersionFrom.LIBRARY: "the library's version string",
    VersionFrom.CONTAINER_ENV: "the container's NCCL_VERSION",
}


class GidRule(IntEnum):
    """How the GID index was resolved (``job_nccl.gid_rule``)."""

    UNKNOWN = 0  # not set, and the library's version (hence its rule) is unknown
    EXPLICIT = 1  # NCCL_IB_GID_INDEX / UCX_IB_GID_INDEX
    AUTO = 2  # NCCL >= 2.21 selected it
    INDEX0 = 3  # NCCL < 2.21: index 0
    UCX_AUTO = 4  # UCX selected it
    NO_TABLE = 5  # the library would select, but the port's GID table could not be read


def qp_limit_s(timeout: int, retry_cnt: int) -> float:
    """Seconds a queue pair keeps retrying an unanswered packet before it gives up:
    4.096 µs × 2^timeout per try, retry_cnt retries after the first (timeout 0: never)."""
    if timeout <= 0:
        return float("inf")
    return QP_UNIT_S * (1 << min(timeout, 31)) * (max(retry_cnt, 0) + 1)


def default_timeout(version: tuple[int, int, int] | None) -> int | None:
    """NCCL_IB_TIMEOUT's default in this NCCL version (None: version unknown)."""
    if version is None:
        return None
    for since, value in TIMEOUT_DEFAULTS:
        if version[:2] >= since:
            return value
    return TIMEOUT_DEFAULTS[-1][1]


def version_text(version: tuple[int, int, int] | None) -> str:
    return "" if version is None else ".".join(map(str, version))


def parse_version(text: str) -> tuple[int, int, int] | None:
    m = _CONTAINER_VERSION.match(text or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def strtoll(text: str) -> int | None:
    """An integer setting as NCCL reads it (``strtoll(str, NULL, 0)``): leading blanks, a
    sign, 0x/0 prefixes, digits up to the first other character; no digits at all read as
    0. None for an empty value (NCCL then keeps its default)."""
    if not text:
        return None
    s = text.lstrip(" \t\n\v\f\r")
    sign = 1
    if s[:1] and s[0] in "+-":
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    base = 10
    if s[:2].lower() == "0x" and len(s) > 2 and s[2] in "0123456789abcdefABCDEF":
        base, s = 16, s[2:]
    elif s[:1] == "0":
        base = 8
    digits = "0123456789abcdef"[:base]
    n = 0
    for ch in s:
        d = digits.find(ch.lower())
        if d < 0:
            break
        n = n * base + d
    return sign * n


def conf_assignments(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as NCCL's ``setEnvFile`` reads them: lines starting with ``#``
    skipped, the key up to the first ``=`` (not trimmed), the value the rest of the line;
    the first assignment of a key counts (``setenv(..., 0)``)."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        if line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out.setdefault(key[:1023], value[:1023])
    return out


def _read_text(path: str | Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


@dataclass
class ProcessView:
    """What the collector can read of one process (a real /proc or a recorded tree)."""

    proc: str
    pid: int
    env: dict[str, str]
    etc_conf: str  # the host's nccl.conf path (the collector's rdma.nccl_conf)

    @property
    def base(self) -> str:
        return f"{self.proc}/{self.pid}"

    def root(self) -> str:
        """Prefix for paths as the process sees them: "" in the collector's own root and
        mount namespace, ``/proc/PID/root`` in a chroot or a container (another mount
        namespace), or a recorded tree's ``root`` directory."""
        link = f"{self.base}/root"
        try:
            target = os.readlink(link)
        except OSError:
            return link if os.path.isdir(link) else ""
        if target != "/":
            return link  # chroot
        try:  # a container's root also reads "/": its own mount namespace tells it apart
            same = os.readlink(f"{self.base}/ns/mnt") == os.readlink(f"{self.proc}/self/ns/mnt")
        except OSError:
            return ""
        return "" if same else link

    def maps(self) -> list[str]:
        """Paths of the files the process maps (each once, in order)."""
        text = _read_text(f"{self.base}/maps") or ""
        seen: dict[str, None] = {}
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                seen.setdefault(parts[5].removesuffix(" (deleted)"), None)
        return list(seen)

    def home(self) -> str | None:
        """The home directory of the process's real uid, from its own /etc/passwd."""
        uid = None
        for line in (_read_text(f"{self.base}/status") or "").splitlines():
            if line.startswith("Uid:"):
                fields = line.split()
                uid = fields[1] if len(fields) > 1 else None
                break
        if uid is None:
            return None
        for line in (_read_text(f"{self.root()}/etc/passwd") or "").splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == uid:
                return fields[5]
        return None


_version_cache: dict[tuple[int, int, int], tuple[int, int, int] | None] = {}


def library_version(path: str) -> tuple[int, int, int] | None:
    """The ``NCCL version X.Y.Z`` string inside a library file (cached per file)."""
    try:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if key in _version_cache:
            return _version_cache[key]
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            m = _VERSION_STRING.search(mm, 0, min(len(mm), _STRING_SCAN_LIMIT))
            found = (int(m[1]), int(m[2]), int(m[3])) if m else None
    except (OSError, ValueError):
        return None
    if len(_version_cache) > 256:
        _version_cache.clear()
    _version_cache[key] = found
    return found


@dataclass
class Setting:
    value: str | None = None  # None: not set anywhere
    source: From = From.DEFAULT


@dataclass
class JobLibrary:
    """A process's library, version and settings (before the GID table is consulted)."""

    library: str = ""  # "nccl", "ucx", "" (neither found)
    version: tuple[int, int, int] | None = None
    version_from: VersionFrom = VersionFrom.UNKNOWN
    settings: dict[str, Setting] = field(default_factory=dict)

    def get(self, name: str) -> Setting:
        return self.settings.get(name, Setting())

    def int_setting(self, name: str) -> tuple[int | None, From]:
        s = self.get(name)
        return (strtoll(s.value) if s.value is not None else None), s.source


def read_settings(
    view: ProcessView, version: tuple[int, int, int] | None, names: tuple[str, ...] = SETTINGS
) -> dict[str, Setting]:
    """Each of ``names`` as NCCL of ``version`` would see it (environment, then its files)."""
    out = {n: Setting(view.env[n], From.ENVIRON) for n in names if n in view.env}
    root = view.root()
    files: list[tuple[From, str]] = []
    conf_file = view.env.get("NCCL_CONF_FILE", "")
    # An unknown version is read as current NCCL reads (it only matters for an explicit index).
    if conf_file and (version is None or version[:2] >= CONF_FILE_SINCE):
        # relative to the process's working directory, as fopen() takes it
        where = root + conf_file if conf_file.startswith("/") else f"{view.base}/cwd/{conf_file}"
        files.append((From.CONF_FILE, where))
    else:
        home = view.home()
        if home:
            files.append((From.USER_CONF, f"{root}{home}/.nccl.conf"))
    files.append((From.ETC_CONF, root + view.etc_conf if root else view.etc_conf))
    for source, path in files:
        text = _read_text(path) if path else None
        if text is None:
            continue
        for key, value in conf_assignments(text).items():
            if key in names and key not in out:
                out[key] = Setting(value, source)
    return out


def job_library(view: ProcessView) -> JobLibrary:
    """Which library the process uses, its version and where it was learned, its settings."""
    lib = JobLibrary()
    maps = view.maps()
    nccl = [p for p in maps if _MAPPED_NCCL.search(p.rsplit("/", 1)[-1])]
    if nccl:
        lib.library = "nccl"
        for path in nccl:
            m = _MAPPED_NCCL.search(path.rsplit("/", 1)[-1])
            if m and m[1]:
                lib.version, lib.version_from = (int(m[1]), int(m[2]), int(m[3])), VersionFrom.MAPS
                break
        else:
            for path in nccl:
                found = library_version(view.root() + path)
                if found:
                    lib.version, lib.version_from = found, VersionFrom.LIBRARY
                    break
    elif any(_UCX.search(p.rsplit("/", 1)[-1]) for p in maps):
        lib.library = "ucx"
    if lib.library != "ucx" and lib.version is None:
        found = parse_version(view.env.get("NCCL_VERSION", ""))
        if found:
            lib.library = "nccl"
            lib.version, lib.version_from = found, VersionFrom.CONTAINER_ENV
    lib.settings = read_settings(view, lib.version)
    if "UCX_IB_GID_INDEX" in view.env:
        lib.settings["UCX_IB_GID_INDEX"] = Setting(view.env["UCX_IB_GID_INDEX"], From.ENVIRON)
    return lib


# ---- GID selection ---------------------------------------------------------------------
@dataclass
class GidEntry:
    raw: bytes  # 16 bytes (all zero for an unpopulated entry)
    roce_version: int  # 1, 2, or 0 when the type cannot be read


def port_gids(sysfs_root: str | Path, device: str, port: int) -> list[GidEntry]:
    """The port's whole GID table (``gids/N`` and ``gid_attrs/types/N``), zero entries
    included: NCCL walks every index up to the table length."""
    base = Path(sysfs_root) / "sys/class/infiniband" / device / "ports" / str(port)
    try:
        names = [n for n in os.listdir(base / "gids") if n.isdigit()]
    except OSError:
        return []
    n = max((int(x) for x in names), default=-1) + 1
    out = []
    for i in range(n):
        text = _read_text(base / "gids" / str(i)) or ""
        try:
            raw = ipaddress.IPv6Address(text.strip()).packed
        except ValueError:
            raw = bytes(16)
        kind = (_read_text(base / "gid_attrs" / "types" / str(i)) or "").strip()
        ver = 1 if kind.startswith(("IB/RoCE v1", "RoCE v1")) else 2 if kind.startswith(
            "RoCE v2") else 0  # fmt: skip
        out.append(GidEntry(raw, ver))
    return out


def first_port(sysfs_root: str | Path, device: str) -> int:
    base = Path(sysfs_root) / "sys/class/infiniband" / device / "ports"
    try:
        ports = sorted(int(p) for p in os.listdir(base) if p.isdigit())
    except OSError:
        return 1
    return ports[0] if ports else 1


def _family(raw: bytes) -> int:
    v4_mapped = raw[:10] == bytes(10) and raw[10:12] == b"\xff\xff"
    v4_multicast = raw[:4] == b"\xff\x0e\x00\x00" and raw[4:10] == bytes(6) and raw[10:12] == (
        b"\xff\xff")  # fmt: skip
    return 4 if v4_mapped or v4_multicast else 6


def _configured(raw: bytes) -> bool:
    trailer = raw[4:] != bytes(12)
    return not (raw == bytes(16) or (raw[:4] == b"\xfe\x80\x00\x00" and not trailer))


def _link_local(raw: bytes) -> bool:
    return raw[:4] == b"\xfe\x80\x00\x00" and raw[4:8] == bytes(4)


def _valid(raw: bytes) -> bool:
    return _configured(raw) and not _link_local(raw)


def addr_range(value: str | None, family: int) -> tuple[bytes, int] | None:
    """NCCL_IB_ADDR_RANGE (``address/prefix``) as NCCL parses it for the family; None:
    every GID matches (unset, or ignored by NCCL as invalid)."""
    if not value or "/" not in value:
        return None
    addr, _, mask = value.partition("/")
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    if (ip.version == 4) != (family == 4):
        return None
    bits = strtoll(mask.split()[0] if mask.split() else "") or 0
    if bits > (32 if family == 4 else 128):
        return None
    return ip.packed, bits


def _match(family: int, prefix: tuple[bytes, int] | None, raw: bytes) -> bool:
    if prefix is None or prefix[1] <= 0:
        return True
    base, bits = prefix
    addr = raw[12:16] if family == 4 else raw
    whole, rest = divmod(bits, 8)
    if base[:whole] != addr[:whole]:
        return False
    if rest:
        mask = (0xFF << (8 - rest)) & 0xFF
        return (base[whole] & mask) == (addr[whole] & mask)
    return True


def nccl_auto_gid(
    table: list[GidEntry], roce_version: int, family: int, prefix: tuple[bytes, int] | None
) -> int:
    """The index NCCL >= 2.21 selects (``ncclIbGetGidIndex`` with NCCL_IB_GID_INDEX unset):
    start at 0, walk every later index, take a candidate of the wanted family (and range)
    whose family differs from the current one, or a valid one of the wanted RoCE version
    where the current one's version differs or the current GID is not valid."""
    index = 0
    for cand in range(1, len(table)):
        cur, new = table[index], table[cand]
        cur_fam, new_fam = _family(cur.raw), _family(new.raw)
        matches = _match(family, prefix, new.raw)
        if new_fam != cur_fam and new_fam == family and matches:
            index = cand
            continue
        if new_fam != family or not _valid(new.raw) or not matches:
            continue
        if (cur.roce_version != new.roce_version or not _valid(cur.raw)) and (
            new.roce_version == roce_version
        ):
            index = cand
    return index


def ucx_auto_gid(table: list[GidEntry]) -> int:
    """UCX's own choice: the first entry that is RoCE v2 over IPv4, else v2 over IPv6, v1
    over IPv4, v1 over IPv6 (``uct_ib_device_select_gid``); -1 when none."""
    for version, family in ((2, 4), (2, 6), (1, 4), (1, 6)):
        for i, e in enumerate(table):
            if e.raw != bytes(16) and e.roce_version == version and _family(e.raw) == family:
                return i
    return -1


@dataclass
class Resolved:
    """Everything the ``job_nccl`` row carries about one process."""

    lib: JobLibrary
    port: int = 1
    gid_index: int = -1
    gid_rule: GidRule = GidRule.UNKNOWN
    gid_from: From = From.DEFAULT
    roce_version: int = 0
    roce_version_from: From = From.DEFAULT
    addr_family: int = 0
    addr_family_from: From = From.DEFAULT
    addr_range: str = ""
    addr_range_from: From = From.DEFAULT
    ib_timeout: int = -1
    ib_timeout_from: From = From.DEFAULT
    ib_retry_cnt: int = -1
    ib_retry_cnt_from: From = From.DEFAULT


def resolve(lib: JobLibrary, table: list[GidEntry] | None, port: int = 1) -> Resolved:
    """The GID index and QP settings the process's library will use."""
    r = Resolved(lib, port)
    v = lib.version
    if lib.library == "ucx":
        idx = lib.get("UCX_IB_GID_INDEX")
        n = strtoll(idx.value) if idx.value and idx.value.strip() != "auto" else None
        if n is not None:
            r.gid_index, r.gid_rule, r.gid_from = n, GidRule.EXPLICIT, idx.source
        elif table:
            r.gid_index, r.gid_rule = ucx_auto_gid(table), GidRule.UCX_AUTO
        else:
            r.gid_rule = GidRule.NO_TABLE
        return r
    explicit, src = lib.int_setting("NCCL_IB_GID_INDEX")
    if lib.library == "" and explicit is None:
        ucx = lib.get("UCX_IB_GID_INDEX")  # neither library seen: an explicit UCX index
        n = strtoll(ucx.value) if ucx.value and ucx.value.strip() != "auto" else None
        if n is not None:
            r.gid_index, r.gid_rule, r.gid_from = n, GidRule.EXPLICIT, ucx.source
    if explicit is not None and explicit >= 0:
        r.gid_index, r.gid_rule, r.gid_from = explicit, GidRule.EXPLICIT, src
    elif r.gid_rule == GidRule.EXPLICIT:
        pass
    elif v is None:
        r.gid_rule = GidRule.UNKNOWN
    elif v[:2] >= AUTO_GID_SINCE:
        rv, r.roce_version_from = lib.int_setting("NCCL_IB_ROCE_VERSION_NUM")
        r.roce_version = DEFAULT_ROCE_VERSION if rv is None else rv
        fam = lib.get("NCCL_IB_ADDR_FAMILY")
        r.addr_family = 6 if fam.value == "AF_INET6" else 4
        r.addr_family_from = fam.source
        rng = lib.get("NCCL_IB_ADDR_RANGE")
        r.addr_range, r.addr_range_from = (rng.value or "")[:48], rng.source
        if table:
            r.gid_index = nccl_auto_gid(
                table, r.roce_version, r.addr_family, addr_range(rng.value, r.addr_family)
            )
            r.gid_rule = GidRule.AUTO
        else:
            r.gid_rule = GidRule.NO_TABLE
    else:
        r.gid_index, r.gid_rule = 0, GidRule.INDEX0
    if lib.library == "ucx":
        return r
    t, r.ib_timeout_from = lib.int_setting("NCCL_IB_TIMEOUT")
    dt = default_timeout(v)
    r.ib_timeout = t if t is not None else (dt if dt is not None else -1)
    c, r.ib_retry_cnt_from = lib.int_setting("NCCL_IB_RETRY_CNT")
    r.ib_retry_cnt = c if c is not None else DEFAULT_RETRY_CNT
    return r
