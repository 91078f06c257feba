"""Lab-shaped topology documents (as `clockmesh lab up` writes topology.json) for the
detector's unit tests: leaves with their hosts, every leaf linked to every spine."""

from __future__ import annotations

from typing import Any


def leaf_spine(hosts: dict[str, str], spines: tuple[str, ...] = ("spine1", "spine2")) -> dict:
    """``hosts``: host name -> its leaf. Fabric links carry the spine's address on them
    (what a trace's hop answers from); each host's bk0 is its access link."""
    leaves = sorted(set(hosts.values()))
    links: list[dict[str, Any]] = []
    for i, (leaf, s) in enumerate((leaf, s) for leaf in leaves for s in spines):
        links.append({"name": f"{leaf}-{s}", "kind": "fabric",
                      "a": {"node": leaf, "interface": s, "address": f"198.18.128.{2 * i}"},
                      "b": {"node": s, "interface": leaf,
                            "address": f"198.18.128.{2 * i + 1}"}})  # fmt: skip
    for name, leaf in hosts.items():
        links.append({"name": f"{name}-{leaf}", "kind": "access",
                      "a": {"node": name, "interface": "bk0"},
                      "b": {"node": leaf, "interface": name}})  # fmt: skip
    return {"hosts": [{"name": n, "rack": leaf} for n, leaf in hosts.items()], "links": links}
