"""A deterministic ``/v1/live`` answer shaped like the daemon's, for TUI tests and the
TUI benchmark: ``racks`` × ``per_rack`` hosts, each probing a few peers, clock offsets,
and open anomalies. One slow pair, one lossy pair, one silent host."""

from __future__ import annotations

import random
from typing import Any

T0 = 1_795_600_000_000_000_000


def sample_live(
    racks: int = 3,
    per_rack: int = 4,
    anomalies: int = 2,
    seed: int = 1,
    peers: int = 4,
    tick: int = 0,
) -> dict[str, Any]:
    """``tick`` > 0: the same fleet ``tick`` seconds later (new delay samples, same faults)."""
    rng = random.Random(seed)
    jitter = random.Random(seed * 1000 + tick)
    hosts = [f"h{r}-{i}" for r in range(1, racks + 1) for i in range(1, per_rack + 1)]
    offsets = {h: rng.uniform(-5e6, 5e6) for h in hosts}
    pairs = []
    for n, src in enumerate(hosts):
        for k in range(1, peers + 1):
            dst = hosts[(n + k * per_rack) % len(hosts)]
            if dst == src or any(p["src"] == src and p["dst"] == dst for p in pairs[-peers:]):
                continue
            true_us = 3.0 + rng.uniform(0.0, 1.0) + (jitter.uniform(-0.3, 0.3) if tick else 0.0)
            loss, queue = 0.0, None
            if (src, k) == (hosts[1], 1):
                true_us, queue = 42.0, 38.5  # a queue: the detector judged it slow
            if (src, k) == (hosts[2], 1):
                loss = 0.05
            raw = true_us + (offsets[dst] - offsets[src]) / 1e3
            pairs.append({"src": src, "dst": dst, "src_id": n, "dst_id": 0, "sent": 600,
                          "received": int(600 * (1 - loss)), "loss": loss,
                          "owd_raw_min_us": raw - 0.5, "owd_raw_p50_us": raw,
                          "owd_raw_p99_us": raw + 2.0, "queue_us": queue})  # fmt: skip
    kinds = ["flapping_link", "contention", "roce_v1_job"]
    open_ = []
    for i in range(anomalies):
        kind = kinds[i % 3]
        link = f"leaf{i % racks + 1}-spine{i % 2 + 1}" if kind != "roce_v1_job" else ""
        job = f"job{i}" if kind == "roce_v1_job" else ""
        ev: dict[str, Any] = {"model": {"class": kind, "probability": 0.97, "why": ["x"]},
                              "rule": kind}  # fmt: skip
        if kind == "flapping_link":
            ev |= {"outages_s": [1.6, 2.4, 4.2], "flaps": 3}
        open_.append({"anomaly_id": f"{kind.split('_')[0]}-{i:010x}", "kind": kind,
                      "link": link, "job_id": job, "score": 0.9 - i * 0.001,
                      "summary": f"{link or job}: {kind.replace('_', ' ')} #{i}",
                      "opened_ns": T0 - (60 + i) * 10**9, "last_seen_ns": T0,
                      "closed_ns": 0, "evidence": ev})  # fmt: skip
    # Running jobs: each RoCE v1 job (first host on RoCE v1, second on v2) and one healthy.
    jobs = [
        {"job_id": a["job_id"], "roce_v1_hosts": 1, "gid_types": ["IB/RoCE v1", "RoCE v2"],
         "hosts": [{"host": hosts[0], "device": "mlx5_0", "gid_index": 0,
                    "gid_type": "IB/RoCE v1", "index_source": "set in environ"},
                   {"host": hosts[per_rack], "device": "mlx5_0", "gid_index": 1,
                    "gid_type": "RoCE v2", "index_source": "set in environ"}]}
        for a in open_ if a["kind"] == "roce_v1_job"
    ] + [{"job_id": "train-llm", "roce_v1_hosts": 0, "gid_types": ["RoCE v2"],
          "hosts": [{"host": h, "device": "mlx5_0", "gid_index": 1, "gid_type": "RoCE v2",
                     "index_source": "set in nccl.conf"} for h in hosts[:8]]}]  # fmt: skip
    counts = dict.fromkeys([*kinds, "unknown"], 0)
    for a in open_:
        counts[a["kind"]] += 1
    return {
        "generated_ns": T0,
        "hosts": [
            {
                "host": h,
                "host_id": n,
                "last_batch_age_s": 30.0 if n == 3 else 0.4,
                "batches": 100,
                "rows": 1000,
                "rates": {},
            }
            for n, h in enumerate(hosts)
        ],
        "pairs": pairs,
        "clock": {
            "hosts": [
                {
                    "host": h,
                    "host_id": n,
                    "offset_ns": offsets[h],
                    "drift_ppm": 1.5,
                    "uncertainty_ns": 30.0 + n % 7,
                    "status": "solved",
                }
                for n, h in enumerate(hosts)
            ]
        },
        "anomalies": {
            "open": open_,
            "open_by_kind": counts,
            "recently_closed": [],
            "model": "model trained 2026-11-25",
        },
        "jobs": jobs,
    }


