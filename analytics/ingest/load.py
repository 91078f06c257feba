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
from collector.config import ECHO_EVERY_DEFAULT

DEFAULT_BUDDIES = 10
DEFAULT_PORTS = 8
# The fabric of the benchmark's fleet (:func:`topology`): racks of HOSTS_PER_RACK hosts,
# striped (host i in rack i mod racks), so a host's buddies i+1 .. i+10 are in 10 other
# racks, as a collector's probe.buddies_random (10) picks them; each leaf has SPINES
# uplinks. What a collector traces follows from it (:func:`_path_hops`).
HOSTS_PER_RACK = 32
SPINES = 4
TRACE_INTERVAL_S = 2.0  # collector probe.trace_interval_s
WATCH_INTERVAL_S = 0.2  # collector probe.watch_interval_s
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
    run_ns: int = 0,
) -> bytes:
    """Host ``i``'s segment for ``second``: its probe_tx and the probe_rx it recorded
    (``run_ns``: when its collector's run began to listen, in the header; 0: not said)."""
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
        # opened when the second it covers began, as a collector opens a segment before its rows
        wire.encode_header(name, int(ids[i]), seg_id, t0_ns + second * NS, run_ns)
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


# ---- whole-fleet traffic for the benchmark ---------------------------------------------
# What a collector at default settings puts in one 1-s segment besides its probes: the
# echoes of 1 coded pair in ECHO_EVERY_DEFAULT of its own (probe.echo_every), one sample of
# the backend netdev's statistics/ (counter rows) and its health values.
NETDEV_COUNTERS = (
    "collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped",
    "rx_errors", "rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors",
    "rx_nohandler", "rx_over_errors", "rx_packets", "tx_aborted_errors", "tx_bytes",
    "tx_carrier_errors", "tx_compressed", "tx_dropped", "tx_errors", "tx_fifo_errors",
    "tx_heartbeat_errors", "tx_packets", "tx_window_errors",
)  # fmt: skip
HEALTH_NAMES = (
    "probes_sent", "probes_received", "echoes_sent", "echoes_received", "tx_ts_kernel",
    "tx_ts_user", "rx_kernel_drops", "probes_rejected_auth", "probes_rejected_stale",
    "spool_dropped_rows", "spool_dropped_segments", "spool_rows_written", "batches_rejected",
    "counter_files_unreadable", "inband_received", "inband_rejected",
)  # fmt: skip


