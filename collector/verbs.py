"""pyverbs (rdma-core's Python bindings) where importable: RDMA devices, ports, GIDs.

Only these pyverbs calls are used (and faked, call for call, in
tests/unit/test_collector_verbs.py)::

    pyverbs.device.get_device_list()        -> [Device(.name: bytes)]
    pyverbs.device.Context(name=str)        (context manager; .close())
    Context.query_device()                  -> .phys_port_cnt
    Context.query_port(port)                -> .state, .gid_tbl_len, .link_layer
    Context.query_gid(port, index)          -> GID (str() is the textual GID)
    Context.query_gid_type(port, index)     -> 0 = IB/RoCE v1, 1 = RoCE v2 (ibv_gid_type)

This code has never run against a real RNIC (none exists on the development
machine); the sysfs readers (collector/rdma_config.py) remain the source of
record. When pyverbs is not importable the collector logs it once and carries on
with UDP probes. UD-QP probing with completion timestamps is not implemented
yet (see docs/collector.md, "Not done").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
GID_TYPES = {0: "IB/RoCE v1", 1: "RoCE v2"}


@dataclass
class PortInfo:
    port: int
    state: int
    link_layer: int
    gids: list[tuple[int, str, str]] = field(default_factory=list)  # (index, gid, type)


@dataclass
class DeviceInfo:
    name: str
    ports: list[PortInfo] = field(default_factory=list)


def _import() -> ModuleType | None:
    try:
        return importlib.import_module("pyverbs.device")
    except ImportError:
        return None


def enumerate_devices(device_module: Any = None) -> list[DeviceInfo] | None:
    """Every RDMA device with its ports and populated GIDs; None without pyverbs."""
    dev_mod = device_module if device_module is not None else _import()
    if dev_mod is None:
        return None
    out: list[DeviceInfo] = []
    for dev in dev_mod.get_device_list():
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        info = DeviceInfo(name)
        ctx = dev_mod.Context(name=name)
        try:
            ports = ctx.query_device().phys_port_cnt
            for port in range(1, ports + 1):
                attr = ctx.query_port(port)
                pinfo = PortInfo(port, int(attr.state), int(attr.link_layer))
                for index in range(attr.gid_tbl_len):
                    try:
                        gid = str(ctx.query_gid(port, index))
                    except Exception:  # pyverbs raises PyverbsRDMAError for holes
                        continue
                    if gid == ZERO_GID or gid == "::":
                        continue
                    try:
                        kind = GID_TYPES.get(int(ctx.query_gid_type(port, index)), "unknown")
                    except Exception:
                        kind = "unknown"
                    pinfo.gids.append((index, gid, kind))
                info.ports.append(pinfo)
        finally:
            ctx.close()
        out.append(info)
    return out
