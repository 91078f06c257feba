"""What one window's solution hands to the next: per-host clocks in mesh time."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ClockState:
    """Per host: ``clock_h(t) = t + offset_ns + drift * (t - ref_ns)``, t in mesh time.

    ``drift`` is dimensionless (ns per ns); ``last_seen_ns`` is the reference of
    the last window that solved the host (state ages out after ``max_age_ns``).
    """

    ref_ns: int
    hosts: np.ndarray  # int64 host ids
    offset_ns: np.ndarray  # float64
    drift: np.ndarray  # float64
    offset_sigma_ns: np.ndarray
    drift_sigma: np.ndarray
    last_seen_ns: np.ndarray  # int64
    # the network solves' graphs (network.solve's cache), handed on from window to window
    cache: dict = field(default_factory=dict, repr=False, compare=False)
    # each probed pair's clean round trip, tracked over windows (steps.track_rtt):
    # keys ``i * len(hosts) + j`` (i < j index ``hosts``; any order) and the round trips
    pair_keys: np.ndarray = field(
        default_factory=lambda: np.empty(0, np.int64), repr=False, compare=False
    )
    pair_rtt_ns: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)
    # the hosts judged under a standing queue in this window (steps.StandingQueue): ids
    queued_hosts: np.ndarray = field(
        default_factory=lambda: np.empty(0, np.int64), repr=False, compare=False
    )

    def predict(self, ref_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Offsets and sigmas carried forward to ``ref_ns`` (drift assumed constant)."""
        dt = float(ref_ns - self.ref_ns)
        offset = self.offset_ns + self.drift * dt
        sigma = np.sqrt(self.offset_sigma_ns**2 + (self.drift_sigma * dt) ** 2)
        return offset, sigma

    def skew(
        self, i: np.ndarray | int, j: np.ndarray | int, t_ns: np.ndarray | int
    ) -> np.ndarray | float:
        """Host ``j``'s clock less host ``i``'s when host ``i``'s clock reads ``t_ns``
        (a send time; ``i``, ``j`` index ``hosts``; scalars or arrays): what a one-way
        delay from ``i`` to ``j`` read on their two clocks carries on top of the true one."""
        if isinstance(t_ns, int):  # one message (the job-delay detector): no 0-d arrays
            read: np.ndarray | float = float(t_ns - self.ref_ns)
        else:
            read = (np.asarray(t_ns) - self.ref_ns).astype(np.float64)  # in integers, then float
        dt = (read - self.offset_ns[i]) / (1.0 + self.drift[i])  # mesh time since ref_ns
        return (self.offset_ns[j] - self.offset_ns[i]) + (self.drift[j] - self.drift[i]) * dt

    @classmethod
    def empty(cls, ref_ns: int = 0) -> ClockState:
        z = np.empty(0)
        return cls(ref_ns, np.empty(0, np.int64), z, z, z, z, np.empty(0, np.int64))
