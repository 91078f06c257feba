"""The ops box sets the shipping pace: the segment interval it advises collectors to use.

Every request costs the daemon a fixed amount of CPU (HTTP parsing, HMAC set-up, the
handler, the reply: ~350 µs on the development machine) however many records it
carries. A fleet that ships one 1-s segment per host per second sends as many requests
per second as it has hosts; past ``max_requests_per_s`` the ops box spends its cores on
requests instead of records. So every acknowledgement carries ``roll_s``, the segment
interval the daemon wants (docs/store.md, "Shipping pace"): collectors roll their spool
at ``max(spool.roll_s, advised)``, capped by their own ``spool.max_roll_s``.

The advice is the request rate the fleet would send with 1-s segments (one request
per active host per second), held against the budget::

    roll_s = clamp(active_hosts / max_requests_per_s, min_s, max_s)   (tenths of a second)

``min_s`` is 0 by default: below its budget the ops box advises less than any
collector's own ``spool.roll_s``, so the advice never overrides a collector's setting
until the fleet's request rate needs it to.

A collector may ship less often than advised (its own ``spool.roll_s`` is longer): each
segment says the interval it was written for (header ``roll_s``), and
:attr:`Pacer.slowest_roll_s` is the longest an active host said, up to ``max_s`` — the
daemon waits that long, not only the advice, for a probe's other half before it solves
a window or rolls up a minute.

``active_hosts`` = hosts that sent a segment in the last ``window_s`` (60 s, at least
2.5 x ``max_s``; pruned every ``window_s / 8``). The request rate
actually seen is measured and published too (``/metrics``), but not fed back: collectors
take up new advice only at their next roll, so "rate seen x interval in use" overshoots
while they switch and would make the advice oscillate. Backlog shipping does not need
pacing: a shipper with a backlog sends up to 30 segments per request. A small fleet
keeps its configured segments (1 s by default); an 11,000-host fleet at the default
budget of 420 requests/s gets 26.2-s segments (docs/store.md, "Shipping pace").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Pacer:
    """Counts requests and active hosts; :meth:`update` recomputes the advice."""

    def __init__(
        self,
        max_requests_per_s: float,
        *,
        min_s: float = 0.0,
        max_s: float = 30.0,
        window_s: float | None = None,
    ) -> None:
        self.budget = max_requests_per_s
        self.min_s = min_s
        self.max_s = max_s
        # longer than the longest advised interval: a host shipping every max_s is active
        self.window_s = window_s if window_s is not None else max(60.0, 2.5 * max_s)
        self.roll_s = min_s  # the advice sent with every acknowledgement
        self.request_rate = 0.0
        self.active_hosts = 0
        # the longest interval an active host's segments said it ships at (up to max_s)
        self.slowest_roll_s = 0.0
        self._hosts: dict[int, float] = {}  # host id -> last request (monotonic)
        self._rolls: dict[int, float] = {}  # host id -> the interval its newest segment said
        # called (event loop) with slowest_roll_s when a segment raises it: the daemon
        # waits longer before the windows its rows belong to are due
        self.on_slower: Callable[[float], None] | None = None
        self._requests = 0  # since the last update
        self._last = time.monotonic()
        self._next_prune = 0.0

    def seen(
        self,
        host_ids: list[int] | tuple[int, ...],
        now: float,
        rolls: list[float] | tuple[float, ...] = (),
    ) -> None:
        """One request carrying segments of ``host_ids`` (event loop, per request), each
        written for the interval in ``rolls`` (0: not said)."""
        self._requests += 1
        hosts = self._hosts
        for hid in host_ids:
            hosts[hid] = now
        for hid, roll in zip(host_ids, rolls, strict=False):
            if roll > 0:
                roll = self._rolls[hid] = min(roll, self.max_s)
                if roll > self.slowest_roll_s:
                    self.slowest_roll_s = roll
                    if self.on_slower is not None:
                        self.on_slower(roll)

    def update(self, now: float | None = None) -> float:
        """Recompute the advice (about once a second); returns it."""
        now = time.monotonic() if now is None else now
        self.request_rate = self._requests / max(now - self._last, 1e-3)
        self._requests = 0
        self._last = now
        if now >= self._next_prune:  # a pass over every host: a few times per window
            self._next_prune = now + self.window_s / 8
            horizon = now - self.window_s
            stale = [h for h, t in self._hosts.items() if t < horizon]
            for h in stale:
                del self._hosts[h]
                self._rolls.pop(h, None)
            # (a host that now ships more often lowers it here, within window_s / 8)
            self.slowest_roll_s = max(self._rolls.values(), default=0.0)
        self.active_hosts = len(self._hosts)
        wanted = self.active_hosts / self.budget
        # whole tenths of a second: stable figures in acks, logs and metrics
        self.roll_s = min(self.max_s, max(self.min_s, math.ceil(wanted * 10 - 1e-9) / 10))
        return self.roll_s
