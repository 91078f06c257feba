"""ClockState.skew: what the detectors take off a one-way delay read on two clocks."""

from __future__ import annotations

import numpy as np

from analytics.clock.clock_state import ClockState

REF = 1_764_000_000_000_000_000  # a wall-clock epoch in ns: float64 spacing here is 256 ns
OFFSET = np.array([0.0, 41_250.0, -7_300.5])
DRIFT = np.array([0.0, 12e-6, -30e-6])  # 12 and -30 ppm
CLOCKS = ClockState(REF, np.array([10, 11, 12], np.int64), OFFSET, DRIFT,
                    np.zeros(3), np.zeros(3), np.full(3, REF))  # fmt: skip


def _read(h: int, t: int) -> int:
    """Host index ``h``'s clock at mesh time ``t``, to the ns."""
    return t + round(OFFSET[h] + DRIFT[h] * (t - REF))


def test_the_skew_leaves_the_true_one_way_delay_on_drifting_clocks() -> None:
    delay = 5_123
    for i, j in [(0, 1), (1, 2), (2, 0)]:
        for after_s in (0.0, 1.5, 60.0):
            t = REF + int(after_s * 1e9)
            sent, received = _read(i, t), _read(j, t + delay)
            got = received - sent - float(CLOCKS.skew(i, j, sent))
            assert abs(got - delay) < 2, (i, j, after_s, got)  # ns; the reads round to 1 ns


def test_arrays_of_sends_get_the_same_skew_as_one_at_a_time() -> None:
    i, j = np.array([1, 1, 2, 0]), np.array([0, 2, 0, 1])
    t = REF + np.array([0, 10**9, 7 * 10**9 + 3, 30 * 10**9], np.int64)
    many = CLOCKS.skew(i, j, t)
    one = [float(CLOCKS.skew(int(a), int(b), int(c))) for a, b, c in zip(i, j, t, strict=True)]
    np.testing.assert_allclose(many, one, rtol=0, atol=1e-6)
    # host 0 keeps mesh time: 30 s later host 1 is 360 µs (12 ppm) further ahead
    assert abs(many[3] - (OFFSET[1] + 12e-6 * 30e9)) < 1e-3
