"""Join PROBE_TX to PROBE_RX, apply the coded-probe filter, take echo return legs.

Everything is O(n) scatter/gather, no sort of millions of rows:

- The fields read are first copied out of the records into contiguous columns,
  one pass per record array (:func:`columns`).
- A probe is addressed by (sender index, seq - that sender's smallest seq in the
  window): a dense slot per window (:class:`SeqLayout`). TX times are scattered
  into their slots (TX rows come per sender in seq order, so the writes stream),
  and each RX row gathers its TX time from its slot.
- Coded pairs: the second probe of a pair nearly always arrives right after the
  first at the same receiver, so the partner is looked for in the next row first;
  the few pairs split by other traffic are found through a slot table.
- Echoes likewise (a prober records the two echoes of a pair back to back).

Drop reasons are counted in ``drops``, never silent.

Over 500 lines: the join, the coded filter and the echo legs share the slot tables and the
cache-sized blocks they are processed in (the solver's hot path, kept together).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from analytics.clock.key_index import KeyIndex
from analytics.clock.pair_fit import in_blocks
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


# Rows per chunk of :func:`columns`: a chunk of every record dtype (<= 64 B a row)
# stays in the L2 cache while its fields are copied out.
_CHUNK_ROWS = 16_384


def columns(
    records: np.ndarray,
    names: tuple[str, ...],
    out: list[np.ndarray] | None = None,
    at: int = 0,
) -> list[np.ndarray]:
    """Contiguous copies of several fields of a structured array, in one pass.

    Reading one field reads every cache line of the records, so copying k fields
    one after the other streams the whole array from memory k times; copying them
    chunk by chunk (each chunk still in cache for the next field) streams it once.
    ``seq`` (uint64) comes out as int64. With ``out`` (one array per name) the fields
    are written into ``out[i][at:at + len(records)]`` instead of new arrays."""
    views = [records[name] for name in names]
    views = [v.view(np.int64) if v.dtype == np.uint64 else v for v in views]
    n = len(records)
    if out is None:
        out, at = [np.empty(n, v.dtype) for v in views], 0
    for start in range(0, n, _CHUNK_ROWS):
        end = min(start + _CHUNK_ROWS, n)
        for dst, view in zip(out, views, strict=True):
            dst[at + start : at + end] = view[start:end]
    return out


@dataclass
class RecordColumns:
    """The fields of a window's records the solver reads, as contiguous columns."""

    tx_src: np.ndarray
    tx_seq: np.ndarray  # int64
    tx_ns: np.ndarray
    rx_src: np.ndarray
    rx_seq: np.ndarray  # int64
    rx_dst: np.ndarray
    rx_ns: np.ndarray
    rx_kind: np.ndarray
    e_src: np.ndarray  # the prober
    e_seq: np.ndarray  # int64
    e_dst: np.ndarray  # the echoer
    e_t1: np.ndarray
    e_t2: np.ndarray
    e_t3: np.ndarray
    e_t4: np.ndarray
    e_kind: np.ndarray


_TX_FIELDS = ("src", "seq", "tx_ns")
_RX_FIELDS = ("src", "seq", "dst", "rx_ns", "ts_kind")
_ECHO_FIELDS = ("src", "seq", "dst", "t1_ns", "t2_ns", "t3_ns", "t4_ns", "ts_kind")


def extract(
    tx: np.ndarray, rx: np.ndarray, echoes: np.ndarray, pool: ThreadPoolExecutor | None = None
) -> RecordColumns:
    """:func:`columns` of the three record arrays (echoes in ``pool`` when given)."""
    job = pool.submit(columns, echoes, _ECHO_FIELDS) if pool is not None else None
    t = columns(tx, _TX_FIELDS)
    r = columns(rx, _RX_FIELDS)
    e = job.result() if job is not None else columns(echoes, _ECHO_FIELDS)
    return RecordColumns(*t, *r, *e)


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
        rel = seq - np.take(self.base, h, mode="wrap")
        # one unsigned compare checks 0 <= rel < span; unknown hosts have span 0 at
        # index 0 only if host 0 has no rows, so they are masked explicitly
        ok = rel.view(np.uint64) < np.take(self.span, h, mode="wrap").view(np.uint64)
        ok &= host_i >= 0
        rel += np.take(self.offset, h, mode="wrap")
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
            # pos -1 reads the last slot, which no write reaches: _NONE
            return np.take(self.table, pos, mode="wrap")
        elif len(self.keys) == 0:
            return np.full(len(pos), _NONE, np.int64)
        else:
            i = np.searchsorted(self.keys, pos).clip(0, len(self.keys) - 1)
            out = np.where(
                np.take(self.keys, i, mode="wrap") == pos,
                np.take(self.table, i, mode="wrap"),
                _NONE,
            )
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
    if len(first) == 0:
        return np.full(0, -1, np.intp)
    # next row is the partner: same sender, seq + 1, usable (shifted compares, no gather)
    nxt_ok = np.zeros(n, bool)
    nxt_ok[:-1] = (src[1:] == src[:-1]) & (seq[1:] == seq[:-1] + 1) & usable[1:]
    hit = np.take(nxt_ok, first, mode="wrap")
    partner = np.where(hit, first + 1, -1)
    miss = np.flatnonzero(~hit)
    if len(miss):
        unclaimed = usable & ((seq & 1) == 1)
        unclaimed[first[hit] + 1] = False
        odd = np.flatnonzero(unclaimed)
        if len(odd):
            layout = SeqLayout(host_i[odd], seq[odd], n_hosts)
            slots = SlotValues(layout, layout.position(host_i[odd], seq[odd]), odd)
            f = first[miss]
            found = slots.get(layout.position(host_i[f], seq[f] + 1))
            partner[miss] = np.where(found != _NONE, found, -1)
    return partner


