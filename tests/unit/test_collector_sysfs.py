from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from collector import records, sysfs_counters
from collector.sysfs_counters import SysfsCounters, parse_value

DATA = Path(__file__).resolve().parents[1] / "data" / "sysfs"
HOST = records.host_id("h01")


def _by_name(rows) -> dict[tuple[str, str], int]:
    return {(r["device"].decode(), r["name"].decode()): int(r["value"]) for r in rows}


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("state", "4: ACTIVE\n", ("state", 4)),
        ("phys_state", "5: LinkUp\n", ("phys_state", 5)),
        ("rate", "100 Gb/sec (4X EDR)\n", ("rate_mbps", 100_000)),
        ("rate", "2.5 Gb/sec (1X SDR)\n", ("rate_mbps", 2_500)),
        ("link_layer", "Ethernet\n", ("link_layer_ethernet", 1)),
        ("link_layer", "InfiniBand\n", ("link_layer_ethernet", 0)),
        ("operstate", "up\n", ("operstate", 6)),
        ("operstate", "lowerlayerdown\n", ("operstate", 3)),
        ("rx_bytes", "18446744073709551615\n", ("rx_bytes", 2**64 - 1)),
        ("rx_bytes", "garbage\n", None),
    ],
)
def test_parse_real_formats(name: str, text: str, expected: tuple[str, int] | None) -> None:
    assert parse_value(name, text) == expected


def test_mlx5_tree_all_sources_and_deltas(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(DATA / "mlx5_roce", root)
    reader = SysfsCounters(root, ["ens1f0np0"], [])
    first = reader.sample(1_000, HOST)
    values = _by_name(first)
    assert values[("ens1f0np0", "operstate")] == 6
    assert values[("ens1f0np0", "rx_bytes")] == 918273645512
    assert values[("mlx5_0", "state")] == 4
    assert values[("mlx5_0", "rate_mbps")] == 100_000
    assert values[("mlx5_0", "port_xmit_data")] == 221941638608
    assert values[("mlx5_0", "np_cnp_sent")] == 1520
    sources = {(r["name"].decode(), int(r["source"])) for r in first}
    assert ("port_rcv_data", 1) in sources and ("rp_cnp_handled", 2) in sources
    assert ("tx_bytes", 0) in sources
    assert (first["delta"] == 0).all() and (first["host"] == HOST).all()
    assert {int(r["port"]) for r in first if r["device"] == b"mlx5_0"} == {1}

    counters = root / "sys/class/infiniband/mlx5_0/ports/1/counters"
    (counters / "link_downed").write_text("3\n")
    (root / "sys/class/net/ens1f0np0/statistics/rx_bytes").write_text("918273645612\n")
    (root / "sys/class/net/ens1f0np0/carrier_changes").write_text("oops\n")  # unreadable now
    second = reader.sample(2_000, HOST)
    deltas = {r["name"].decode(): int(r["delta"]) for r in second}
    assert deltas["link_downed"] == 2
    assert deltas["rx_bytes"] == 100
    assert "carrier_changes" not in deltas and reader.unreadable == 1
    assert (second["ts_ns"] == 2_000).all()


def test_device_without_counters_dir() -> None:
    reader = SysfsCounters(DATA / "rxe_no_counters", ["eth1"], [])
    rows = reader.sample(5, HOST)
    names = {(r["device"].decode(), r["name"].decode(), int(r["source"])) for r in rows}
    assert ("rxe0", "sent_pkts", 2) in names
    assert ("rxe0", "rate_mbps", 1) in names
    assert not any(n[1].startswith("port_") for n in names)


def test_missing_interface_and_root_are_not_fatal(tmp_path: Path) -> None:
    reader = SysfsCounters(tmp_path, ["nope0"], [])
    assert len(reader) == 0
    assert len(reader.sample(1, HOST)) == 0


def test_files_stay_open_and_are_reopened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pread on kept-open files; a replaced file is seen after REOPEN_S; the real
    sysfs (a netdev of this machine) answers fresh values through a kept-open fd."""
    root = tmp_path / "root"
    shutil.copytree(DATA / "mlx5_roce", root)
    fds_before = len(os.listdir("/proc/self/fd"))
    reader = SysfsCounters(root, ["ens1f0np0"], [])
    reader.sample(1, HOST)
    assert len(os.listdir("/proc/self/fd")) == fds_before + len(reader)
    rx = root / "sys/class/net/ens1f0np0/statistics/rx_bytes"
    tmp = rx.with_name("rx_bytes.tmp")
    tmp.write_text("918273645522\n")
    os.replace(tmp, rx)  # a new inode: the open fd still reads the old one
    assert _by_name(reader.sample(2, HOST))[("ens1f0np0", "rx_bytes")] == 918273645512
    monkeypatch.setattr(sysfs_counters, "REOPEN_S", 0.0)
    assert _by_name(reader.sample(3, HOST))[("ens1f0np0", "rx_bytes")] == 918273645522
    reader.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before

    live = SysfsCounters("/", ["lo"], [])
    first = _by_name(live.sample(1, HOST))[("lo", "tx_packets")]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(5):
            s.sendto(b"x", ("127.0.0.1", 9))
    assert _by_name(live.sample(2, HOST))[("lo", "tx_packets")] >= first + 5
    live.close()