def sample_racks(racks: int = 3, per_rack: int = 4) -> dict[str, str]:
    return {f"h{r}-{i}": f"leaf{r}" for r in range(1, racks + 1) for i in range(1, per_rack + 1)}


def sample_topology(racks: int = 3, per_rack: int = 4) -> dict[str, Any]:
    """The sample fleet's topology: leaf r per rack, two spines, each host's access link."""
    hosts = sample_racks(racks, per_rack)
    links: list[dict[str, Any]] = []
    n = 0
    for leaf in range(1, racks + 1):
        for spine in (1, 2):
            links.append({"name": f"leaf{leaf}-spine{spine}", "kind": "fabric",
                          "a": {"node": f"leaf{leaf}", "interface": f"spine{spine}",
                                "address": f"198.18.128.{n}"},
                          "b": {"node": f"spine{spine}", "interface": f"leaf{leaf}",
                                "address": f"198.18.128.{n + 1}"}})  # fmt: skip
            n += 2
    for h, rack in hosts.items():
        links.append({"name": f"{h}-{rack}", "kind": "access",
                      "a": {"node": h, "interface": "bk0", "address": ""},
                      "b": {"node": rack, "interface": h, "address": ""}})  # fmt: skip
    return {"hosts": [{"name": h, "rack": r} for h, r in hosts.items()], "links": links}


