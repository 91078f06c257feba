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


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) CPU ticks of the whole machine so far, from /proc/stat.

    On a virtual machine "steal" is time the hypervisor gave other guests while this one
    wanted to run: a run with much of it measured a smaller machine than it names."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    ticks = [int(v) for v in fields]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of the machine's CPU time stolen by the hypervisor between two cpu_ticks()."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0
