"""Output rows of the clock solver: what the ingest daemon writes to the store.

Structured numpy dtypes (fixed width, no objects) so the store can hand the
columns straight to Arrow/DuckDB: ``pyarrow.table(as_columns(rows))``.
Column meanings are documented in docs/clock.md.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

import numpy as np


class HostStatus(IntEnum):
    SOLVED = 0  # from this window's pairs
    PREDICTED = 1  # no usable pair this window: the previous state carried forward
    UNSOLVED = 2  # no usable pair and no previous state: values are NaN


class PairFlag(IntFlag):
    NONE = 0
    DISAGREE = 1  # the pair's own estimate disagrees with the loop solution
    ONE_WAY = 2  # pure samples in one direction only: offset not separable
    NO_DRIFT = 4  # samples in a single bin: drift from the previous window / 0
    EXCLUDED = 8  # not used by the network solution (weight forced down)


# table ``clock``: one row per host per window
CLOCK_ROW = np.dtype(
    [
        ("window_start_ns", "<i8"),
        ("ref_ns", "<i8"),  # reference instant (mesh time) the offsets refer to
        ("host", "<i8"),
        ("offset_ns", "<f8"),  # host clock minus mesh time at ref_ns
        ("drift_ppm", "<f8"),  # d(offset)/dt in parts per million
        ("offset_sigma_ns", "<f8"),
        ("drift_sigma_ppm", "<f8"),
        ("component", "<i4"),  # connected component of the probe graph (0 = largest)
        ("n_pairs", "<i4"),  # pairs with an estimate touching this host
        ("n_flagged", "<i4"),  # of which flagged DISAGREE
        ("status", "u1"),  # HostStatus
    ]
)

# table ``clock_pair``: one row per probed host pair per window (host_a < host_b by index)
PAIR_ROW = np.dtype(
    [
        ("window_start_ns", "<i8"),
        ("host_a", "<i8"),
        ("host_b", "<i8"),
        ("offset_ns", "<f8"),  # the pair's own estimate of offset(b) - offset(a) at ref_ns
        ("drift_ppm", "<f8"),
        ("offset_sigma_ns", "<f8"),
        ("residual_ns", "<f8"),  # network solution minus own estimate
        ("n_fwd", "<i4"),
        ("n_rev", "<i4"),
        ("n_bins", "<i2"),
        ("flags", "u1"),  # PairFlag
    ]
)

# table ``owd``: one row per matched probe
OWD_ROW = np.dtype(
    [
        ("window_start_ns", "<i8"),
        ("src", "<i8"),
        ("dst", "<i8"),
        ("seq", "<u8"),
        ("sport", "<u2"),
        ("pure", "?"),  # first probe of a coded pair that passed the filter
        ("ok", "?"),  # both clocks solved (or predicted): owd_ns is meaningful
        ("tx_ns", "<i8"),  # send time on the sender's clock (as recorded)
        ("tx_mesh_ns", "<i8"),  # send time in mesh time
        ("owd_ns", "<f8"),  # corrected one-way delay
        ("owd_sigma_ns", "<f8"),  # from both hosts' offset uncertainty
    ]
)

# ``rtt2_baseline``: one row per host pair
BASELINE_ROW = np.dtype(
    [
        ("host_a", "<i8"),
        ("host_b", "<i8"),
        ("offset_ns", "<f8"),  # RTT/2 estimate of offset(b) - offset(a) at ref_ns
        ("drift_ppm", "<f8"),
        ("rtt_min_ns", "<f8"),
        ("n", "<i4"),
    ]
)


def as_columns(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Contiguous column arrays of a structured array (for Arrow / DuckDB)."""
    names = rows.dtype.names or ()
    return {name: np.ascontiguousarray(rows[name]) for name in names}


def store_columns(solution: object, *, method: str = "huygens") -> dict[str, dict[str, np.ndarray]]:
    """Columns for the store's ``clock`` and ``owd`` tables (docs/schema.md) of one
    :class:`~analytics.clock.solver.WindowSolution`.

    ``clock``: solved and predicted hosts; ``reference`` is the gauge host id, or 0
    for the mean-zero / continuous mesh time. ``owd``: probes whose clocks were
    solved; ``ts_ns`` is the send time in mesh time."""
    clock = solution.clock  # type: ignore[attr-defined]
    owd = solution.owd  # type: ignore[attr-defined]
    keep = clock["status"] != HostStatus.UNSOLVED
    c = clock[keep]
    n = len(c)
    gauge = getattr(solution, "gauge_host", None) or 0
    ok = owd["ok"]
    return {
        "clock": {
            "window_start_ns": np.full(n, solution.window_start_ns, np.int64),  # type: ignore[attr-defined]
            "window_end_ns": np.full(
                n,
                solution.window_start_ns + solution.window_ns,  # type: ignore[attr-defined]
                np.int64,
            ),
            "host": np.ascontiguousarray(c["host"]),
            "offset_ns": np.ascontiguousarray(c["offset_ns"]),
            "drift_ppm": np.ascontiguousarray(c["drift_ppm"]),
            "uncertainty_ns": np.ascontiguousarray(c["offset_sigma_ns"]),
            "reference": np.full(n, gauge, np.int64),
            "method": np.full(n, method, dtype=object),
        },
        "owd": {
            "ts_ns": owd["tx_mesh_ns"][ok],
            "src": owd["src"][ok],
            "dst": owd["dst"][ok],
            "sport": owd["sport"][ok],
            "seq": owd["seq"][ok],
            "owd_ns": owd["owd_ns"][ok],
            "uncertainty_ns": _owd_sigma(clock, owd["src"][ok], owd["dst"][ok]),
        },
    }


def _owd_sigma(clock: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """sqrt(sigma_src^2 + sigma_dst^2) from the clock rows (hosts are sorted ids)."""
    hosts = clock["host"]
    sig = clock["offset_sigma_ns"]
    if len(hosts) == 0:
        return np.zeros(len(src))
    i = np.searchsorted(hosts, src).clip(0, len(hosts) - 1)
    j = np.searchsorted(hosts, dst).clip(0, len(hosts) - 1)
    return np.hypot(sig[i], sig[j])
