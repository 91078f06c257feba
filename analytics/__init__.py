"""The ops-box side of clockmesh: ingest, store, clock solver, detector, reports."""
