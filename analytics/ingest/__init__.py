"""The ingest daemon: HTTP intake of collector batches, group commit into the store, and the
analysis pipeline that runs beside it (clock solver, then detector).

- :mod:`analytics.ingest.server` — the aiohttp daemon (``POST /v1/batch``, ``/v1/live``,
  ``/metrics``) and its group commit;
- :mod:`analytics.ingest.body` — decoding and checking a batch body;
- :mod:`analytics.ingest.config` — ``ingest.yml``;
- :mod:`analytics.ingest.cli` — ``clockmesh ingest ...``;
- :mod:`analytics.ingest.metrics`, :mod:`analytics.ingest.pace`, :mod:`analytics.ingest.slabs`
  — Prometheus metrics, acknowledgement pacing, reused memory;
- :mod:`analytics.ingest.load` — synthetic collector segments (benchmarks, tests).
"""
