"""Join PROBE_TX to PROBE_RX, apply the coded-probe filter, take echo return legs.

Everything is O(n) scatter/gather: rows are addressed by (host index, seq -
that host's smallest seq in the window), a dense table per window, so there is
no sort of millions of rows. Drop reasons are counted, never silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analytics.clock.key_index import KeyIndex

# Above this many table slots per row we use the sorting join instead (a collector
# restart inside a window makes its seq jump: a dense table would be huge).
_MAX_SLOTS_PER_ROW = 8


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


class SeqTable:
    """Row of each (host, seq) of one record table, addressed without sorting."""

    def __init__(self, host_i: np.ndarray, seq: np.ndarray, n_hosts: int) -> None:
        self.n_hosts = n_hosts
        valid = host_i >= 0
        big = np.iinfo(np.int64).max
        lo = np.full(n_hosts, big, np.int64)
        hi = np.full(n_hosts, -1, np.int64)
        if valid.any():
            np.minimum.at(lo, host_i[valid], seq[valid])
            np.maximum.at(hi, host_i[valid], seq[valid])
        has = hi >= 0
        self.base = np.where(has, lo, 0)
        self.span = np.where(has, hi - lo + 1, 0)
        total = int(self.span.sum())
        self.dense = total <= _MAX_SLOTS_PER_ROW * max(len(seq), 1) + 1024
        self.offset = np.concatenate(([0], np.cumsum(self.span)[:-1])).astype(np.int64)
        pos = self.position(host_i, seq)
        rows = np.flatnonzero(pos >= 0)
        if self.dense:
            self.at = np.full(total + 1, -1, np.intp)
            self.at[pos[rows]] = rows
            winner = self.at[pos[rows]] == rows
        else:
            order = np.argsort(pos[rows], kind="stable")
            self.sorted_pos = pos[rows][order]
            self.sorted_rows = rows[order]
            # keep the last of equal positions, like the dense table does
            last = np.ones(len(order), bool)
            last[:-1] = self.sorted_pos[1:] != self.sorted_pos[:-1]
            self.sorted_pos = self.sorted_pos[last]
            self.sorted_rows = self.sorted_rows[last]
            winner = np.zeros(len(rows), bool)
            winner[order[last]] = True
        self.duplicates = int(len(rows) - winner.sum())
        self.is_kept = np.zeros(len(seq), bool)
        self.is_kept[rows[winner]] = True

    def position(self, host_i: np.ndarray, seq: np.ndarray, plus: int = 0) -> np.ndarray:
        """Slot of (host, seq + plus); -1 where it cannot be in this table."""
        h = np.where(host_i >= 0, host_i, 0)
        rel = seq - self.base[h] + plus
        ok = (host_i >= 0) & (rel >= 0) & (rel < self.span[h])
        return np.where(ok, self.offset[h] + rel, -1)

    def row_at(self, pos: np.ndarray) -> np.ndarray:
        """Row stored at each slot, -1 for none (or for pos == -1)."""
        if self.dense:
            return np.where(pos >= 0, self.at[np.maximum(pos, 0)], -1)
        i = np.searchsorted(self.sorted_pos, pos).clip(0, max(len(self.sorted_pos) - 1, 0))
        if len(self.sorted_pos) == 0:
            return np.full(len(pos), -1, np.intp)
        hit = (pos >= 0) & (self.sorted_pos[i] == pos)
        return np.where(hit, self.sorted_rows[i], -1)


@dataclass
class ProbeSamples:
    """Matched probes (for one-way delays) and pure samples (for the clock fit)."""

    # every matched probe: indices into the rx array and host indices
    rx_row: np.ndarray
    tx_row: np.ndarray
    src_i: np.ndarray
    dst_i: np.ndarray
    pure: np.ndarray  # bool per matched probe: first probe of a pure coded pair
    # echo return legs that passed the coded filter: sender (echoer) -> receiver
    echo_row: np.ndarray
    echo_src_i: np.ndarray  # the echoing host (sent the return leg at t3)
    echo_dst_i: np.ndarray  # the prober (received it at t4)
    drops: dict[str, int] = field(default_factory=dict)


def _seq(a: np.ndarray) -> np.ndarray:
    return a["seq"].astype(np.int64)


def prepare(
    tx: np.ndarray, rx: np.ndarray, echoes: np.ndarray, hosts: KeyIndex, spacing_tol_ns: int
) -> ProbeSamples:
    """Join, filter and count. ``hosts`` indexes every host id of the window."""
    n_hosts = len(hosts)
    drops: dict[str, int] = {}

    tx_src = host_index_of(hosts, tx["src"])
    tx_seq = _seq(tx)
    table = SeqTable(tx_src, tx_seq, n_hosts)
    drops["tx_duplicate"] = table.duplicates

    rx_dst = host_index_of(hosts, rx["dst"])
    rx_src = hosts.lookup(rx["src"])
    rx_seq = _seq(rx)
    pos = table.position(rx_src, rx_seq)
    tx_row = table.row_at(pos)
    matched = tx_row >= 0
    drops["rx_without_tx"] = int((~matched).sum())
    # the TX row must describe the same probe
    same = np.zeros(len(rx), bool)
    same[matched] = (tx["dst"][tx_row[matched]] == rx["dst"][matched]) & (rx_dst[matched] >= 0)
    drops["rx_mismatch"] = int((matched & ~same).sum())
    matched &= same
    # duplicates of RX (a replayed batch): keep one
    rx_table = SeqTable(np.where(matched, rx_src, -1), rx_seq, n_hosts)
    drops["rx_duplicate"] = rx_table.duplicates
    matched &= rx_table.is_kept
    drops["tx_without_rx"] = int(table.is_kept.sum() - matched.sum())

    m_rows = np.flatnonzero(matched)
    m_tx = tx_row[m_rows]
    # Coded pairs: the first probe (even seq, pair 0) and its partner (seq + 1).
    first = (rx_seq[m_rows] & 1) == 0
    first &= rx["pair"][m_rows] == 0
    f_rows = m_rows[first]
    f_tx = m_tx[first]
    p_pos = rx_table.position(rx_src[f_rows], rx_seq[f_rows], plus=1)
    p_rx = rx_table.row_at(p_pos)
    p_tx = np.where(p_rx >= 0, tx_row[np.maximum(p_rx, 0)], -1)
    complete = (p_rx >= 0) & (p_tx >= 0)
    drops["pair_incomplete"] = int((~complete).sum())
    tx_ns = tx["tx_ns"]
    rx_ns = rx["rx_ns"]
    c_rows, c_tx, c_prx, c_ptx = f_rows[complete], f_tx[complete], p_rx[complete], p_tx[complete]
    tx_gap = tx_ns[c_ptx] - tx_ns[c_tx]
    rx_gap = rx_ns[c_prx] - rx_ns[c_rows]
    ok = (tx_gap > 0) & (np.abs(rx_gap - tx_gap) <= spacing_tol_ns)
    drops["pair_impure"] = int((~ok).sum())
    drops["pair_pure"] = int(ok.sum())
    pure_rx = np.zeros(len(rx), bool)
    pure_rx[c_rows[ok]] = True

    # Echo return legs (echoer -> prober): t3 on the echoer's clock, t4 on the prober's.
    e_src = host_index_of(hosts, echoes["src"])  # the prober (recorded the echo)
    e_dst = hosts.lookup(echoes["dst"])
    e_seq = _seq(echoes)
    t1, t2, t3, t4 = (echoes[k] for k in ("t1_ns", "t2_ns", "t3_ns", "t4_ns"))
    sane = (e_src >= 0) & (e_dst >= 0) & (t4 >= t1) & (t3 >= t2) & (e_src != e_dst)
    drops["echo_bad"] = int((~sane).sum())
    etable = SeqTable(np.where(sane, e_src, -1), e_seq, n_hosts)
    drops["echo_duplicate"] = etable.duplicates
    keep = sane & etable.is_kept
    e_first = np.flatnonzero(keep & ((e_seq & 1) == 0))
    e_pos = etable.position(e_src[e_first], e_seq[e_first], plus=1)
    e_part = etable.row_at(e_pos)
    e_complete = e_part >= 0
    drops["echo_pair_incomplete"] = int((~e_complete).sum())
    a, b = e_first[e_complete], e_part[e_complete]
    gap3 = t3[b] - t3[a]
    gap4 = t4[b] - t4[a]
    e_ok = (gap3 > 0) & (np.abs(gap4 - gap3) <= spacing_tol_ns) & (e_dst[a] == e_dst[b])
    drops["echo_pair_impure"] = int((~e_ok).sum())
    drops["echo_pair_pure"] = int(e_ok.sum())
    echo_row = a[e_ok]

    return ProbeSamples(
        rx_row=m_rows,
        tx_row=m_tx,
        src_i=rx_src[m_rows],
        dst_i=rx_dst[m_rows],
        pure=pure_rx[m_rows],
        echo_row=echo_row,
        echo_src_i=e_dst[echo_row],
        echo_dst_i=e_src[echo_row],
        drops=drops,
    )
