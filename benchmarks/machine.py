"""The one line every benchmark prints about the machine it ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe(**versions: str) -> str:
    """CPU model, cores, RAM, kernel, Python, the given library versions and the load average.

    The load average matters on a shared machine: it inflates every time a benchmark prints.
    """
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    libs = "".join(f", {name} {version}" for name, version in versions.items())
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.1f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}{libs}; "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
