"""Fixtures that build real lab fabrics (root only) and always tear them down."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _lab_available() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc", "nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make deps)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "/usr/sbin/sshd is not installed (make deps)"
    return None


def unique_lab_name(tag: str = "") -> str:
    """Short unique lab name: parallel test runs and other engineers never collide."""
    return f"t{tag}{secrets.token_hex(3)}"[:12]


@pytest.fixture(scope="session")
def lab_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., object]]:
    """Build labs on demand; every lab made here is torn down at session end, even on failure."""
    reason = _lab_available()
    if reason:
        pytest.skip(reason)
    from lab.fabric import Lab

    made: list[Lab] = []

    def make(tag: str = "", build: bool = True, **params: int) -> Lab:
        name = unique_lab_name(tag)
        state_dir: Path = tmp_path_factory.mktemp(name) / "state"
        lab = Lab(name, state_dir)
        made.append(lab)
        if build:
            lab.up(**params)
        return lab

    try:
        yield make
    finally:
        for lab in made:
            try:
                lab.down()
            except Exception as exc:  # report, but keep tearing the others down
                print(f"teardown of lab {lab.name} failed: {exc}")


@pytest.fixture(scope="session")
def small_lab(lab_factory: Callable[..., object]) -> object:
    """2 spines, 2 leaves, 2 hosts per leaf, shared by the read-mostly tests."""
    return lab_factory("s", spines=2, leaves=2, hosts_per_leaf=2)
