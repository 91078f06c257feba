"""Remediation: from an anomaly to a safe, recorded, undoable change on the fleet.

- :mod:`~analytics.remediate.plan` — what to change for an anomaly, on which hosts and
  switches, and the blast-radius cap that refuses too much
- :mod:`~analytics.remediate.records` — the ``remediations`` and ``audits`` rows in the store
- :mod:`~analytics.remediate.runner` — runs ``playbooks/remediate.yml`` (preview, confirm,
  real run, streamed) for ``clockmesh remediate`` and the TUI
- :mod:`~analytics.remediate.cli` — ``clockmesh remediate``

The playbooks do the changing (``playbooks/remediate.yml``, ``playbooks/undo.yml``, one
role per action); this package plans, guards and records. docs/remediate.md has the flow.
"""
