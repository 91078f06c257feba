"""``inventory.yml``: the contract between the lab and the Ansible roles.

Groups: ``collectors`` (children: one group per rack, named after its leaf), ``opsbox``
and ``fabric`` (the leaf and spine routers: FRR in namespaces on this machine, reached
with a local connection and ``ip netns exec ... vtysh``; the remediation roles use it). Keep these names and variables stable: the roles depend on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lab import frr
from lab.topology import Topology

INGEST_PORT = 8470


def build(
    topo: Topology,
    private_key: Path,
    known_hosts: Path,
    fleet_key: str,
    topology_file: Path | None = None,
) -> dict[str, Any]:
    racks: dict[str, dict[str, Any]] = {}
    for host in topo.hosts:
        hostvars: dict[str, Any] = {
            "ansible_host": host.mgmt_address,
            "clockmesh_backend_address": host.backend_address,
            "clockmesh_backend_interface": host.backend_interface,
            "clockmesh_rack": host.rack,
        }
        if host.clock is not None:
            hostvars["clockmesh_lab_clock"] = {
                "offset_ns": host.clock.offset_ns,
                "drift_ppm": host.clock.drift_ppm,
            }
        racks.setdefault(host.rack, {"hosts": {}})["hosts"][host.name] = hostvars
    # Inventory names differ from the routers' (a rack group is named after its leaf);
    # clockmesh_switch_name is the topology's name, what remediation plans name.
    switches = {
        f"switch-{r.name}": {
            "ansible_connection": "local",
            "clockmesh_switch_name": r.name,
            "clockmesh_fabric_link_vtysh": frr.vtysh_argv(topo.lab, r, "")[:-2],
            "clockmesh_fabric_link_save": False,  # the lab writes its configs at every up
        }
        for r in (*topo.leaves, *topo.spines)
    }
    return {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(private_key),
                "ansible_ssh_common_args": (
                    f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
                ),
                "ansible_python_interpreter": "/usr/bin/python3",
                "clockmesh_fleet_key": fleet_key,
                "clockmesh_ingest_url": f"http://{topo.ops.mgmt_address}:{INGEST_PORT}",
                **(
                    {
                        "clockmesh_ingest_urls": [
                            f"http://{b.mgmt_address}:{INGEST_PORT}" for b in topo.ops_boxes
                        ]
                    }
                    if len(topo.ops_boxes) > 1
                    else {}
                ),  # a standby pair (`lab up --ops 2`): collectors ship to both
                "clockmesh_lab": True,
                # The ops box names host ports after their links (detector, reports).
                "clockmesh_opsbox_topology_file": str(topology_file) if topology_file else "",
                # Lab hosts share /etc: the report's cron file goes to the ops box's own.
                "clockmesh_opsbox_report_cron_file": "/etc/clockmesh/cron.d-clockmesh-report",
            },
            "children": {
                "collectors": {"children": racks},
                "opsbox": {
                    "hosts": {b.name: {"ansible_host": b.mgmt_address} for b in topo.ops_boxes},
                },
                "fabric": {"hosts": switches},
            },
        }
    }


def write(path: Path, inventory: dict[str, Any], lab: str) -> None:
    header = f"# clockmesh lab {lab!r}: written by `clockmesh lab up`; regenerated on every up.\n"
    tmp = path.with_suffix(".yml.tmp")
    tmp.write_text(
        header + yaml.safe_dump(inventory, sort_keys=False, width=1000), encoding="utf-8"
    )
    tmp.chmod(0o600)  # holds the fleet key
    tmp.replace(path)