def _tolerance(
    kind: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    spacing_tol: tuple[int, int],
    any_hw: bool | None = None,
) -> np.ndarray | int:
    """Per coded pair (rows ``a``, ``b``): the hardware tolerance when all its
    timestamps are NIC/RDMA ones; one int when no row has a NIC timestamp
    (``any_hw``: whether any row of ``kind`` has one, when the caller knows)."""
    if any_hw is None:
        any_hw = int(kind.max(initial=0)) >= TsKind.HW
    if spacing_tol[0] == spacing_tol[1] or not any_hw:
        return spacing_tol[0]
    hw = (np.take(kind, a, mode="wrap") >= TsKind.HW) & (np.take(kind, b, mode="wrap") >= TsKind.HW)
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
    echo_t3: np.ndarray  # per echo row: t3 (echoer's clock)
    echo_t4: np.ndarray  # per echo row: t4 (prober's clock)
    drops: dict[str, int] = field(default_factory=dict)


def prepare(
    cols: RecordColumns,
    hosts: KeyIndex,
    spacing_tol: tuple[int, int],
    pool: ThreadPoolExecutor | None = None,
) -> ProbeSamples:
    """Join, filter and count. ``hosts`` indexes every host id of the window.

    With a ``pool`` the echo half runs in its thread (numpy releases the GIL in
    these loops): faster on an otherwise idle box, see ``SolverConfig.threads``."""
    n_hosts = len(hosts)
    if pool is not None:
        # the pool thread builds the TX slots while this one looks up the RX hosts,
        # then does the echo half while this one joins and filters
        tx_job = pool.submit(_tx_slots, cols, hosts, n_hosts)
        echo_job = pool.submit(_echo_samples, cols, hosts, n_hosts, spacing_tol)
        probe = _probe_samples(cols, hosts, n_hosts, spacing_tol, tx_job.result, False)
        echo = echo_job.result()
    else:
        tx_slots = partial(_tx_slots, cols, hosts, n_hosts)
        probe = _probe_samples(cols, hosts, n_hosts, spacing_tol, tx_slots)
        echo = _echo_samples(cols, hosts, n_hosts, spacing_tol)
    rx_src_i, rx_dst_i, t_tx, matched, pure_rows, drops = probe
    echo_rows, echoer, prober, t3, t4, echo_drops = echo
    drops.update(echo_drops)
    return ProbeSamples(
        rx_src_i=rx_src_i,
        rx_dst_i=rx_dst_i,
        tx_ns=t_tx,
        matched=matched,
        rx_ns=cols.rx_ns,
        pure_rows=pure_rows,
        echo_rows=echo_rows,
        echo_src_i=echoer,
        echo_dst_i=prober,
        echo_t3=t3,
        echo_t4=t4,
        drops=drops,
    )


def _tx_slots(cols: RecordColumns, hosts: KeyIndex, n_hosts: int) -> tuple[SeqLayout, SlotValues]:
    """TX side of the join: sender index, slot, TX time per slot."""
    fast = _tx_slots_in_place(cols, hosts, n_hosts)
    if fast is not None:
        return fast
    tx_src_i = host_index_of(hosts, cols.tx_src)
    layout = SeqLayout(tx_src_i, cols.tx_seq, n_hosts)
    return layout, SlotValues(layout, layout.own_position(tx_src_i, cols.tx_seq), cols.tx_ns)


