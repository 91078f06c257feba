"""The one loader of a topology file (the lab's ``topology.json``, the ops box's
``/etc/clockmesh/topology.json``): the detector, the remediation preflight, the report and
the TUI all read it through :func:`read_topology`, so a file one of them accepts is one
they all accept, and a bad file is the same one-line error everywhere.

The shape: ``{"hosts": [{"name", "rack"?, "backend_address"?, "mgmt_address"?, "tags"?}],
"links": [{"name", "kind"?, "a": {"node", "interface"?, "address"?}, "b": {...}}]}``;
``links`` may be missing (a file that only places hosts in racks); a ``"kind": "fabric"``
(leaf–spine) link's ends carry their ``address`` (each is the other's BGP neighbour).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class TopologyError(ValueError):
    """The file is not a topology; ``str()`` is one line naming the file and the field."""


def read_topology(path: str | Path) -> dict[str, Any]:
    """The parsed, checked topology document at ``path`` (``links`` defaults to [])."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TopologyError(f"{path}: not a clockmesh topology file ({exc})") from None

    def bad(where: str, expected: str) -> TopologyError:
        return TopologyError(f"{path}: not a clockmesh topology file ({where}: {expected})")

    if not isinstance(doc, dict):
        raise bad("top level", "expected an object with hosts and links")
    hosts, links = doc.get("hosts"), doc.setdefault("links", [])
    if not isinstance(hosts, list):
        raise bad("hosts", "expected a list of hosts")
    if not isinstance(links, list):
        raise bad("links", "expected a list of links")
    for i, h in enumerate(hosts):
        if not isinstance(h, dict) or not isinstance(h.get("name"), str):
            raise bad(f"hosts[{i}]", "expected an object with a name")
        tags = h.get("tags", [])
        if not isinstance(tags, list):
            raise bad(f"hosts[{i}].tags", f"host {h['name']}: tags must be a list of strings")
    for i, lk in enumerate(links):
        if not isinstance(lk, dict) or not isinstance(lk.get("name"), str):
            raise bad(f"links[{i}]", "expected an object with a name")
        for end in ("a", "b"):
            e = lk.get(end)
            if not isinstance(e, dict) or not isinstance(e.get("node"), str):
                raise bad(f"links[{i}].{end}", "expected an object with a node")
        for end in ("a", "b") if lk.get("kind") == "fabric" else ():
            if not isinstance(lk[end].get("address"), str):  # the BGP neighbour of the other
                raise bad(f"links[{i}].{end}.address", "a fabric link's ends need addresses")
    return doc


def racks(doc: dict[str, Any] | None) -> dict[str, str]:
    """host -> rack (its leaf); {} without a topology."""
    return {h["name"]: str(h.get("rack", "")) for h in (doc or {}).get("hosts", [])}


def search_words(doc: dict[str, Any] | None) -> dict[str, str]:
    """host -> what else a filter finds it by: its backend and management addresses and its
    ``tags`` (strings a topology may give a host: "a100", "pod3"); {} without a topology."""
    out = {}
    for h in (doc or {}).get("hosts", []):
        words = [h.get("backend_address"), h.get("mgmt_address"), *map(str, h.get("tags", []))]
        out[h["name"]] = " ".join(str(w) for w in words if w)
    return out
