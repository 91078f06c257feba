"""Probes over an RDMA UD QP with completion timestamps (pyverbs), next to the UDP mesh.

The same 88-byte authenticated probe (collector/probe_packet.py, flag bit 1 set) is
sent as an RDMA UD SEND from one QP per collector to each buddy's QP, addressed by
the buddy's RoCE v2 GID (the IPv4-mapped backend address) and learned QP number
(every UDP probe and echo carries its sender's QPN). The path index 0..7 is put in
the GRH flow label, which RoCE v2 NICs hash into the UDP source port, so the RDMA
probes spread over the same ECMP paths; rows record it in ``sport``.

Send and receive completions come from an extended CQ created with
``IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK``: ``read_completion_wallclock_ns()``
is CLOCK_REALTIME nanoseconds taken by the NIC (``TsKind.RDMA``). A device that
cannot do that is not used (logged once). No echoes over RDMA.

pyverbs calls used (all faked, call for call, in tests/unit/test_collector_verbs.py)::

    device.Context(name=)  pd.PD(ctx)  cq.CqInitAttrEx(cqe=, wc_flags=)  cq.CQEX(ctx, attr)
    cq.PollCqAttr()  CQEX.start_poll/poll_next/end_poll, .wr_id, .status,
    CQEX.read_opcode/read_byte_len/read_completion_wallclock_ns
    mr.MR(pd, length, access)  MR.write(data, length, offset)  MR.read(length, offset)
    MR.buf  MR.lkey  qp.QPCap(...)  qp.QPInitAttr(qp_type=, scq=, rcq=, cap=)
    qp.QPAttr(port_num=) (.qkey, .pkey_index)  qp.QP(pd, init_attr, qp_attr)  QP.qp_num
    QP.post_send(wr, None)  QP.post_recv(wr, None)
    addr.GID(str)  addr.GlobalRoute(dgid=, flow_label=, sgid_index=, hop_limit=)
    addr.AHAttr(port_num=, is_global=1, gr=)  addr.AH(pd, attr=)
    wr.SGE(addr, length, lkey)  wr.SendWR(wr_id=, opcode=, num_sge=, sg=, send_flags=)
    SendWR.set_wr_ud(ah, rqpn, rqkey)  wr.RecvWR(wr_id=, num_sge=, sg=)

**This module has never run against a real RNIC** (the development machine has
none); it is exercised only against that fake.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import time
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from collector.lab_clock import RecordingClock
from collector.probe_packet import (
    FLAG_RDMA,
    KIND_PROBE,
    SIZE,
    PacketCodec,
    PacketError,
    ReplayWindow,
)
from collector.record_buffer import RecordBuffer
from collector.records import Transport, TsKind

log = logging.getLogger("clockmesh.collector.verbs")
QKEY = 0x11111111
GRH = 40
SLOT = 128  # bytes per buffer slot (GRH + probe, rounded up)
RECV_SLOTS = 512
SEND_SLOTS = 512
WR_SEND = 1 << 32  # wr_id >= this: a send slot
PATHS = 8
# ibv_wc_opcode / ibv_wc_status values (rdma-core verbs.h)
IBV_WC_SEND = 0
IBV_WC_RECV = 128
IBV_WC_SUCCESS = 0


@dataclass(frozen=True)
class PyVerbs:
    """The pyverbs submodules the prober uses (real ones, or the test fake)."""

    device: Any
    pd: Any
    cq: Any
    mr: Any
    qp: Any
    addr: Any
    wr: Any
    enums: Any


def import_pyverbs() -> PyVerbs | None:
    try:
        mods = {
            name: importlib.import_module(f"pyverbs.{name}")
            for name in ("device", "pd", "cq", "mr", "qp", "addr", "wr")
        }
        enums: ModuleType = importlib.import_module("pyverbs.libibverbs_enums")
    except ImportError:
        return None
    return PyVerbs(enums=enums, **mods)


class UdProber:
    """One UD QP on (device, port) sending and receiving probes."""

    def __init__(
        self,
        pv: PyVerbs,
        device: str,
        port: int,
        sgid_index: int,
        codec: PacketCodec,
        clock: RecordingClock,
        me: int,
        buffers: dict[str, RecordBuffer],
        max_age_ns: int,
        spacing_ns: int,
    ) -> None:
        e = pv.enums
        self.pv, self.port, self.sgid_index = pv, port, sgid_index
        self.codec, self.clock, self.me, self.buffers = codec, clock, me, buffers
        self.max_age_ns, self.spacing_ns = max_age_ns, spacing_ns
        self.stats: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.replay = ReplayWindow()
        self.ctx = pv.device.Context(name=device)
        self.pd = pv.pd.PD(self.ctx)
        flags = (
            e.IBV_WC_STANDARD_FLAGS
            | e.ibv_create_cq_wc_flags.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
        )
        self.cq = pv.cq.CQEX(
            self.ctx, pv.cq.CqInitAttrEx(cqe=4 * (RECV_SLOTS + SEND_SLOTS), wc_flags=flags)
        )
        self.mr = pv.mr.MR(
            self.pd, SLOT * (RECV_SLOTS + SEND_SLOTS), e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
        )
        cap = pv.qp.QPCap(
            max_send_wr=SEND_SLOTS, max_recv_wr=RECV_SLOTS, max_send_sge=1, max_recv_sge=1
        )
        init = pv.qp.QPInitAttr(qp_type=e.ibv_qp_type.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap)
        attr = pv.qp.QPAttr(port_num=port)
        attr.qkey = QKEY
        attr.pkey_index = 0
        self.qp = pv.qp.QP(self.pd, init, attr)  # pyverbs takes a UD QP to RTS here
        self.qpn = int(self.qp.qp_num)
        self._ah: dict[tuple[str, int], Any] = {}
        self._send_seq = [0] * SEND_SLOTS  # slot -> seq being sent
        self._send_meta: list[tuple[int, int]] = [(0, 0)] * SEND_SLOTS  # slot -> (dst, path)
        self._next_send = 0
        for slot in range(RECV_SLOTS):
            self._post_recv(slot)

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            try:
                obj.close()
            except Exception as exc:  # closing must not take the collector down
                log.warning("event=verbs_close_failed error=%r", str(exc))

    # ---- sending --------------------------------------------------------------------
    def _post_recv(self, slot: int) -> None:
        w = self.pv.wr
        sge = w.SGE(self.mr.buf + slot * SLOT, SLOT, self.mr.lkey)
        self.qp.post_recv(w.RecvWR(wr_id=slot, num_sge=1, sg=[sge]), None)

    def _ah_for(self, gid: str, path: int) -> Any:
        key = (gid, path)
        ah = self._ah.get(key)
        if ah is None:
            a = self.pv.addr
            gr = a.GlobalRoute(
                dgid=a.GID(gid), flow_label=path + 1, sgid_index=self.sgid_index, hop_limit=64
            )
            ah = a.AH(self.pd, attr=a.AHAttr(port_num=self.port, is_global=1, gr=gr))
            self._ah[key] = ah
        return ah

    def send_pair(self, seq0: int, dst: int, gid: str, qpn: int, path: int) -> None:
        """A coded pair to ``dst`` (its GID and UD QPN) on ``path`` (flow label)."""
        e, w = self.pv.enums, self.pv.wr
        ah = self._ah_for(gid, path)
        start = 0
        for pair in (0, 1):
            if pair == 1:
                while time.perf_counter_ns() - start < self.spacing_ns:
                    pass
            seq = seq0 + pair
            slot = self._next_send
            self._next_send = (slot + 1) % SEND_SLOTS
            pkt = self.codec.pack(
                KIND_PROBE, pair, seq, self.me, dst, self.spacing_ns, self.clock.now(),
                flags=FLAG_RDMA, qpn=self.qpn, sport=path,
            )  # fmt: skip
            offset = (RECV_SLOTS + slot) * SLOT
            self.mr.write(pkt, SIZE, offset)
            sge = w.SGE(self.mr.buf + offset, SIZE, self.mr.lkey)
            wr = w.SendWR(
                wr_id=WR_SEND + slot,
                opcode=e.ibv_wr_opcode.IBV_WR_SEND,
                num_sge=1,
                sg=[sge],
                send_flags=e.ibv_send_flags.IBV_SEND_SIGNALED,
            )
            wr.set_wr_ud(ah, qpn, QKEY)
            if pair == 0:
                start = time.perf_counter_ns()
            try:
                self.qp.post_send(wr, None)
            except Exception as exc:  # PyverbsRDMAError: queue full, QP in error ...
                self.stats["rdma_send_errors"] += 1
                log.debug("event=rdma_post_send_failed error=%r", str(exc))
                return
            self._send_seq[slot] = seq
            self._send_meta[slot] = (dst, path)
            self.stats["rdma_probes_sent"] += 1

    # ---- completions ----------------------------------------------------------------
    def poll(self) -> None:
        """Every completion queued: PROBE_TX rows for sends, PROBE_RX for receives."""
        cq = self.cq
        attr = self.pv.cq.PollCqAttr()
        ret = cq.start_poll(attr)
        if ret != 0:
            return  # ENOENT: nothing to do
        try:
            while ret == 0:
                self._completion(cq)
                ret = cq.poll_next()
        finally:
            cq.end_poll()

    def _completion(self, cq: Any) -> None:
        wr_id, status = int(cq.wr_id), int(cq.status)
        ts = int(cq.read_completion_wallclock_ns())
        if wr_id >= WR_SEND:
            slot = wr_id - WR_SEND
            if status != IBV_WC_SUCCESS:
                self.stats["rdma_send_failed"] += 1
                return
            dst, path = self._send_meta[slot]
            seq = self._send_seq[slot]
            self.buffers["probe_tx"].append(
                seq, self.me, dst, path, 0, seq % 2, int(TsKind.RDMA), int(Transport.RDMA_UD),
                self.clock.skew(ts),
            )  # fmt: skip
            return
        slot = wr_id
        if status != IBV_WC_SUCCESS:
            self.stats["rdma_recv_failed"] += 1
            self._post_recv(slot)
            return
        length = int(cq.read_byte_len())
        data = bytes(self.mr.read(length, slot * SLOT))[GRH:]
        self._post_recv(slot)
        try:
            pr = self.codec.unpack(data)
        except PacketError as exc:
            self.rejected[exc.reason] += 1
            return
        if pr.kind != KIND_PROBE or not pr.flags & FLAG_RDMA:
            self.rejected["malformed"] += 1
            return
        if pr.dst != self.me:
            self.rejected["misdirected"] += 1
            return
        rx_ns = self.clock.skew(ts)
        if abs(rx_ns - pr.send_ns) > self.max_age_ns:
            self.rejected["stale"] += 1
            return
        if not self.replay.check_and_set(pr.src, pr.seq):
            self.rejected["replay"] += 1
            return
        self.buffers["probe_rx"].append(
            pr.seq, pr.src, pr.dst, pr.sport, 0, pr.pair, int(TsKind.RDMA),
            int(Transport.RDMA_UD), 0, rx_ns, pr.spacing_ns,
        )  # fmt: skip
        self.stats["rdma_probes_received"] += 1


def ipv4_mapped_gid(address: str) -> str:
    """The RoCE v2 GID of an IPv4 address, in the sysfs/pyverbs text form."""
    raw = b"\0" * 10 + b"\xff\xff" + ipaddress.IPv4Address(address).packed
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def choose_port(devices: list[Any], address_gid: str) -> tuple[str, int, int] | None:
    """(device, port, GID index) whose RoCE v2 GID is ``address_gid``, if any."""
    for dev in devices:
        for port in dev.ports:
            for index, gid, kind in port.gids:
                if gid == address_gid and kind == "RoCE v2":
                    return dev.name, port.port, index
    return None
