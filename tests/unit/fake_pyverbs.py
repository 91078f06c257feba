"""A fake of exactly the pyverbs calls the collector makes (collector/verbs.py, verbs_probe.py).

Signatures follow rdma-core's pyverbs (device.pyx, pd.pyx, cq.pyx, mr.pyx, qp.pyx,
addr.pyx, wr.pyx). Instead of an RNIC, a ``Fabric`` delivers UD sends between fake
QPs in this process: the payload lands in a posted receive buffer behind a 40-byte
GRH, and both sides get a completion stamped with CLOCK_REALTIME (as
``read_completion_wallclock_ns`` returns on a NIC in real-time clock mode).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

from collector.verbs_probe import PyVerbs

ENOENT = 2


class FakeRDMAError(Exception):
    pass


class Fabric:
    """Connects fake devices: GID -> context, (context, qpn) -> QP."""

    def __init__(self) -> None:
        self.devices: dict[str, dict[str, Any]] = {}  # name -> {"gids": [(gid, type)], "port": 1}
        self.qps: dict[int, FakeQP] = {}
        self.lock = threading.Lock()
        self._qpn = itertools.count(0x100)
        self._addr = itertools.count(1)
        self.calls: list[str] = []

    def add_device(self, name: str, gids: list[tuple[str, int]]) -> None:
        self.devices[name] = {"gids": gids}

    def deliver(self, src: FakeQP, ah: FakeAH, rqpn: int, rqkey: int, payload: bytes) -> bool:
        with self.lock:
            dst = self.qps.get(rqpn)
            dgid = ah.attr.gr.dgid.gid
            if dst is None or dgid not in [g for g, _ in self.devices[dst.ctx.name]["gids"]]:
                return False  # UD: silently lost, like an unreachable destination
            if rqkey != dst.qkey or not dst.recv_queue:
                return False
            wr = dst.recv_queue.popleft()
            sge = wr.sg[0]
            mr = dst.pd_mrs_lookup(sge.addr)
            mr.mem[sge.addr - mr.buf : sge.addr - mr.buf + 40 + len(payload)] = b"\0" * 40 + payload
            dst.rcq.push(wr.wr_id, 0, 128, 40 + len(payload))
            return True


class GID:
    def __init__(self, val: str | None = None) -> None:
        self.gid = val or "0000:0000:0000:0000:0000:0000:0000:0000"

    def __str__(self) -> str:
        return self.gid


class GlobalRoute:
    def __init__(
        self,
        dgid: GID | None = None,
        flow_label: int = 0,
        sgid_index: int = 0,
        hop_limit: int = 1,
        traffic_class: int = 0,
    ) -> None:
        self.dgid, self.flow_label, self.sgid_index, self.hop_limit = (
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
        )


class AHAttr:
    def __init__(
        self,
        dlid: int = 0,
        sl: int = 0,
        src_path_bits: int = 0,
        static_rate: int = 0,
        is_global: int = 0,
        port_num: int = 1,
        gr: GlobalRoute | None = None,
    ) -> None:
        self.is_global, self.port_num, self.gr = is_global, port_num, gr


class FakeAH:
    def __init__(self, pd: FakePD, **kwargs: Any) -> None:
        self.pd, self.attr = pd, kwargs["attr"]


class SGE:
    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr, self.length, self.lkey = addr, length, lkey


class RecvWR:
    def __init__(
        self, wr_id: int = 0, num_sge: int = 0, sg: list[SGE] | None = None, next_wr: Any = None
    ) -> None:
        self.wr_id, self.num_sge, self.sg = wr_id, num_sge, sg or []


class SendWR:
    def __init__(
        self,
        wr_id: int = 0,
        opcode: int = 0,
        num_sge: int = 0,
        imm_data: int = 0,
        sg: list[SGE] | None = None,
        send_flags: int = 2,
        next_wr: Any = None,
    ) -> None:
        self.wr_id, self.opcode, self.num_sge, self.sg, self.send_flags = (
            wr_id,
            opcode,
            num_sge,
            sg or [],
            send_flags,
        )
        self.ud: tuple[FakeAH, int, int] | None = None

    def set_wr_ud(self, ah: FakeAH, rqpn: int, rqkey: int) -> None:
        self.ud = (ah, rqpn, rqkey)


class Context:
    fabric: Fabric

    def __init__(self, **kwargs: Any) -> None:
        self.name = kwargs["name"]
        self.fabric.calls.append(f"Context({self.name})")

    def query_device(self) -> SimpleNamespace:
        return SimpleNamespace(phys_port_cnt=1)

    def query_port(self, port_num: int) -> SimpleNamespace:
        return SimpleNamespace(
            state=4, gid_tbl_len=len(self.fabric.devices[self.name]["gids"]) + 2, link_layer=2
        )

    def query_gid(self, port_num: int, index: int) -> GID:
        gids = self.fabric.devices[self.name]["gids"]
        if index >= len(gids):
            return GID()
        return GID(gids[index][0])

    def query_gid_type(self, port_num: int, index: int) -> int:
        gids = self.fabric.devices[self.name]["gids"]
        if index >= len(gids):
            raise FakeRDMAError("Failed to query gid type")
        return gids[index][1]

    def close(self) -> None:
        pass


class FakePD:
    def __init__(self, ctx: Context) -> None:
        self.ctx, self.mrs = ctx, []

    def close(self) -> None:
        pass


class MR:
    def __init__(self, pd: FakePD, length: int, access: int) -> None:
        self.mem = bytearray(length)
        self.buf = next(pd.ctx.fabric._addr) << 32
        self.lkey = 7
        pd.mrs.append(self)

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        self.mem[offset : offset + length] = data[:length]

    def read(self, length: int, offset: int) -> bytes:
        return bytes(self.mem[offset : offset + length])

    def close(self) -> None:
        pass


class CqInitAttrEx:
    def __init__(
        self,
        cqe: int = 100,
        channel: Any = None,
        comp_vector: int = 0,
        wc_flags: int = 0,
        comp_mask: int = 0,
        flags: int = 0,
    ) -> None:
        self.cqe, self.wc_flags = cqe, wc_flags


class PollCqAttr:
    pass


class CQEX:
    def __init__(self, context: Context, init_attr: CqInitAttrEx) -> None:
        if (
            not init_attr.wc_flags
            & Enums.ibv_create_cq_wc_flags.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
        ):
            raise FakeRDMAError("test wants wallclock timestamps requested")
        self.queue: deque[tuple[int, int, int, int, int]] = deque()
        self.lock = threading.Lock()
        self.cur: tuple[int, int, int, int, int] | None = None
        self.wr_id = self.status = 0

    def push(self, wr_id: int, status: int, opcode: int, byte_len: int) -> None:
        with self.lock:
            self.queue.append((wr_id, status, opcode, byte_len, time.time_ns()))

    def _next(self) -> int:
        with self.lock:
            if not self.queue:
                return ENOENT
            self.cur = self.queue.popleft()
        self.wr_id, self.status = self.cur[0], self.cur[1]
        return 0

    def start_poll(self, attr: PollCqAttr) -> int:
        return self._next()

    def poll_next(self) -> int:
        return self._next()

    def end_poll(self) -> None:
        self.cur = None

    def read_opcode(self) -> int:
        assert self.cur is not None
        return self.cur[2]

    def read_byte_len(self) -> int:
        assert self.cur is not None
        return self.cur[3]

    def read_completion_wallclock_ns(self) -> int:
        assert self.cur is not None
        return self.cur[4]

    def close(self) -> None:
        pass


class QPCap:
    def __init__(
        self,
        max_send_wr: int = 1,
        max_recv_wr: int = 10,
        max_send_sge: int = 1,
        max_recv_sge: int = 1,
        max_inline_data: int = 0,
    ) -> None:
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr


class QPInitAttr:
    def __init__(
        self,
        qp_type: int = 2,
        qp_context: Any = None,
        scq: Any = None,
        rcq: Any = None,
        srq: Any = None,
        cap: QPCap | None = None,
        sq_sig_all: int = 1,
    ) -> None:
        self.qp_type, self.scq, self.rcq, self.cap = qp_type, scq, rcq, cap


class QPAttr:
    def __init__(
        self, qp_state: int = 1, cur_qp_state: int = 0, port_num: int = 1, path_mtu: int = 3
    ) -> None:
        self.port_num, self.qkey, self.pkey_index = port_num, 0, 0


class FakeQP:
    def __init__(self, pd: FakePD, init_attr: QPInitAttr, qp_attr: QPAttr) -> None:
        assert init_attr.qp_type == Enums.ibv_qp_type.IBV_QPT_UD
        self.ctx, self.pd = pd.ctx, pd
        self.scq, self.rcq = init_attr.scq, init_attr.rcq
        self.qkey = qp_attr.qkey
        self.fabric = pd.ctx.fabric
        self.qp_num = next(self.fabric._qpn)
        self.recv_queue: deque[RecvWR] = deque()
        self.max_recv = init_attr.cap.max_recv_wr if init_attr.cap else 10
        self.fabric.qps[self.qp_num] = self

    def pd_mrs_lookup(self, addr: int) -> MR:
        for mr in self.pd.mrs:
            if mr.buf <= addr < mr.buf + len(mr.mem):
                return mr
        raise FakeRDMAError(f"no MR holds address {addr:#x}")

    def post_recv(self, wr: RecvWR, bad_wr: Any) -> None:
        if len(self.recv_queue) >= self.max_recv:
            raise FakeRDMAError("receive queue full")
        self.recv_queue.append(wr)

    def post_send(self, wr: SendWR, bad_wr: Any) -> None:
        assert wr.ud is not None and wr.opcode == Enums.ibv_wr_opcode.IBV_WR_SEND
        sge = wr.sg[0]
        mr = self.pd_mrs_lookup(sge.addr)
        payload = bytes(mr.mem[sge.addr - mr.buf : sge.addr - mr.buf + sge.length])
        ah, rqpn, rqkey = wr.ud
        self.fabric.deliver(self, ah, rqpn, rqkey, payload)
        self.scq.push(wr.wr_id, 0, 0, sge.length)  # UD sends complete even if lost

    def close(self) -> None:
        self.fabric.qps.pop(self.qp_num, None)


class Enums:
    IBV_WC_STANDARD_FLAGS = 0x7F
    ibv_create_cq_wc_flags = SimpleNamespace(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK=1 << 10)
    ibv_access_flags = SimpleNamespace(IBV_ACCESS_LOCAL_WRITE=1)
    ibv_qp_type = SimpleNamespace(IBV_QPT_UD=4)
    ibv_wr_opcode = SimpleNamespace(IBV_WR_SEND=2)
    ibv_send_flags = SimpleNamespace(IBV_SEND_SIGNALED=2)


def make(fabric: Fabric) -> PyVerbs:
    """A PyVerbs bundle whose contexts live on ``fabric``."""
    ctx_cls = type("Context", (Context,), {"fabric": fabric})
    return PyVerbs(
        device=SimpleNamespace(
            Context=ctx_cls,
            get_device_list=lambda: [SimpleNamespace(name=n.encode()) for n in fabric.devices],
        ),
        pd=SimpleNamespace(PD=FakePD),
        cq=SimpleNamespace(CQEX=CQEX, CqInitAttrEx=CqInitAttrEx, PollCqAttr=PollCqAttr),
        mr=SimpleNamespace(MR=MR),
        qp=SimpleNamespace(QP=FakeQP, QPCap=QPCap, QPInitAttr=QPInitAttr, QPAttr=QPAttr),
        addr=SimpleNamespace(GID=GID, GlobalRoute=GlobalRoute, AHAttr=AHAttr, AH=FakeAH),
        wr=SimpleNamespace(SGE=SGE, SendWR=SendWR, RecvWR=RecvWR),
        enums=Enums,
    )