def _tx_slots_in_place(
    cols: RecordColumns, hosts: KeyIndex, n_hosts: int
) -> tuple[SeqLayout, SlotValues] | None:
    """The TX slots when every sender's rows are one run of consecutive seqs (as the
    collectors ship them): the slot of a TX row is its row, no scatter. None otherwise."""
    src, seq, t = cols.tx_src, cols.tx_seq, cols.tx_ns
    n = len(seq)
    if n == 0:
        return None
    starts = np.concatenate(([0], np.flatnonzero(src[1:] != src[:-1]) + 1))
    h = hosts.lookup(src[starts])
    if (h < 0).any() or np.bincount(h, minlength=n_hosts).max() > 1:
        return None  # a sender unknown, or in more than one run
    step = seq[1:] - seq[:-1]
    step[starts[1:] - 1] = 1  # across runs: not a step
    if not (step == 1).all():
        return None
    layout = SeqLayout.__new__(SeqLayout)
    layout.base = np.zeros(n_hosts, np.int64)
    layout.span = np.zeros(n_hosts, np.int64)
    layout.offset = np.zeros(n_hosts, np.int64)
    layout.base[h] = seq[starts]
    layout.span[h] = np.diff(np.append(starts, n))
    layout.offset[h] = starts
    layout.total = n
    layout.dense = True
    values = SlotValues.__new__(SlotValues)
    values.dense = True
    values.table = np.empty(n + 1, np.int64)
    values.table[:n] = t
    values.table[n] = _NONE  # slot -1 reads it
    values.stored = int(np.count_nonzero(t != _NONE))
    values.written = n
    return layout, values


def _probe_samples(
    cols: RecordColumns,
    hosts: KeyIndex,
    n_hosts: int,
    spacing_tol: tuple[int, int],
    tx_slots: Callable[[], tuple[SeqLayout, SlotValues]],
    tx_ready: bool = True,
) -> tuple:
    """RX side of the join and the coded filter; ``tx_slots()`` gives the TX side
    (computed meanwhile in another thread when ``tx_ready`` is False).

    Row-wise work runs in blocks of ``BLOCK_ROWS`` rows (cache-sized temporaries);
    the results are those of whole-array passes."""
    drops: dict[str, int] = {}
    rx_src, rx_seq, rx_ns, rx_dst = cols.rx_src, cols.rx_seq, cols.rx_ns, cols.rx_dst
    n = len(rx_seq)
    rx_dst_i = np.empty(n, np.intp)
    rx_src_i = np.empty(n, np.intp)
    t_tx = np.empty(n, np.int64)
    matched = np.empty(n, bool)
    slots: tuple[SeqLayout, SlotValues] | None = tx_slots() if tx_ready else None

    def lookups(sl: slice) -> None:
        rx_dst_i[sl] = host_index_of(hosts, rx_dst[sl])
        rx_src_i[sl] = hosts.lookup(rx_src[sl])

    def join(sl: slice) -> None:
        assert slots is not None
        layout, tx_time = slots
        t = t_tx[sl]
        t[:] = tx_time.get(layout.position(rx_src_i[sl], rx_seq[sl]))
        m = matched[sl]
        np.not_equal(t, _NONE, out=m)
        m &= rx_dst_i[sl] >= 0

    if slots is None:  # look the hosts up while the other thread builds the TX slots
        in_blocks(None, n, lookups)
        slots = tx_slots()
        in_blocks(None, n, join)
    else:

        def both(sl: slice) -> None:
            lookups(sl)
            join(sl)

        in_blocks(None, n, both)
    tx_time = slots[1]
    drops["tx_duplicate"] = tx_time.written - tx_time.stored
    n_matched = int(np.count_nonzero(matched))
    drops["rx_without_tx"] = n - n_matched
    drops["tx_without_rx"] = max(tx_time.stored - n_matched, 0)

    # ---- coded pairs ---------------------------------------------------------------
    # The first probe of a pair (even seq) is nearly always followed by its partner
    # (seq + 1, same sender): tested on the next row, block by block; the rest are
    # looked up afterwards in a slot table of the odd rows no first has claimed.
    any_hw = int(cols.rx_kind.max(initial=0)) >= TsKind.HW
    pure = np.zeros(n, bool)  # first rows of pure pairs
    claimed = np.zeros(n, bool)  # second rows of pairs found on the next row
    miss_parts: list[np.ndarray] = []
    counts = np.zeros(2, np.int64)  # complete pairs (next row), of which pure

    def coded(sl: slice) -> None:
        start, stop = sl.start, sl.stop
        end = min(stop + 1, n)  # one row more: the partner of the block's last row
        m = matched[start:end]
        first = np.flatnonzero(m[: stop - start] & ((rx_seq[sl] & 1) == 0))
        if len(first) == 0:
            return
        src, seq = rx_src[start:end], rx_seq[start:end]
        nxt_ok = np.zeros(end - start, bool)
        nxt_ok[:-1] = (src[1:] == src[:-1]) & (seq[1:] == seq[:-1] + 1) & m[1:]
        hit = np.take(nxt_ok, first, mode="wrap")
        miss_parts.append(first[~hit] + start)
        f = first[hit]
        f += start
        p = f + 1
        claimed[p] = True
        ok = _pure(t_tx, rx_ns, cols.rx_kind, f, p, spacing_tol, any_hw)
        pure[f[ok]] = True
        counts[0] += len(f)
        counts[1] += int(np.count_nonzero(ok))

    in_blocks(None, n, coded)
    miss = np.concatenate(miss_parts) if miss_parts else np.empty(0, np.intp)
    n_complete, n_pure = int(counts[0]), int(counts[1])
    n_incomplete = len(miss)
    if len(miss):
        unclaimed = matched & ((rx_seq & 1) == 1)
        unclaimed[claimed] = False
        odd = np.flatnonzero(unclaimed)
        if len(odd):
            lay = SeqLayout(rx_src_i[odd], rx_seq[odd], n_hosts)
            odd_slots = SlotValues(lay, lay.position(rx_src_i[odd], rx_seq[odd]), odd)
            found = odd_slots.get(lay.position(rx_src_i[miss], rx_seq[miss] + 1))
            got = found != _NONE
            f, p = miss[got], found[got]
            ok = _pure(t_tx, rx_ns, cols.rx_kind, f, p, spacing_tol, any_hw)
            pure[f[ok]] = True
            n_complete += len(f)
            n_pure += int(np.count_nonzero(ok))
            n_incomplete -= len(f)
    drops["pair_incomplete"] = n_incomplete
    drops["pair_impure"] = n_complete - n_pure
    drops["pair_pure"] = n_pure
    return rx_src_i, rx_dst_i, t_tx, matched, np.flatnonzero(pure), drops


