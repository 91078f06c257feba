"""verbs.enumerate_devices against a fake of exactly the pyverbs calls it makes.

The fake mirrors rdma-core's pyverbs signatures; the code has never run on a real RNIC.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

from collector import verbs


class FakeError(Exception):
    pass


class FakeContext:
    opened: ClassVar[list[str]] = []
    closed: ClassVar[list[str]] = []

    def __init__(self, name: str) -> None:
        self.name = name
        FakeContext.opened.append(name)

    def query_device(self) -> SimpleNamespace:
        return SimpleNamespace(phys_port_cnt=1)

    def query_port(self, port: int) -> SimpleNamespace:
        return SimpleNamespace(state=4, gid_tbl_len=6, link_layer=2)

    def query_gid(self, port: int, index: int) -> str:
        table = {
            0: "fe80:0000:0000:0000:0e42:a1ff:fe3b:5e10",
            1: "fe80:0000:0000:0000:0e42:a1ff:fe3b:5e10",
            2: "0000:0000:0000:0000:0000:ffff:c612:0102",
            3: "0000:0000:0000:0000:0000:ffff:c612:0102",
        }
        if index == 5:
            raise FakeError("Failed to query gid")
        return table.get(index, verbs.ZERO_GID)

    def query_gid_type(self, port: int, index: int) -> int:
        return index % 2

    def close(self) -> None:
        FakeContext.closed.append(self.name)


class FakeDeviceModule:
    Context = FakeContext

    @staticmethod
    def get_device_list() -> list[SimpleNamespace]:
        return [SimpleNamespace(name=b"mlx5_0")]


def test_enumerates_ports_and_gid_types() -> None:
    devices = verbs.enumerate_devices(FakeDeviceModule)
    assert devices is not None and [d.name for d in devices] == ["mlx5_0"]
    port = devices[0].ports[0]
    assert (port.port, port.state) == (1, 4)
    assert [(i, t) for i, _, t in port.gids] == [
        (0, "IB/RoCE v1"),
        (1, "RoCE v2"),
        (2, "IB/RoCE v1"),
        (3, "RoCE v2"),
    ]
    assert FakeContext.closed == ["mlx5_0"]


def test_without_pyverbs_returns_none() -> None:
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        assert verbs.enumerate_devices() is None
