"""Synthetic but consistent fleet traffic: real segments for tests and benchmarks.

Host ``i`` of an ``n``-host fleet probes buddies ``i+1 .. i+buddies`` (mod n) on
``ports`` source ports, so each second it sends ``buddies * ports`` probes
(80 by default, the collector's default rate) and receives the same number from hosts
``i-1 .. i-buddies``. Sequence numbers are ``second * probes_per_s + k`` per sender, so
the receiver's ``probe_rx`` rows join the sender's ``probe_tx`` rows exactly as real
collector output does. One call = one host's one-second segment (what a collector ships
per ``spool.roll_s``), encoded with :mod:`collector.wire`.
"""

from __future__ import annotations

import numpy as np

from collector import records, wire

DEFAULT_BUDDIES = 10
DEFAULT_PORTS = 8
NS = 1_000_000_000


def host_name(i: int) -> str:
    return f"gpu{i:05d}"


def host_ids(n: int) -> np.ndarray:
    return np.array([records.host_id(host_name(i)) for i in range(n)], dtype=np.int64)


def _tx_rows(
    src_i: int, ids: np.ndarray, second: int, t0_ns: int, buddies: int, ports: int
) -> np.ndarray:
    n = len(ids)
    per_s = buddies * ports
    k = np.arange(per_s)
    rows = np.zeros(per_s, records.PROBE_TX)
    rows["seq"] = second * per_s + k
    rows["src"] = ids[src_i]
    rows["dst"] = ids[(src_i + 1 + k // ports) % n]
    rows["sport"] = 40000 + k % ports
    rows["dport"] = 7470
    rows["pair"] = k % 2
    rows["ts_kind"] = records.TsKind.SW
    # spread over the second, pairs 20 µs apart
    rows["tx_ns"] = t0_ns + second * NS + (k // 2) * (NS // (per_s // 2)) + (k % 2) * 20_000
    return rows


def fleet_segment(
    i: int,
    ids: np.ndarray,
    second: int,
    *,
    t0_ns: int,
    segment: int | None = None,
    buddies: int = DEFAULT_BUDDIES,
    ports: int = DEFAULT_PORTS,
    delay_ns: int = 5_000,
    jitter_ns: int = 2_000,
    loss: float = 0.0,
    rng: np.random.Generator | None = None,
) -> bytes:
    """Host ``i``'s segment for ``second``: its probe_tx and the probe_rx it recorded."""
    rng = rng or np.random.default_rng(i * 1_000_003 + second)
    n = len(ids)
    tx = _tx_rows(i, ids, second, t0_ns, buddies, ports)
    senders = [(i - d) % n for d in range(1, buddies + 1)]
    incoming = np.concatenate([_tx_rows(s, ids, second, t0_ns, buddies, ports) for s in senders])
    incoming = incoming[incoming["dst"] == ids[i]]
    if loss > 0:
        incoming = incoming[rng.random(len(incoming)) >= loss]
    rx = np.zeros(len(incoming), records.PROBE_RX)
    for name in ("seq", "src", "dst", "sport", "dport", "pair", "ts_kind"):
        rx[name] = incoming[name]
    rx["ttl"] = 61
    rx["spacing_ns"] = 20_000
    rx["rx_ns"] = incoming["tx_ns"] + delay_ns + rng.integers(0, jitter_ns + 1, len(incoming))
    name = host_name(i)
    seg_id = second if segment is None else segment
    return (
        wire.encode_header(name, int(ids[i]), seg_id, t0_ns + (second + 1) * NS)
        + wire.encode_chunk("probe_tx", tx)
        + wire.encode_chunk("probe_rx", rx)
    )


def counter_segment(
    host: str, segment: int, samples: list[tuple[int, str, str, int, int]]
) -> bytes:
    """A segment of counter rows: (ts_ns, device, name, value, delta) each."""
    hid = records.host_id(host)
    rows = np.zeros(len(samples), records.COUNTER)
    for j, (ts, device, cname, value, delta) in enumerate(samples):
        rows[j]["ts_ns"] = ts
        rows[j]["host"] = hid
        rows[j]["device"] = device.encode()
        rows[j]["name"] = cname.encode()
        rows[j]["value"] = value
        rows[j]["delta"] = delta
    return wire.encode_header(host, hid, segment, samples[0][0]) + wire.encode_chunk(
        "counter", rows
    )
