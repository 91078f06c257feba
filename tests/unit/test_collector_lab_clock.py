from __future__ import annotations

import numpy as np

from collector.config import LabClock
from collector.lab_clock import RecordingClock


def test_identity_without_lab_clock() -> None:
    clock = RecordingClock(None, t0_ns=1_000)
    assert clock.skew(123_456_789) == 123_456_789


def test_offset_and_drift_follow_the_documented_formula() -> None:
    t0 = 1_800_000_000_000_000_000
    clock = RecordingClock(LabClock(offset_ns=-2_500_000, drift_ppm=37.5), t0_ns=t0)
    for dt in (0, 1, 999_999_999, 3_600 * 10**9, -5 * 10**9):
        t = t0 + dt
        assert clock.skew(t) == t - 2_500_000 + round(37.5e-6 * dt)
    arr = np.array([t0, t0 + 10**9, 0], dtype=np.int64)
    assert clock.skew_array(arr).tolist() == [clock.skew(t0), clock.skew(t0 + 10**9), 0]
