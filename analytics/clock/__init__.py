"""The clock solver: coded-probe filter, per-pair envelope fit, network effect.

Public API (used by the ingest daemon every window)::

    from analytics.clock import solve_window, rtt2_baseline, ClockState, SolverConfig

See docs/clock.md.
"""

from analytics.clock.allocator import set_mmap_threshold, tune_allocator
from analytics.clock.baseline import rtt2_baseline, rtt2_host_offsets
from analytics.clock.clock_state import ClockState
from analytics.clock.solver import DEFAULT_WINDOW_NS, SolverConfig, WindowSolution, solve_window
from analytics.clock.tables import (
    BASELINE_ROW,
    CLOCK_ROW,
    OWD_ROW,
    PAIR_ROW,
    HostStatus,
    PairFlag,
    as_columns,
    store_columns,
)

__all__ = [
    "BASELINE_ROW",
    "CLOCK_ROW",
    "DEFAULT_WINDOW_NS",
    "OWD_ROW",
    "PAIR_ROW",
    "ClockState",
    "HostStatus",
    "PairFlag",
    "SolverConfig",
    "WindowSolution",
    "as_columns",
    "rtt2_baseline",
    "rtt2_host_offsets",
    "set_mmap_threshold",
    "solve_window",
    "store_columns",
    "tune_allocator",
]
