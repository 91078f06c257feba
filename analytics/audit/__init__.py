"""The fleet audit on the ops box: store what ``playbooks/audit.yml`` found on every host
(``clockmesh audit record``) and show it (``clockmesh audit show``). The checks themselves
run on each host: :mod:`collector.audit`."""
