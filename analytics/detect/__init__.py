"""The detector: judges the fleet's telemetry and opens anomalies an operator acts on.

- :mod:`~analytics.detect.anomalies` — open / update / close, rows of the ``anomalies`` table
- :mod:`~analytics.detect.flaps` — flapping links (and leaves gone whole) from the hosts'
  interface counters
- :mod:`~analytics.detect.survival` — what a job survives of each outage
- :mod:`~analytics.detect.roce` — jobs on RoCE v1 from the GID configuration
- :mod:`~analytics.detect.detect_runner` — the ingest daemon's detector thread

It judges from telemetry and topology only, never from the lab's injector state.
docs/detect.md describes what is detected today and what is not yet.
"""
