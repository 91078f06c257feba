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


def test_rdma_ud_probes_between_two_collectors_on_a_fake_fabric(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two real collectors (UDP on loopback) also probe over fake UD QPs.

    QPNs are learned from the UDP probes; RDMA rows carry TsKind.RDMA and
    Transport.RDMA_UD, both halves of each coded pair, on all 8 paths (flow labels).
    """
    import threading
    import time

    import numpy as np

    from collector import config, records
    from collector.agent import Collector
    from collector.verbs_probe import ipv4_mapped_gid
    from tests.unit import fake_pyverbs
    from tests.unit.collector_procs import KEY, free_udp_port, loopback_net, write_config
    from tests.unit.collector_receiver import Receiver

    net = loopback_net()
    a_addr, b_addr = f"{net}.1", f"{net}.2"
    fabric = fake_pyverbs.Fabric()
    for dev, addr in (("mlx5_0", a_addr), ("mlx5_1", b_addr)):
        # like a real mlx5: v1 and v2 entries, the RoCE v2 one for the IPv4 address at index 3
        fabric.add_device(
            dev,
            [
                ("fe80:0000:0000:0000:0000:0000:0000:0001", 0),
                ("fe80:0000:0000:0000:0000:0000:0000:0001", 1),
                (ipv4_mapped_gid(addr), 0),
                (ipv4_mapped_gid(addr), 1),
            ],
        )
    receiver = Receiver(KEY)
    port = free_udp_port(a_addr)
    peers = [
        {"name": "va", "address": a_addr, "rack": "r"},
        {"name": "vb", "address": b_addr, "rack": "r"},
    ]
    cols, threads = [], []
    try:
        for name, addr in (("va", a_addr), ("vb", b_addr)):
            path = write_config(
                tmp_path,
                name,
                addr,
                peers,
                receiver.url,
                port=port,
                base_sport=43000 + port % 20000,
                rdma={"pyverbs": True},
                probe={"rate_per_port": 4.0},
            )
            col = Collector(config.load(path), path, pyverbs=fake_pyverbs.make(fabric))
            cols.append(col)
            threads.append(threading.Thread(target=col.run, kwargs={"install_signals": False}))
        for t in threads:
            t.start()
        # until both have sent and received eight rounds over their 8 source ports (the
        # checks below need every port and a few dozen probes), or a minute has passed
        deadline = time.monotonic() + 60
        while True:
            status = [c.status() for c in cols]
            rdma = [st.get("rdma") or {} for st in status]
            if time.monotonic() > deadline or all(
                r.get("rdma_probes_sent", 0) >= 64 and r.get("rdma_probes_received", 0) >= 64
                for r in rdma
            ):
                break
            time.sleep(0.2)
    finally:
        for c in cols:
            c.stop_from_thread()
        for t in threads:
            t.join(20)
        receiver.close()
    for st in status:
        assert "RDMA UD probes on" in st["pyverbs"] and "GID index 3" in st["pyverbs"]
        assert st["rdma"]["rdma_probes_sent"] > 20 and st["rdma"]["rdma_probes_received"] > 20
        assert sum(st["rdma"]["rejected"].values()) == 0
    tx = np.concatenate([a for a in receiver.rows("probe_tx", "va") if len(a)])
    rx = np.concatenate([a for a in receiver.rows("probe_rx", "vb") if len(a)])
    rtx = tx[tx["transport"] == records.Transport.RDMA_UD]
    rrx = rx[rx["transport"] == records.Transport.RDMA_UD]
    assert len(rtx) > 20 and (rtx["ts_kind"] == records.TsKind.RDMA).all()
    assert set(rtx["sport"].tolist()) == set(range(8))
    common = np.intersect1d(rtx["seq"], rrx["seq"])
    assert len(common) >= 0.9 * len(rrx) and len(rrx) > 20
    assert set((rrx["seq"] % 2).tolist()) == {0, 1} and (rrx["pair"] == rrx["seq"] % 2).all()
    utx = tx[tx["transport"] == records.Transport.UDP]
    assert len(np.intersect1d(utx["seq"], rtx["seq"])) == 0  # one sequence space, no clashes
    assert not fabric.qps  # every QP closed on stop