def sample_store(root: Any, live: dict[str, Any]) -> None:
    """A real store (Parquet + catalog.duckdb) with ten minutes of history behind
    ``live`` (at T0) for the drill-downs: the slow pair h1-2 → h2-2 (one of its four ECMP
    paths 30 µs slower, 5 % loss three minutes ago), h1-2's counters (its link went down
    twice), the RoCE v1 job's GID configuration and in-band timestamps, the anomalies."""
    import json

    import pyarrow as pa

    from analytics.store import layout
    from analytics.store.catalog import write_catalog
    from analytics.store.store_writer import StoreWriter
    from collector.records import host_id

    def put(table: str, rows: list[dict[str, Any]]) -> None:
        data = pa.Table.from_pylist(rows, schema=layout.TABLES[table].schema)
        writer.write_partitioned(table, data, f"{table}.parquet")

    writer = StoreWriter(root)
    writer.open()  # the layout and every table's empty placeholder
    names = [h["host"] for h in live["hosts"]]
    ids = {h: host_id(h) for h in names}
    raw = {(p["src"], p["dst"]): p["owd_raw_p50_us"] for p in live["pairs"]}
    minute0 = T0 // 60_000_000_000 * 60_000_000_000
    minutes = [minute0 - k * 60_000_000_000 for k in range(10, 0, -1)]
    put("host_names", [{"ts_ns": T0 - 3_600_000_000_000, "host_id": i, "host": h}
                       for h, i in ids.items()])  # fmt: skip
    job = next(j for j in live["jobs"] if j["roce_v1_hosts"])
    a, b = (h["host"] for h in job["hosts"])
    pm, path, owd = [], [], []
    for m in minutes:
        for src, dst in (("h1-2", "h2-2"), (a, b)):
            d_ns = raw[(src, dst)] * 1e3
            lost = 30 if (src == "h1-2" and m == minutes[-3]) else 0
            pm.append({"minute_ns": m, "src": ids[src], "dst": ids[dst], "paths": 4, "sent": 600,
                       "received": 600 - lost, "delay_min_ns": int(d_ns - 500),
                       "delay_p50_ns": d_ns, "delay_p90_ns": d_ns + 1000,
                       "delay_p99_ns": d_ns + 2000, "delay_max_ns": int(d_ns + 3000),
                       "delay_mean_ns": d_ns})  # fmt: skip
            for sport in (40001, 40002, 40003, 40004):
                slow = 30_000 if (src == "h1-2" and sport == 40004) else 0
                path.append({"minute_ns": m, "src": ids[src], "dst": ids[dst], "sport": sport,
                             "sent": 150, "received": 150 - lost // 4,
                             "delay_min_ns": int(d_ns + slow - 500),
                             "delay_p50_ns": d_ns + slow, "delay_p99_ns": d_ns + slow + 2000,
                             "delay_max_ns": int(d_ns + slow + 3000)})  # fmt: skip
                true_ns = (42_000.0 if src == "h1-2" else 3_500.0) + slow
                owd.append({"ts_ns": m + 1_000_000_000 + sport, "src": ids[src], "dst": ids[dst],
                            "sport": sport, "seq": m // 1000 + sport, "owd_ns": true_ns,
                            "uncertainty_ns": 40.0})  # fmt: skip
    put("probe_minute", pm)
    put("path_minute", path)
    put("owd", owd)
    put("path_hop", [{"ts_ns": T0 - 20_000_000_000, "src": ids["h1-2"], "dst": ids["h2-2"],
                      "sport": sport, "ttl": 2, "hop": f"198.18.128.{1 if sport % 2 else 3}",
                      "rtt_ns": 50_000}
                     for sport in (40001, 40002, 40003, 40004)])  # fmt: skip
    counters = []
    for k, (oper, downs) in enumerate([(6, 0), (2, 1), (6, 0), (2, 1), (6, 0)]):
        ts = T0 - (300 - 60 * k) * 1_000_000_000
        for name, value, delta in (("operstate", oper, 0), ("carrier_down_count", 3 + k, downs),
                                   ("rx_bytes", 10**9 + k * 10**6, 10**6 if k else 0),
                                   ("tx_errors", 0, 0)):  # fmt: skip
            counters.append({"ts_ns": ts, "host": ids["h1-2"], "device": "bk0", "port": 0,
                             "source": 0, "name": name, "value": value, "delta": delta})  # fmt: skip
    put("counter", counters)
    put("rdma_config", [{"ts_ns": T0 - 60_000_000_000, "host": ids[h], "device": "mlx5_0",
                         "port": 1, "gid_index": i, "gid": f"fe80::{i}",
                         "gid_type": "IB/RoCE v1" if i == 0 else "RoCE v2", "ndev": "bk0",
                         "default_roce_mode": ""}
                        for h in (a, b) for i in (0, 1)])  # fmt: skip
    put("job_rdma", [{"ts_ns": T0 - 30_000_000_000, "host": ids[h["host"]],
                      "job_id": job["job_id"], "pid": 4242, "gid_index": h["gid_index"],
                      "source": "environ", "device": "mlx5_0"}
                     for h in job["hosts"]])  # fmt: skip
    inband = []
    for m in minutes[-3:]:
        for seq in range(20):
            sent = m + seq * 1_000_000_000
            # in-band: 25 µs above the probes' raw delay (the job's traffic queues)
            arrived = sent + int(raw[(a, b)] * 1e3) + 25_000
            for host, event, at in ((ids[a], 0, sent), (ids[b], 1, arrived)):
                inband.append({"ts_ns": at, "host": host, "job_id": job["job_id"], "flow_id": 7,
                               "seq": seq + m // 1_000_000_000, "peer": ids[b] if event == 0
                               else ids[a], "event": event, "nbytes": 4096, "event_ns": at})  # fmt: skip
    put("inband", inband)
    put("anomalies", [{"opened_ns": x["opened_ns"], "closed_ns": 0, "anomaly_id": x["anomaly_id"],
                       "kind": x["kind"], "score": x["score"], "src": 0, "dst": 0,
                       "link": x["link"], "job_id": x["job_id"],
                       "detail": json.dumps({"summary": x["summary"], "evidence": x["evidence"]}),
                       "updated_ns": x["opened_ns"]}
                      for x in live["anomalies"]["open"]])  # fmt: skip
    write_catalog(root)


