"""Another git revision of this repository's code, for benchmarks that time it against
today's in one run (``--baseline REV``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*argv: str) -> str:
    """``git -C <this repository> *argv``'s output (raises ``CalledProcessError``)."""
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True
    ).stdout


def commit_of(rev: str) -> str:
    """The short commit of git revision ``rev``; a one-line exit for one that is not."""
    try:
        return git("rev-parse", "--short", "--verify", rev + "^{commit}").strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"--baseline: expected a git revision of {ROOT}, got {rev!r}") from None
