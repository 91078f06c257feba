"""The fleet-host side of clockmesh: probe mesh, counters, RDMA config, durable shipping.

Kept light on purpose: it never imports analytics, tui, scikit-learn or textual.
"""
