"""Join PROBE_TX to PROBE_RX, apply the coded-probe filter, take echo return legs.

Everything is O(n) scatter/gather, no sort of millions of rows:

- A probe is addressed by (sender index, seq - that sender's smallest seq in the
  window): a dense slot per window (:class:`SeqLayout`). TX times are scattered
  into their slots (TX rows come per sender in seq order, so the writes stream),
  and each RX row gathers its TX time from its slot.
- Coded pairs: the second probe of a pair nearly always arrives right after the
  first at the same receiver, so the partner is looked for in the next row first;
  the few pairs split by other traffic are found through a slot table.
- Echoes likewise (a prober records the two echoes of a pair back to back).

Drop reasons are counted in ``drops``, never silent.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from analytics.clock.key_index import KeyIndex
from collector.records import TsKind

# Above this many slots per row the join sorts instead (a collector restart
# inside a window makes its seq jump; a dense table would be mostly empty).
_MAX_SLOTS_PER_ROW = 8
_NONE = np.iinfo(np.int64).min


def host_index_of(index: KeyIndex, ids: np.ndarray) -> np.ndarray:
    """Host index of every id; fast when equal ids come in runs (a host's own rows)."""
    n = len(ids)
    if n == 0:
        return np.empty(0, np.intp)
    starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    if len(starts) > n // 4:
        return index.lookup(ids)
    starts = np.concatenate(([0], starts))
    lengths = np.diff(np.append(starts, n))
    return np.repeat(index.lookup(ids[starts]), lengths)


def hosts_in(*id_columns: np.ndarray) -> np.ndarray:
    """Distinct host ids over columns whose equal values mostly come in runs."""
    heads = []
    for col in id_columns:
        if len(col):
            starts = np.flatnonzero(col[1:] != col[:-1]) + 1
            heads.append(col[np.concatenate(([0], starts))])
    if not heads:
        return np.empty(0, np.int64)
    return np.unique(np.concatenate(heads))


def _per_host_extremes(host_i: np.ndarray, seq: np.ndarray, n_hosts: int):
    """Min and max seq per host, from runs of equal host (one reduceat per run)."""
    lo = np.full(n_hosts, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_hosts, -1, np.int64)
    valid = host_i >= 0
    if not valid.all():
        host_i, seq = host_i[valid], seq[valid]
    if len(host_i) == 0:
        return lo, hi
    starts = np.concatenate(([0], np.flatnonzero(host_i[1:] != host_i[:-1]) + 1))
    np.minimum.at(lo, host_i[starts], np.minimum.reduceat(seq, starts))
    np.maximum.at(hi, host_i[starts], np.maximum.reduceat(seq, starts))
    return lo, hi


class SeqLayout:
    """Slots for (host, seq): ``offset[host] + seq - base[host]``."""

    def __init__(self, host_i: np.ndarray, seq: np.ndarray, n_hosts: int) -> None:
        lo, hi = _per_host_extremes(host_i, seq, n_hosts)
        has = hi >= 0
        self.base = np.where(has, lo, 0)
        self.span = np.where(has, hi - lo + 1, 0)
        self.total = int(self.span.sum())
        self.dense = self.total <= _MAX_SLOTS_PER_ROW * max(len(seq), 1) + 4096
        self.offset = np.concatenate(([0], np.cumsum(self.span)[:-1])).astype(np.int64)

    def own_position(self, host_i: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Slots of the rows the layout was built from (always in range; -1 for host -1)."""
        n = len(host_i)
        if n == 0:
            return np.empty(0, np.int64)
        starts = np.concatenate(([0], np.flatnonzero(host_i[1:] != host_i[:-1]) + 1))
        h = host_i[starts]
        hv = np.maximum(h, 0)
        shift = np.where(h >= 0, self.offset[hv] - self.base[hv], np.iinfo(np.int64).min)
        pos = seq + np.repeat(shift, np.diff(np.append(starts, n)))
        if (h < 0).any():
            pos[np.repeat(h < 0, np.diff(np.append(starts, n)))] = -1
        return pos

    def position(self, host_i: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Slot of each (host, seq); -1 where it cannot be in this layout."""
        n = len(host_i)
        if n and (host_i >= 0).all():
            starts = np.flatnonzero(host_i[1:] != host_i[:-1]) + 1
            if len(starts) < n // 8:  # rows in runs of one host: per-run constants
                starts = np.concatenate(([0], starts))
                h = host_i[starts]
                shift = np.repeat(self.offset[h] - self.base[h], np.diff(np.append(starts, n)))
                rel = seq - np.repeat(self.base[h], np.diff(np.append(starts, n)))
                ok = (rel >= 0) & (rel < np.repeat(self.span[h], np.diff(np.append(starts, n))))
                return np.where(ok, seq + shift, -1)
        h = np.maximum(host_i, 0)
        rel = seq - np.take(self.base, h)
        # one unsigned compare checks 0 <= rel < span; unknown hosts have span 0 at
        # index 0 only if host 0 has no rows, so they are masked explicitly
        ok = rel.view(np.uint64) < np.take(self.span, h).view(np.uint64)
        ok &= host_i >= 0
        rel += np.take(self.offset, h)
        rel[~ok] = -1
        return rel


class SlotValues:
    """int64 values stored by slot; the last write to a slot wins; ``_NONE`` = empty."""

    def __init__(self, layout: SeqLayout, pos: np.ndarray, values: np.ndarray) -> None:
        self.dense = layout.dense
        ok = pos >= 0
        if not ok.all():
            pos, values = pos[ok], values[ok]
        if self.dense:
            self.table = np.full(layout.total + 1, _NONE, np.int64)
            self.table[pos] = values
            self.stored = int(np.count_nonzero(self.table != _NONE))
        else:
            order = np.argsort(pos, kind="stable")
            p, v = pos[order], values[order]
            last = np.ones(len(p), bool)
            last[:-1] = p[1:] != p[:-1]
            self.keys, self.table = p[last], v[last]
            self.stored = len(self.keys)
        self.written = len(pos)

    def get(self, pos: np.ndarray) -> np.ndarray:
        if self.dense:
            out = np.take(self.table, np.maximum(pos, 0))
        elif len(self.keys) == 0:
            return np.full(len(pos), _NONE, np.int64)
        else:
            i = np.searchsorted(self.keys, pos).clip(0, len(self.keys) - 1)
            out = np.where(np.take(self.keys, i) == pos, np.take(self.table, i), _NONE)
        out[pos < 0] = _NONE
        return out


def _pair_partners(
    src: np.ndarray,
    seq: np.ndarray,
    first: np.ndarray,
    usable: np.ndarray,
    host_i: np.ndarray,
    n_hosts: int,
) -> np.ndarray:
    """Row of the second probe (seq + 1, same sender) of each ``first`` row, -1 if none.

    Looks at the next row first; the rest through a slot table of usable odd rows."""
    n = len(seq)
    partner = np.full(len(first), -1, np.intp)
    if len(first) == 0:
        return partner
    # next row is the partner: same sender, seq + 1, usable (shifted compares, no gather)
    nxt_ok = np.zeros(n, bool)
    nxt_ok[:-1] = (src[1:] == src[:-1]) & (seq[1:] == seq[:-1] + 1) & usable[1:]
    hit = np.take(nxt_ok, first)
    partner[hit] = first[hit] + 1
    miss = np.flatnonzero(~hit)
    if len(miss):
        claimed = np.zeros(n, bool)
        claimed[partner[hit]] = True
        odd = np.flatnonzero(usable & ((seq & 1) == 1) & ~claimed)
        if len(odd):
            layout = SeqLayout(host_i[odd], seq[odd], n_hosts)
            slots = SlotValues(layout, layout.position(host_i[odd], seq[odd]), odd)
            f = first[miss]
            found = slots.get(layout.position(host_i[f], seq[f] + 1))
            partner[miss] = np.where(found != _NONE, found, -1)
    return partner


def take_rows(records: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``records[rows]`` for a structured array, fast.

    numpy copies structured rows with subarray fields item by item; gathering the
    same bytes as rows of machine words is a plain memcpy per row."""
    size = records.dtype.itemsize
    if size % 8 or not records.flags.c_contiguous:
        return records[rows]
    words = records.view(np.uint64).reshape(len(records), size // 8)
    return np.take(words, rows, axis=0).view(records.dtype).reshape(len(rows))


def _tolerance(kind_a: np.ndarray, kind_b: np.ndarray, spacing_tol: tuple[int, int]) -> np.ndarray:
    """Per coded pair: the hardware tolerance when all its timestamps are NIC/RDMA ones."""
    hw = (kind_a >= TsKind.HW) & (kind_b >= TsKind.HW)
    return np.where(hw, spacing_tol[1], spacing_tol[0])


@dataclass
class ProbeSamples:
    """Per RX row: the TX time and host indices; pure pair firsts; pure echo returns."""

    rx_src_i: np.ndarray  # sender index per RX row (-1 unknown)
    rx_dst_i: np.ndarray  # receiver index per RX row
    tx_ns: np.ndarray  # per RX row: matching TX time, or _NONE
    matched: np.ndarray  # bool per RX row
    rx_ns: np.ndarray  # contiguous copy of rx["rx_ns"]
    pure_rows: np.ndarray  # RX rows: first probe of a pure coded pair
    echo_rows: np.ndarray  # ECHO rows: first echo of a pure pair of return legs
    echo_src_i: np.ndarray  # the echoing host (sent the return leg at t3)
    echo_dst_i: np.ndarray  # the prober (received it at t4)
    drops: dict[str, int] = field(default_factory=dict)


def prepare(
    tx: np.ndarray,
    rx: np.ndarray,
    echoes: np.ndarray,
    hosts: KeyIndex,
    spacing_tol: tuple[int, int],
    threads: int = 1,
) -> ProbeSamples:
    """Join, filter and count. ``hosts`` indexes every host id of the window.

    With ``threads=2`` the echo half runs in a second thread (numpy releases the GIL
    in these loops). That helps only on an otherwise idle box: measured on the shared
    development machine (load 5) it made the solve slower, so 1 is the default."""
    n_hosts = len(hosts)
    if threads > 1:
        with ThreadPoolExecutor(max_workers=1) as pool:
            echo_job = pool.submit(_echo_samples, echoes, hosts, n_hosts, spacing_tol)
            probe = _probe_samples(tx, rx, hosts, n_hosts, spacing_tol)
            echo_rows, echoer, prober, echo_drops = echo_job.result()
    else:
        probe = _probe_samples(tx, rx, hosts, n_hosts, spacing_tol)
        echo_rows, echoer, prober, echo_drops = _echo_samples(echoes, hosts, n_hosts, spacing_tol)
    rx_src_i, rx_dst_i, t_tx, matched, rx_ns, pure_rows, drops = probe
    drops.update(echo_drops)
    return ProbeSamples(
        rx_src_i=rx_src_i,
        rx_dst_i=rx_dst_i,
        tx_ns=t_tx,
        matched=matched,
        rx_ns=rx_ns,
        pure_rows=pure_rows,
        echo_rows=echo_rows,
        echo_src_i=echoer,
        echo_dst_i=prober,
        drops=drops,
    )


def _probe_samples(
    tx: np.ndarray, rx: np.ndarray, hosts: KeyIndex, n_hosts: int, spacing_tol: tuple[int, int]
) -> tuple:
    drops: dict[str, int] = {}
    # ---- TX: sender index, slot, TX time per slot --------------------------------
    tx_src_i = host_index_of(hosts, tx["src"])
    tx_seq = tx["seq"].astype(np.int64)
    layout = SeqLayout(tx_src_i, tx_seq, n_hosts)
    tx_time = SlotValues(layout, layout.own_position(tx_src_i, tx_seq), tx["tx_ns"])
    drops["tx_duplicate"] = tx_time.written - tx_time.stored

    # ---- RX: join ------------------------------------------------------------------
    rx_src = np.ascontiguousarray(rx["src"])
    rx_seq = rx["seq"].astype(np.int64)
    rx_ns = np.ascontiguousarray(rx["rx_ns"])
    rx_dst_i = host_index_of(hosts, rx["dst"])
    rx_src_i = hosts.lookup(rx_src)
    rx_pos = layout.position(rx_src_i, rx_seq)
    t_tx = tx_time.get(rx_pos)
    matched = (t_tx != _NONE) & (rx_dst_i >= 0)
    n_matched = int(np.count_nonzero(matched))
    drops["rx_without_tx"] = len(rx) - n_matched
    drops["tx_without_rx"] = max(tx_time.stored - n_matched, 0)

    # ---- coded pairs ---------------------------------------------------------------
    first = np.flatnonzero(matched & ((rx_seq & 1) == 0))  # pair 0 <=> even seq
    partner = _pair_partners(rx_src, rx_seq, first, matched, rx_src_i, n_hosts)
    complete = partner >= 0
    drops["pair_incomplete"] = int(np.count_nonzero(~complete))
    f, p = first[complete], partner[complete]
    tx_gap = t_tx[p] - t_tx[f]
    rx_gap = rx_ns[p] - rx_ns[f]
    if spacing_tol[0] == spacing_tol[1] or int(rx["ts_kind"].max(initial=0)) < TsKind.HW:
        tol: np.ndarray | int = spacing_tol[0]  # no NIC timestamps: one sequential read
    else:
        tol = _tolerance(rx["ts_kind"][f], rx["ts_kind"][p], spacing_tol)
    ok = (tx_gap > 0) & (np.abs(rx_gap - tx_gap) <= tol)
    drops["pair_impure"] = int(np.count_nonzero(~ok))
    drops["pair_pure"] = int(np.count_nonzero(ok))
    return rx_src_i, rx_dst_i, t_tx, matched, rx_ns, f[ok], drops


def _echo_samples(
    echoes: np.ndarray, hosts: KeyIndex, n_hosts: int, spacing_tol: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Echo return legs (echoer -> prober): t3 on the echoer's clock, t4 on the prober's.

    Reading one field of a structured array reads every cache line of it, so only
    ``src`` and ``seq`` are read in full; the times are gathered for pair rows only."""
    drops: dict[str, int] = {}
    e_src = np.ascontiguousarray(echoes["src"])
    e_seq = echoes["seq"].astype(np.int64)
    e_src_i = host_index_of(hosts, e_src)
    usable = e_src_i >= 0
    e_first = np.flatnonzero(usable & ((e_seq & 1) == 0))
    e_part = _pair_partners(e_src, e_seq, e_first, usable, e_src_i, n_hosts)
    e_complete = e_part >= 0
    drops["echo_pair_incomplete"] = int(np.count_nonzero(~e_complete))
    a, b = e_first[e_complete], e_part[e_complete]
    ea, eb = take_rows(echoes, a), take_rows(echoes, b)  # all fields at once
    sane = (ea["t4_ns"] >= ea["t1_ns"]) & (ea["t3_ns"] >= ea["t2_ns"])
    sane &= (eb["t4_ns"] >= eb["t1_ns"]) & (eb["t3_ns"] >= eb["t2_ns"])
    sane &= (ea["dst"] == eb["dst"]) & (ea["dst"] != ea["src"])
    drops["echo_bad"] = int(np.count_nonzero(~sane))
    gap3 = eb["t3_ns"] - ea["t3_ns"]
    gap4 = eb["t4_ns"] - ea["t4_ns"]
    tol = _tolerance(ea["ts_kind"], eb["ts_kind"], spacing_tol)
    e_ok = sane & (gap3 > 0) & (np.abs(gap4 - gap3) <= tol)
    drops["echo_pair_impure"] = int(np.count_nonzero(sane & ~e_ok))
    echo_rows = a[e_ok]
    echoer = hosts.lookup(ea["dst"][e_ok])
    known = echoer >= 0
    drops["echo_unknown_host"] = int(np.count_nonzero(~known))
    echo_rows, echoer = echo_rows[known], echoer[known]
    drops["echo_pair_pure"] = len(echo_rows)
    return echo_rows, echoer, e_src_i[echo_rows], drops
