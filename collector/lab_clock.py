"""The collector's clock: every timestamp it records goes through :class:`RecordingClock`.

Kernel timestamps (SO_TIMESTAMPING) and ``time.time_ns()`` are both
CLOCK_REALTIME. In the lab (``lab: true`` with ``lab_clock``) each host gets a
synthetic skew so the clock solver has ground truth to be checked against::

    t' = t + offset_ns + drift_ppm * 1e-6 * (t - t0)

``t0`` is the unskewed CLOCK_REALTIME at which the host's first collector process
started (read once, before any record is made; ``collector.agent`` keeps it in
``spool.dir/lab_clock_t0`` across restarts — a real clock's error does not step back
when a process restarts; the drift term would, by up to 50 ppm of the run's age). It is
reported in the status file and as the HEALTH record ``lab_clock_t0_ns`` so analysis
can reconstruct the exact skew. Without ``lab_clock`` the mapping is the identity.
"""

from __future__ import annotations

import time

import numpy as np

from collector.config import LabClock


class RecordingClock:
    """Maps raw CLOCK_REALTIME nanoseconds to the collector's recorded time."""

    def __init__(self, lab_clock: LabClock | None, t0_ns: int | None = None) -> None:
        self.t0_ns = time.time_ns() if t0_ns is None else t0_ns
        self.offset_ns = lab_clock.offset_ns if lab_clock else 0
        self.drift_ppm = lab_clock.drift_ppm if lab_clock else 0.0
        self.identity = self.offset_ns == 0 and self.drift_ppm == 0.0

    def skew(self, t_ns: int) -> int:
        """Recorded time of one raw realtime timestamp (0 stays 0: "no timestamp")."""
        if self.identity or t_ns == 0:
            return t_ns
        # Integer arithmetic for the offset, float only for the small drift term:
        # drift_ppm * 1e-6 * (t - t0) is < 2**53 for any realistic run time.
        return t_ns + self.offset_ns + round(self.drift_ppm * 1e-6 * (t_ns - self.t0_ns))

    def skew_array(self, t_ns: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`skew` for an int64 array (zeros stay zero)."""
        if self.identity:
            return t_ns
        drift = np.rint(self.drift_ppm * 1e-6 * (t_ns - self.t0_ns).astype(np.float64))
        out = t_ns + self.offset_ns + drift.astype(np.int64)
        return np.where(t_ns == 0, 0, out)

    def now(self) -> int:
        """The recorded time now (user-space CLOCK_REALTIME, skewed)."""
        return self.skew(time.time_ns())