def _pure(
    t_tx: np.ndarray,
    rx_ns: np.ndarray,
    kind: np.ndarray,
    f: np.ndarray,
    p: np.ndarray,
    spacing_tol: tuple[int, int],
    any_hw: bool,
) -> np.ndarray:
    """The coded filter on pairs of RX rows (first ``f``, partner ``p``): the receive
    spacing equals the send spacing within the tolerance, and the send spacing is > 0."""
    tx_gap = np.take(t_tx, p, mode="wrap") - np.take(t_tx, f, mode="wrap")
    rx_gap = np.take(rx_ns, p, mode="wrap") - np.take(rx_ns, f, mode="wrap")
    tol = _tolerance(kind, f, p, spacing_tol, any_hw)
    rx_gap -= tx_gap
    ok = np.abs(rx_gap, out=rx_gap) <= tol
    ok &= tx_gap > 0
    return ok


def _echo_samples(
    cols: RecordColumns, hosts: KeyIndex, n_hosts: int, spacing_tol: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Echo return legs (echoer -> prober): t3 on the echoer's clock, t4 on the prober's."""
    drops: dict[str, int] = {}
    e_src, e_seq = cols.e_src, cols.e_seq
    e_src_i = host_index_of(hosts, e_src)
    usable = e_src_i >= 0
    e_first = np.flatnonzero(usable & ((e_seq & 1) == 0))
    e_part = _pair_partners(e_src, e_seq, e_first, usable, e_src_i, n_hosts)
    e_complete = e_part >= 0
    drops["echo_pair_incomplete"] = int(np.count_nonzero(~e_complete))
    a, b = e_first[e_complete], e_part[e_complete]
    # per row first (sequential), then per pair (two gathers)
    row_ok = cols.e_t4 >= cols.e_t1
    row_ok &= cols.e_t3 >= cols.e_t2
    row_ok &= cols.e_dst != e_src
    sane = np.take(row_ok, a, mode="wrap") & np.take(row_ok, b, mode="wrap")
    dst_a = np.take(cols.e_dst, a, mode="wrap")
    sane &= dst_a == np.take(cols.e_dst, b, mode="wrap")
    drops["echo_bad"] = int(np.count_nonzero(~sane))
    t3a, t4a = np.take(cols.e_t3, a, mode="wrap"), np.take(cols.e_t4, a, mode="wrap")
    gap3 = np.take(cols.e_t3, b, mode="wrap") - t3a
    gap4 = np.take(cols.e_t4, b, mode="wrap") - t4a
    tol = _tolerance(cols.e_kind, a, b, spacing_tol)
    gap4 -= gap3
    e_ok = np.abs(gap4, out=gap4) <= tol
    e_ok &= gap3 > 0
    e_ok &= sane
    drops["echo_pair_impure"] = int(np.count_nonzero(sane & ~e_ok))
    sel = np.flatnonzero(e_ok)
    echo_rows = a[sel]
    echoer = hosts.lookup(dst_a[sel])
    known = echoer >= 0
    drops["echo_unknown_host"] = int(np.count_nonzero(~known))
    if not known.all():
        sel, echo_rows, echoer = sel[known], echo_rows[known], echoer[known]
    drops["echo_pair_pure"] = len(echo_rows)
    return echo_rows, echoer, e_src_i[echo_rows], t3a[sel], t4a[sel], drops
