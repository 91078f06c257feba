"""Trace answers (``path_hop`` rows) placed in bulk, for :meth:`FabricPaths.feed`.

A fleet's collectors trace every (buddy, source port) each round and, every watch
interval, a 5-tuple per (rack, spine): at 2,000 hosts and 4 spines ~480,000 answers a
second, nearly all saying what the one before said. This places a commit's answers with
numpy — each answer's link (by the address that answered), the racks of its ends, its
5-tuple — and groups them by 5-tuple, so the caller looks each 5-tuple up once instead of
walking every answer in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass
class Placed:
    """A commit's answers as they came (not sorted), placed.

    Per answer: ``ts``, ``src``, ``dst``, ``sport``, ``x`` and ``z`` (rack numbers of its
    ends, into ``racks``; -1: not in the topology), ``y`` (spine number into ``spines``;
    -1: an address on no fabric link), ``hop`` (the address, into ``hops``), ``key``
    (its 5-tuple's number, into the ``key_*`` columns: each 5-tuple's src, dst, sport,
    racks, its answers' least and largest spine number and newest send time).
    """

    ts: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    x: np.ndarray
    z: np.ndarray
    y: np.ndarray
    hop: np.ndarray
    hops: list[str]
    racks: list[str]
    spines: list[str]
    key: np.ndarray
    key_src: np.ndarray
    key_dst: np.ndarray
    key_sport: np.ndarray
    key_x: np.ndarray
    key_z: np.ndarray
    key_ymin: np.ndarray
    key_ymax: np.ndarray
    key_newest: np.ndarray

    @property
    def placed(self) -> np.ndarray:
        """The answers the topology places (a known link, both ends in racks)."""
        return (self.y >= 0) & (self.x >= 0) & (self.z >= 0)


class Hosts:
    """The topology's hosts as a sorted array with each one's rack number (rebuilt when
    ``host_rack`` changed): a commit's ends are placed by one ``searchsorted``."""

    def __init__(self) -> None:
        self._of: dict[int, str] | None = None
        self.ids = np.zeros(0, np.int64)
        self.rack = np.zeros(0, np.int64)
        self.racks: list[str] = []

    def of(self, host_rack: Mapping[int, str]) -> Hosts:
        if self._of != host_rack:  # a dict compare: ~0.1 ms at 2,000 hosts
            placed = {h: r for h, r in host_rack.items() if r}
            self.racks = sorted(set(placed.values()))
            number = {r: k for k, r in enumerate(self.racks)}
            self.ids = np.array(sorted(placed), np.int64)
            self.rack = np.array([number[placed[h]] for h in self.ids.tolist()], np.int64)
            self._of = dict(host_rack)
        return self

    def number(self, ids: np.ndarray) -> np.ndarray:
        """Each id's index in :attr:`ids`; len(ids) for a host the topology lacks."""
        if not len(self.ids):
            return np.zeros(len(ids), np.int64)
        i = np.searchsorted(self.ids, ids).clip(0, len(self.ids) - 1)
        return np.where(self.ids[i] == ids, i, len(self.ids))


def _hop_numbers(hop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct addresses and each answer's index into them: unique of the 16 bytes as one
    integer (checked: a collision falls back to sorting the strings)."""
    halves = np.ascontiguousarray(hop).view(np.uint64).reshape(-1, 2)
    code = halves[:, 0] * np.uint64(1_000_003) ^ halves[:, 1]
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    names = hop[first]
    inverse = inverse.ravel()
    if not np.array_equal(names[inverse], hop):
        names, inverse = np.unique(hop, return_inverse=True)
    return names, inverse.ravel()


def place(
    rows: np.ndarray,
    spine_of_hop: Callable[[str], str | None],
    host_rack: Mapping[int, str],
    hosts: Hosts | None = None,
) -> Placed:
    """``path_hop`` records placed: ``spine_of_hop(address)`` is the spine of the fabric
    link that address is on (None: none), ``host_rack`` a host id's rack ("" or missing:
    none; ``hosts`` keeps it indexed between calls)."""
    known = (hosts or Hosts()).of(host_rack)
    hop_names, hop = _hop_numbers(rows["hop"])
    hops = [h.decode(errors="replace") for h in hop_names.tolist()]
    spine_names = [spine_of_hop(a) for a in hops]
    spines = sorted({s for s in spine_names if s is not None})
    spine_no = {s: k for k, s in enumerate(spines)}
    y = np.array([spine_no[s] if s is not None else -1 for s in spine_names], np.int64)[hop]
    src, dst = rows["src"].astype(np.int64), rows["dst"].astype(np.int64)
    si, di = known.number(src), known.number(dst)
    rack = np.append(known.rack, -1)
    x, z = rack[si], rack[di]
    sport = rows["sport"].astype(np.int64)
    width = len(known.ids) + 1
    codes, key = np.unique((si * width + di) * 65536 + sport, return_inverse=True)
    key = key.ravel()
    k = len(codes)
    ymin = np.full(k, np.iinfo(np.int64).max)
    ymax = np.full(k, np.iinfo(np.int64).min)
    newest = np.full(k, np.iinfo(np.int64).min)
    ts = rows["ts_ns"].astype(np.int64)
    np.minimum.at(ymin, key, y)
    np.maximum.at(ymax, key, y)
    np.maximum.at(newest, key, ts)
    ends, key_sport = np.divmod(codes, 65536)
    ksi, kdi = np.divmod(ends, width)
    ids = np.append(known.ids, 0)
    # a host the topology lacks has no id here: its 5-tuples are not placed (x or z < 0)
    return Placed(
        ts=ts, src=src, dst=dst, sport=sport, x=x, z=z, y=y, hop=hop, hops=hops,
        racks=known.racks, spines=spines, key=key, key_src=ids[ksi], key_dst=ids[kdi],
        key_sport=key_sport, key_x=rack[ksi], key_z=rack[kdi], key_ymin=ymin, key_ymax=ymax,
        key_newest=newest,
    )  # fmt: skip


def changing(
    p: Placed,
    spine_now: Callable[[tuple[int, int, int]], str | None],
    gone_pairs: set[tuple[str, str]],
    open_ends: set[tuple[str, str]],
) -> tuple[np.ndarray, np.ndarray]:
    """Which placed answers belong to a rack pair where one may change something, so must
    be taken one by one in order: a pair with a path gone (``gone_pairs``), or a 5-tuple
    whose answers name another spine than each other or than its last trace
    (``spine_now``; a 5-tuple never traced moves nothing), or an end whose link to the
    answering spine is in an outage not seen back (``open_ends``: (leaf, spine)). Every
    other answer only says which spine its 5-tuple crosses, when it was traced and that
    its path is there (:func:`steady`). Also returns the 5-tuples never traced before."""
    ok = p.placed
    nr, ns = len(p.racks), max(len(p.spines), 1)
    pair = np.where(ok, p.x * nr + p.z, -1)
    rack_no = {r: k for k, r in enumerate(p.racks)}
    slow = {rack_no[x] * nr + rack_no[z] for x, z in gone_pairs if x in rack_no and z in rack_no}
    keyed = (p.key_x >= 0) & (p.key_z >= 0)
    key_pair = p.key_x * nr + p.key_z
    mixed = keyed & ((p.key_ymin < 0) | (p.key_ymin != p.key_ymax))
    slow.update(key_pair[mixed].tolist())
    one = np.flatnonzero(keyed & ~mixed)  # 5-tuples whose answers agree
    number: dict[str | None, int] = {None: -1, **{s: k for k, s in enumerate(p.spines)}}
    tuples = zip(
        p.key_src[one].tolist(), p.key_dst[one].tolist(), p.key_sport[one].tolist(), strict=True
    )
    before = np.array([number.get(b, -2) for b in map(spine_now, tuples)], np.int64)
    slow.update(key_pair[one[(before != -1) & (before != p.key_ymin[one])]].tolist())
    if open_ends:
        for code in np.unique(pair[ok] * ns + p.y[ok]).tolist():
            kp, yn = divmod(code, ns)
            x, z = divmod(kp, nr)
            if (p.racks[x], p.spines[yn]) in open_ends or (p.racks[z], p.spines[yn]) in open_ends:
                slow.add(kp)
    return ok & np.isin(pair, np.fromiter(slow, np.int64, len(slow))), one[before == -1]


def steady(p: Placed, rows: np.ndarray, new: np.ndarray) -> tuple[int, dict, list, list]:
    """What the answers ``rows`` (a mask; none of them :func:`changing`) say: the newest
    send time; each 5-tuple's newest send time {(src, dst, sport): ts}; the spine of
    those among ``new`` (5-tuples never traced) [((src, dst, sport), spine)]; each path's
    newest send time [((rack, rack, spine), ts)]."""
    keys = np.unique(p.key[rows])
    tuples = zip(
        p.key_src[keys].tolist(), p.key_dst[keys].tolist(), p.key_sport[keys].tolist(),
        strict=True,
    )  # fmt: skip
    traced = dict(zip(tuples, p.key_newest[keys].tolist(), strict=True))
    born = np.intersect1d(new, keys)
    first = [
        ((s, d, sp), p.spines[y])
        for s, d, sp, y in zip(
            p.key_src[born].tolist(), p.key_dst[born].tolist(), p.key_sport[born].tolist(),
            p.key_ymin[born].tolist(), strict=True,
        )
    ]  # fmt: skip
    nr, ns = len(p.racks), len(p.spines)
    codes, at = np.unique((p.x[rows] * nr + p.z[rows]) * ns + p.y[rows], return_inverse=True)
    newest = np.full(len(codes), np.iinfo(np.int64).min)
    np.maximum.at(newest, at.ravel(), p.ts[rows])
    seen = []
    for c, ts in zip(codes.tolist(), newest.tolist(), strict=True):
        (x, z), y = divmod(c // ns, nr), c % ns
        seen.append(((p.racks[x], p.racks[z], p.spines[y]), ts))
    return int(p.ts[rows].max()), traced, first, seen