def racks_of(n: int, hosts_per_rack: int = HOSTS_PER_RACK, buddies: int = DEFAULT_BUDDIES) -> int:
    """How many racks an ``n``-host fleet has (at least buddies + 1: buddies in other racks)."""
    return max(buddies + 1, -(-n // hosts_per_rack))


def spine_address(rack: int, spine: int) -> str:
    """The address of spine ``spine`` on its link to leaf ``rack`` (what hop-2 answers of
    traces from that rack come from)."""
    return f"10.{spine}.{rack // 256}.{rack % 256}"


def topology(n: int, *, spines: int = SPINES, hosts_per_rack: int = HOSTS_PER_RACK) -> dict:
    """The topology file of the fleet :func:`host_seconds` describes (``analytics/topology.py``
    shape): hosts in racks ``leaf<r>``, each with its access link, and every leaf–spine link
    with the spine's address on it."""
    racks = racks_of(n, hosts_per_rack)
    hosts = [{"name": host_name(i), "rack": f"leaf{i % racks}"} for i in range(n)]
    links = [
        {"name": f"{host_name(i)}-leaf{i % racks}", "kind": "host",
         "a": {"node": host_name(i), "interface": "eth0"}, "b": {"node": f"leaf{i % racks}"}}
        for i in range(n)
    ] + [
        {"name": f"leaf{r}-spine{u}", "kind": "fabric",
         "a": {"node": f"leaf{r}", "address": f"10.{100 + u}.{r // 256}.{r % 256}"},
         "b": {"node": f"spine{u}", "address": spine_address(r, u)}}
        for r in range(racks) for u in range(spines)
    ]  # fmt: skip
    return {"hosts": hosts, "links": links}


def _path_hops(
    i: int, ids: np.ndarray, seconds: int, t0_ns: int, buddies: int, ports: int,
    spines: int, hosts_per_rack: int,
) -> np.ndarray:  # fmt: skip
    """Host ``i``'s ``path_hop`` rows over ``seconds``, as a default collector writes them:
    every TRACE_INTERVAL_S one trace per (buddy, port) — every buddy is in another rack —
    and every WATCH_INTERVAL_S one per (buddy's rack, spine): the 5-tuple that crosses it.
    Port p towards buddy b crosses spine (i + b + p) mod spines (ECMP, stable), and the
    answer comes from that spine's address on this host's leaf."""
    n, racks = len(ids), racks_of(len(ids), hosts_per_rack)
    rack = i % racks
    round_ns, watch_ns = int(TRACE_INTERVAL_S * NS), int(WATCH_INTERVAL_S * NS)
    span_ns = seconds * NS
    bud = np.arange(1, buddies + 1)
    # rounds: (buddy, port) at each round's start (phase by host), 20 µs apart
    starts = np.arange((i * 7_919_000) % round_ns, span_ns, round_ns)
    rb, rp = np.repeat(bud, ports), np.tile(np.arange(ports), buddies)
    r_ts = (starts[:, None] + np.arange(len(rb))[None, :] * 20_000).ravel()
    r_b, r_p = np.tile(rb, len(starts)), np.tile(rp, len(starts))
    # the watch: per buddy (its rack) and spine, the port that crosses that spine
    ticks = np.arange((i * 3_331_000) % watch_ns, span_ns, watch_ns)
    wb, wu = np.repeat(bud, spines), np.tile(np.arange(spines), buddies)
    wp = (wu - i - wb) % spines
    w_ts = (ticks[:, None] + np.arange(len(wb))[None, :] * 20_000).ravel()
    w_b, w_p = np.tile(wb, len(ticks)), np.tile(wp, len(ticks))
    ts = np.concatenate([r_ts, w_ts])
    b, p = np.concatenate([r_b, w_b]), np.concatenate([r_p, w_p])
    order = np.argsort(ts, kind="stable")
    ts, b, p = ts[order], b[order], p[order]
    out = np.zeros(len(ts), records.PATH_HOP)
    out["ts_ns"] = t0_ns + ts
    out["src"] = ids[i]
    out["dst"] = ids[(i + b) % n]
    out["sport"] = 40000 + p
    out["ttl"] = 2
    spine = (i + b + p) % spines
    names = np.array([spine_address(rack, u).encode() for u in range(spines)], "S16")
    out["hop"] = names[spine]
    out["rtt_ns"] = 30_000
    return out


def host_seconds(
    i: int,
    ids: np.ndarray,
    seconds: int,
    *,
    t0_ns: int,
    buddies: int = DEFAULT_BUDDIES,
    ports: int = DEFAULT_PORTS,
    delay_ns: int = 5_000,
    jitter_ns: int = 2_000,
    echo_every: int = ECHO_EVERY_DEFAULT,
    extras: bool = True,
    spines: int = 0,
    hosts_per_rack: int = HOSTS_PER_RACK,
    span: int = 1,
    rng: np.random.Generator | None = None,
) -> list[bytes]:
    """Host ``i``'s segments for seconds ``0 .. seconds-1``, each covering ``span`` seconds
    (a collector's ``spool.roll_s``; segment id = first second // span).

    The same traffic :func:`fleet_segment` describes (probe_tx of host ``i``, the probe_rx
    of what its ``buddies`` predecessors sent it), built for all seconds at once, plus
    what a default collector also ships each second: the ``echo`` rows of 1 coded pair in
    ``echo_every`` (0: none) per buddy — the collector's rule, ``(v + b + p) % echo_every
    == 0`` for the v-th pair to buddy b on pair slot p — the netdev counters and the
    health values (``extras``); with ``spines`` > 0, the ``path_hop`` rows of its path
    traces over the fabric :func:`topology` describes.
    """
    rng = rng or np.random.default_rng(i)
    n = len(ids)
    per_s = buddies * ports
    sec = np.repeat(np.arange(seconds), per_s)
    k = np.tile(np.arange(per_s), seconds)
    offset = (k // 2) * (NS // (per_s // 2)) + (k % 2) * 20_000

    tx = np.zeros(seconds * per_s, records.PROBE_TX)
    tx["seq"] = sec * per_s + k
    tx["src"] = ids[i]
    tx["dst"] = ids[(i + 1 + k // ports) % n]
    tx["sport"] = 40000 + k % ports
    tx["dport"] = 7470
    tx["pair"] = k % 2
    tx["ts_kind"] = records.TsKind.SW
    tx["tx_ns"] = t0_ns + sec * NS + offset

    # sender i-d sent this host its probes k = (d-1)*ports .. d*ports-1 of every second
    d = np.arange(1, buddies + 1)
    kin = ((d - 1)[:, None] * ports + np.arange(ports)[None, :]).ravel()
    sender = np.repeat((i - d) % n, ports)
    rx_sec = np.repeat(np.arange(seconds), len(kin))
    kin_all = np.tile(kin, seconds)
    rx = np.zeros(len(rx_sec), records.PROBE_RX)
    rx["seq"] = rx_sec * per_s + kin_all
    rx["src"] = ids[np.tile(sender, seconds)]
    rx["dst"] = ids[i]
    rx["sport"] = 40000 + kin_all % ports
    rx["dport"] = 7470
    rx["pair"] = kin_all % 2
    rx["ts_kind"] = records.TsKind.SW
    rx["ttl"] = 61
    rx["spacing_ns"] = 20_000
    rx_off = (kin_all // 2) * (NS // (per_s // 2)) + (kin_all % 2) * 20_000
    rx["rx_ns"] = t0_ns + rx_sec * NS + rx_off + delay_ns + rng.integers(0, jitter_ns + 1, len(rx))
    rx = rx[np.lexsort((rx["rx_ns"], rx_sec))]  # arrival order within each second

    if echo_every:
        # pairs are rows (k, k + 1), k even; a buddy gets ports // 2 of them a second
        slots = ports // 2
        pair_v = sec * slots + (k % ports) // 2
        echoed = (pair_v + k // ports) % echo_every == 0
        src_rows = tx[echoed]
        ec = np.zeros(len(src_rows), records.ECHO)
        for name in ("seq", "src", "dst", "sport", "ts_kind"):
            ec[name] = src_rows[name]
        ec["t1_ns"] = src_rows["tx_ns"]
        ec["t2_ns"] = src_rows["tx_ns"] + delay_ns + rng.integers(0, jitter_ns + 1, len(ec))
        ec["t3_ns"] = ec["t2_ns"] + 15_000
        ec["t4_ns"] = ec["t3_ns"] + delay_ns + rng.integers(0, jitter_ns + 1, len(ec))
        ec_sec = sec[echoed]

    if extras:
        nc, nh = len(NETDEV_COUNTERS), len(HEALTH_NAMES)
        ctr = np.zeros(seconds * nc, records.COUNTER)
        ctr["ts_ns"] = t0_ns + np.repeat(np.arange(seconds), nc) * NS + 500_000_000
        ctr["host"] = ids[i]
        ctr["device"] = b"eth0"
        ctr["name"] = np.tile(np.array([c.encode() for c in NETDEV_COUNTERS], "S40"), seconds)
        ctr["delta"] = rng.integers(0, 1_000_000, len(ctr))
        ctr["value"] = np.cumsum(ctr["delta"].reshape(seconds, nc), axis=0).ravel()
        hl = np.zeros(seconds * nh, records.HEALTH)
        hl["ts_ns"] = t0_ns + np.repeat(np.arange(seconds), nh) * NS + 999_000_000
        hl["host"] = ids[i]
        hl["name"] = np.tile(np.array([h.encode() for h in HEALTH_NAMES], "S40"), seconds)
        hl["value"] = np.repeat(np.arange(1, seconds + 1), nh) * per_s

    if spines:
        hops = _path_hops(i, ids, seconds, t0_ns, buddies, ports, spines, hosts_per_rack)
        hop_sec = (hops["ts_ns"] - t0_ns) // NS

    name = host_name(i)
    hid = int(ids[i])
    out = []
    rx_per_s = len(kin)
    for s in range(0, seconds, span):
        e = min(s + span, seconds)
        a, z = s * per_s, e * per_s
        parts = [
            # (its header says the interval, as a collector's does: the daemon waits for it)
            wire.encode_header(name, hid, s // span, t0_ns + e * NS, roll_s=float(span)),
            wire.encode_chunk("probe_tx", tx[a:z]),
            wire.encode_chunk("probe_rx", rx[s * rx_per_s : e * rx_per_s]),
        ]
        if echo_every:
            parts.append(wire.encode_chunk("echo", ec[(ec_sec >= s) & (ec_sec < e)]))
        if extras:
            parts.append(wire.encode_chunk("counter", ctr[s * nc : e * nc]))
            parts.append(wire.encode_chunk("health", hl[s * nh : e * nh]))
        if spines:
            parts.append(wire.encode_chunk("path_hop", hops[(hop_sec >= s) & (hop_sec < e)]))
        out.append(b"".join(parts))
    return out
