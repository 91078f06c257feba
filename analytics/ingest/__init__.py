"""The ingest daemon: HTTP intake of collector batches, group commit into the store, and the
analysis pipeline that runs beside it (clock solver, then detector).

- :mod:`analytics.ingest.server` — the daemon: wires the parts below, its lifecycle and
  background work (``clockmesh ingest run`` starts it);
- :mod:`analytics.ingest.routes` — the HTTP surface (``POST /v1/batch`` and its HMAC check,
  ``/v1/live``, ``/metrics``, ``/healthz``);
- :mod:`analytics.ingest.group_commit` — batches written together, fsynced once, answered
  together;
- :mod:`analytics.ingest.live` — the live document (``/v1/live``) and its refresh (rollups);
- :mod:`analytics.ingest.body` — decoding and checking a batch body;
- :mod:`analytics.ingest.config` — ``ingest.yml``;
- :mod:`analytics.ingest.cli` — ``clockmesh ingest ...``;
- :mod:`analytics.ingest.metrics`, :mod:`analytics.ingest.pace`, :mod:`analytics.ingest.slabs`
  — Prometheus metrics, acknowledgement pacing, reused memory;
- :mod:`analytics.ingest.hot_window` — recent probes in memory: the live picture, rollups;
- :mod:`analytics.ingest.live_cli` — ``clockmesh live`` (reads ``/v1/live``);
- :mod:`analytics.ingest.load` — synthetic collector segments (benchmarks, tests).
"""
