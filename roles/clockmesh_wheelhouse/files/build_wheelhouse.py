#!/usr/bin/env python3
"""Build (or reuse) a wheelhouse of clockmesh and its dependencies on the controller.

Fleet hosts often have no route to a package index, so the controller builds every
wheel once and the roles copy the directory to the hosts, which install with
``pip install --no-index``.

The wheelhouse is rebuilt only when it is missing or outdated: a stamp over the
source tree (packaging files and every file of every top-level package), the
extras, and the building interpreter's ABI is kept in ``DEST/SOURCE_STAMP``.
The new wheelhouse is built next to the old one and swapped in with a rename, so
a failed build never leaves a half-written directory behind.

Prints one JSON object: ``{"changed", "stamp", "dir", "wheel", "reason"}``.
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
import tempfile
from pathlib import Path

STAMP_FILE = "SOURCE_STAMP"
PACKAGING_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "MANIFEST.in")
SKIP_DIRS = {"__pycache__", ".git", ".venv", "build", "dist"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def package_dirs(source: Path) -> list[Path]:
    """Top-level import packages of the project (directories with ``__init__.py``)."""
    return sorted(
        p for p in source.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / "__init__.py").is_file()
    )


def source_files(source: Path) -> list[Path]:
    """Every file that can change the built wheel, in a stable order."""
    files = [source / name for name in PACKAGING_FILES if (source / name).is_file()]
    for pkg in package_dirs(source):
        for root, dirs, names in os.walk(pkg):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            files.extend(Path(root) / n for n in sorted(names) if not n.endswith(SKIP_SUFFIXES))
    return files


def source_stamp(source: Path, extras: str, abi: str) -> str:
    """sha256 over relative paths and contents of the source files, the extras and the ABI."""
    digest = hashlib.sha256()
    digest.update(f"extras={extras}\nabi={abi}\n".encode())
    for path in source_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def interpreter_abi() -> str:
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def read_stamp(dest: Path) -> str:
    try:
        return (dest / STAMP_FILE).read_text(encoding="ascii").strip()
    except OSError:
        return ""


def project_wheel(dest: Path) -> str:
    """File name of the project's own wheel in ``dest`` ('' when absent)."""
    wheels = sorted(p.name for p in dest.glob("clockmesh-*.whl")) if dest.is_dir() else []
    return wheels[-1] if wheels else ""


def requirement(source: Path, extras: str) -> str:
    extras = ",".join(e.strip() for e in extras.split(",") if e.strip())
    return f"{source}[{extras}]" if extras else str(source)


def build(source: Path, dest: Path, extras: str, stamp: str, pip_args: list[str]) -> None:
    """Build into a sibling temporary directory, then swap it in."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(tmp), *pip_args]
        cmd.append(requirement(source, extras))
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"pip wheel failed with exit status {proc.returncode}: {' '.join(cmd)}")
        if not project_wheel(tmp):
            raise SystemExit(f"pip wheel produced no clockmesh wheel in {tmp}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, type=Path, help="project directory (has pyproject.toml)")
    parser.add_argument("--dest", required=True, type=Path, help="wheelhouse directory to create or refresh")
    parser.add_argument("--extras", default="", help="comma-separated extras, e.g. opsbox")
    parser.add_argument("--check", action="store_true", help="only report whether a build is needed")
    parser.add_argument("--pip-arg", action="append", default=[], help="extra argument for pip wheel")
    args = parser.parse_args(argv)
    source = args.source.resolve()
    if not (source / "pyproject.toml").is_file():
        parser.error(f"--source {source}: expected a project directory with pyproject.toml")
    dest = args.dest.resolve()
    stamp = source_stamp(source, args.extras, interpreter_abi())
    lock_path = dest.with_name(f".{dest.name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent plays build one at a time
        current = read_stamp(dest)
        wheel = project_wheel(dest)
        if current == stamp and wheel:
            reason = "up to date"
            changed = False
        else:
            reason = "missing" if not current else "source changed"
            changed = True
            if not args.check:
                build(source, dest, args.extras, stamp, args.pip_arg)
                wheel = project_wheel(dest)
    result = {"changed": changed, "stamp": stamp, "dir": str(dest), "wheel": wheel, "reason": reason}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
