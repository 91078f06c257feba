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
            if dst == src:
                continue
            true_us = 3.0 + rng.uniform(0.0, 1.0) + (jitter.uniform(-0.3, 0.3) if tick else 0.0)
            loss = 0.0
            if (src, k) == (hosts[1], 1):
                true_us = 42.0  # a queue
            if (src, k) == (hosts[2], 1):
                loss = 0.05
            raw = true_us + (offsets[dst] - offsets[src]) / 1e3
            pairs.append({"src": src, "dst": dst, "src_id": n, "dst_id": 0, "sent": 600,
                          "received": int(600 * (1 - loss)), "loss": loss,
                          "owd_raw_min_us": raw - 0.5, "owd_raw_p50_us": raw,
                          "owd_raw_p99_us": raw + 2.0})  # fmt: skip
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
    }


def sample_racks(racks: int = 3, per_rack: int = 4) -> dict[str, str]:
    return {f"h{r}-{i}": f"leaf{r}" for r in range(1, racks + 1) for i in range(1, per_rack + 1)}