CULPRIT = "h1-2"  # its counters in sample_store show its link going down


def sample_host_flap(racks: int = 3, per_rack: int = 4) -> dict[str, Any]:
    """The sample fleet while ``CULPRIT``'s own access link flaps: every probe sent to it
    during the outages is lost (30 %), it sent nothing while down (so it lost nothing of
    its own), nobody else loses or waits; one open ``flapping_link`` anomaly on its link,
    the RoCE v1 job's anomaly beside it. The attribution is the daemon's own
    (:func:`analytics.detect.attribution.annotate`)."""
    from analytics.detect import attribution

    live = sample_live(racks, per_rack, anomalies=3)
    offsets = {h["host"]: h["offset_ns"] for h in live["clock"]["hosts"]}
    for p in live["pairs"]:
        raw = 3.5 + (offsets[p["dst"]] - offsets[p["src"]]) / 1e3
        sent = 420 if p["src"] == CULPRIT else 600
        received = int(sent * 0.7) if p["dst"] == CULPRIT else sent
        p.update(sent=sent, received=received, loss=round(1 - received / sent, 6),
                 owd_raw_min_us=raw - 0.5, owd_raw_p50_us=raw, owd_raw_p99_us=raw + 2.0,
                 queue_us=None)  # fmt: skip
    for h in live["hosts"]:
        h["last_batch_age_s"] = 0.4
    link = f"{CULPRIT}-leaf1"
    flap = {"anomaly_id": "flapping-00c0ffee00", "kind": "flapping_link", "link": link,
            "job_id": "", "score": 0.875, "opened_ns": T0 - 40 * 10**9, "last_seen_ns": T0,
            "closed_ns": 0, "age_s": 40.0,
            "summary": f"{link} flapped 3 times in 10 min; outages up to 2.1 s",
            "evidence": {"host": CULPRIT, "device": "bk0", "flaps": 3, "down_now": False,
                         "outages_s": [1.9, 2.1, 2.0], "longest_outage_s": 2.1,
                         "source": "host counters (operstate, carrier_down_count, link_downed)",
                         "rule": "flapping_link",
                         "model": {"class": "flapping_link", "probability": 0.99,
                                   "why": ["x"]}}}  # fmt: skip
    roce = [a for a in live["anomalies"]["open"] if a["kind"] == "roce_v1_job"]
    live["anomalies"]["open"] = [flap, *roce]
    counts = dict.fromkeys(live["anomalies"]["open_by_kind"], 0)
    for a in live["anomalies"]["open"]:
        counts[a["kind"]] += 1
    live["anomalies"]["open_by_kind"] = counts
    attribution.annotate(live["hosts"], live["pairs"], live["anomalies"]["open"],
                         sample_racks(racks, per_rack),
                         attribution.link_leaves(sample_topology(racks, per_rack)))  # fmt: skip
    return live
