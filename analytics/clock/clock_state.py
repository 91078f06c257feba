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

    def predict(self, ref_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Offsets and sigmas carried forward to ``ref_ns`` (drift assumed constant)."""
        dt = float(ref_ns - self.ref_ns)
        offset = self.offset_ns + self.drift * dt
        sigma = np.sqrt(self.offset_sigma_ns**2 + (self.drift_sigma * dt) ** 2)
        return offset, sigma

    @classmethod
    def empty(cls, ref_ns: int = 0) -> ClockState:
        z = np.empty(0)
        return cls(ref_ns, np.empty(0, np.int64), z, z, z, z, np.empty(0, np.int64))
