#!/usr/bin/env python3
"""Build (or reuse) a wheelhouse of clockmesh and its dependencies on the controller.

Fleet hosts often have no route to a package index, so the controller builds every
wheel once and the roles copy the directory to the hosts, which install with
``pip install --no-index``.

The wheelhouse is rebuilt only when it is missing or outdated. Two stamps are kept:
``DEST/DEPS_STAMP`` over what decides the dependency wheels (packaging files, extras,
pip arguments, the building interpreter's ABI) and ``DEST/SOURCE_STAMP`` over that
plus every file of every top-level package. When only the source changed, only the
project's own wheel is rebuilt and the dependency wheels are reused. The new
wheelhouse is built next to the old one and swapped in with a rename, so a failed
build never leaves a half-written directory behind.

Prints one JSON object: ``{"changed", "stamp", "dir", "archive", "wheel", "pip_wheel",
"reason"}``.
Exit status 0 on success, 1 on a build failure (pip's output goes to stderr),
2 on bad arguments.  Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

PIP = "pip"  # built into every wheelhouse: hosts install with it (no ensurepip, no index)
STAMP_FILE = "SOURCE_STAMP"
DEPS_STAMP_FILE = "DEPS_STAMP"
PACKAGING_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "MANIFEST.in")
SKIP_DIRS = {"__pycache__", ".git", ".venv", "build", "dist"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def package_dirs(source: Path) -> list[Path]:
    """Top-level import packages of the project (directories with ``__init__.py``)."""
    return sorted(
        p
        for p in source.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / "__init__.py").is_file()
    )


def source_files(source: Path) -> list[Path]:
    """Every file that can change the built wheel, in a stable order."""
    files = [source / name for name in PACKAGING_FILES if (source / name).is_file()]
    for pkg in package_dirs(source):
        for root, dirs, names in os.walk(pkg):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            files.extend(Path(root) / n for n in sorted(names) if not n.endswith(SKIP_SUFFIXES))
    return files


def deps_stamp(source: Path, extras: str, abi: str, pip_args: list[str]) -> str:
    """sha256 over what decides the dependency wheels: packaging files, extras, ABI, pip args."""
    digest = hashlib.sha256()
    digest.update(
        json.dumps({"extras": extras, "abi": abi, "pip_args": pip_args, "with": PIP}).encode()
    )
    for name in PACKAGING_FILES:
        path = source / name
        if path.is_file() and name != "README.md":
            digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def source_stamp(source: Path, deps: str) -> str:
    """sha256 over the dependency stamp and the relative paths and contents of the source."""
    digest = hashlib.sha256(deps.encode())
    for path in source_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def interpreter_abi() -> str:
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def read_stamp(dest: Path, name: str = STAMP_FILE) -> str:
    try:
        return (dest / name).read_text(encoding="ascii").strip()
    except OSError:
        return ""


def pip_wheel(dest: Path) -> str:
    """File name of pip's wheel in ``dest`` ('' when absent): hosts run pip from it to
    install into a venv created without ensurepip."""
    wheels = sorted(p.name for p in dest.glob("pip-*.whl")) if dest.is_dir() else []
    return wheels[-1] if wheels else ""


def project_wheel(dest: Path) -> str:
    """File name of the project's own wheel in ``dest`` ('' when absent)."""
    wheels = sorted(p.name for p in dest.glob("clockmesh-*.whl")) if dest.is_dir() else []
    return wheels[-1] if wheels else ""


def requirement(source: Path, extras: str) -> str:
    extras = ",".join(e.strip() for e in extras.split(",") if e.strip())
    return f"{source}[{extras}]" if extras else str(source)


def build(
    source: Path,
    dest: Path,
    extras: str,
    stamps: tuple[str, str],
    pip_args: list[str],
    reuse_deps: bool,
) -> None:
    """Build into a sibling temporary directory, then swap it in.

    With ``reuse_deps`` only the project wheel is built; the dependency wheels are
    hard-linked from the current wheelhouse.
    """
    deps, stamp = stamps
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
        cmd += ["--wheel-dir", str(tmp), *pip_args]
        if reuse_deps:
            cmd.append("--no-deps")
            for wheel in dest.glob("*.whl"):
                if not wheel.name.startswith("clockmesh-"):
                    os.link(wheel, tmp / wheel.name)
        else:
            cmd.append(PIP)  # the installer travels with the wheels
        cmd.append(requirement(source, extras))
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
        if proc.returncode != 0:
            raise SystemExit(
                f"pip wheel failed with exit status {proc.returncode}: {' '.join(cmd)}"
            )
        if not project_wheel(tmp) or not pip_wheel(tmp):
            raise SystemExit(f"pip wheel produced no clockmesh or no pip wheel in {tmp}")
        (tmp / DEPS_STAMP_FILE).write_text(deps + "\n", encoding="ascii")
        (tmp / STAMP_FILE).write_text(stamp + "\n", encoding="ascii")
        tmp.chmod(0o755)
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def archive_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".tar")


def write_archive(dest: Path) -> Path:
    """``DEST.tar``: the wheelhouse as one file (one transfer per host, not one per wheel).

    Entries are sorted and carry fixed metadata, so the same wheelhouse always gives
    the same bytes and the hosts' copy stays unchanged.
    """
    target = archive_path(dest)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(dest.iterdir()):
            info = tar.gettarinfo(str(path), arcname=path.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            info.mode = 0o644
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source", required=True, type=Path, help="project directory (has pyproject.toml)"
    )
    parser.add_argument(
        "--dest", required=True, type=Path, help="wheelhouse directory to create or refresh"
    )
    parser.add_argument("--extras", default="", help="comma-separated extras, e.g. opsbox")
    parser.add_argument(
        "--check", action="store_true", help="only report whether a build is needed"
    )
    parser.add_argument(
        "--pip-arg", action="append", default=[], help="extra argument for pip wheel"
    )
    args = parser.parse_args(argv)
    source = args.source.resolve()
    if not (source / "pyproject.toml").is_file():
        parser.error(f"--source {source}: expected a project directory with pyproject.toml")
    dest = args.dest.resolve()
    deps = deps_stamp(source, args.extras, interpreter_abi(), args.pip_arg)
    stamp = source_stamp(source, deps)
    lock_path = dest.with_name(f".{dest.name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent plays build one at a time
        current = read_stamp(dest)
        wheel = project_wheel(dest)
        reuse_deps = bool(wheel) and read_stamp(dest, DEPS_STAMP_FILE) == deps
        if current == stamp and wheel:
            reason = "up to date"
            changed = False
        else:
            reason = (
                "missing"
                if not wheel
                else "source changed"
                if reuse_deps
                else "dependencies changed"
            )
            changed = True
            if not args.check:
                build(source, dest, args.extras, (deps, stamp), args.pip_arg, reuse_deps)
                wheel = project_wheel(dest)
                write_archive(dest)
        if not changed and not archive_path(dest).is_file() and not args.check:
            write_archive(dest)
    result = {
        "changed": changed,
        "stamp": stamp,
        "dir": str(dest),
        "archive": str(archive_path(dest)),
        "wheel": wheel,
        "pip_wheel": pip_wheel(dest),
        "reason": reason,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
