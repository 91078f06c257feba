"""Fabric link capacities and the RDMA traffic class, as a real RoCE fabric has them.

A lab veth has no capacity of its own: two jobs on one link never slow each other, and no
queue ever forms. ``clockmesh lab capacity --rate 50mbit`` gives every leaf–spine link (both
directions) a capacity and two traffic classes, as an RDMA fabric is configured:

- the **RDMA class**: IP packets with the RoCE v2 DSCP (26 by default; RoCE v2 frames are
  UDP/IP, so a routed fabric can classify them) — strict priority, its own queue;
- **best effort**: everything else, behind it.

Network control (CS6/CS7: BGP, BFD, the spines' ICMP answers to traces) has a class of
its own, served before both, as a real fabric protects it: a full queue must not take the
routing down.

RoCE v1 frames carry no IP header, so a routed fabric cannot give them the RDMA class: the
lab's job generator sends a job on a RoCE v1 GID without the DSCP, and it queues behind
bulk traffic while RoCE v2 jobs and the probes (which carry the DSCP, ``probe.dscp``) do
not. That makes a RoCE v1 job's in-band delay diverge from the out-of-band probes' under
load, as in production.

A switch port holds tens to hundreds of microseconds of queue, not the tens of
milliseconds a Linux queue of 100 packets holds at lab rates: ``--buffer 400us`` sizes
each class's queue in time at the capacity, so a saturated port queues at most that long
and drops beyond. In bytes (:func:`buffer_bytes`, a ``bfifo``), as a switch's buffer is:
a queue counted in full frames (a ``pfifo`` of :func:`buffer_packets`) holds two at
50 Mbit/s and 500 µs, and a probe round of ~100-byte probes meeting a job's frame
overflowed it — healthy jobs at a fifth of the capacity lost 41 packets of the RDMA class
in 40 s, and a link was once paged as contended for it (2026-12-06); the same 3125 bytes
lost none. At least two full frames (:data:`MIN_QUEUE`: with one, the probes' own rounds
drop behind any frame in service).
The scenario generator (:mod:`lab.scenario`) uses 50 Mbit/s with 500 µs buffers.

Shape per link end (``tc``): ``htb`` root, one class at the capacity, three children —
control (rate 5 %, prio 0), RDMA (90 %, prio 1) and best effort (5 %, prio 2), each with a
ceiling of 100 % and a ``bfifo`` of the buffer's bytes (a switch's shallow buffer; a
``pfifo`` of ``queue`` packets when no buffer is given) — and
``u32`` filters on the DSCP. The
capacity is recorded in the lab's state: ``lab status`` shows it, ``lab heal`` puts it back
after removing a fault's qdisc, ``lab congest`` on a link replaces it with its ``tbf`` until
healed, and ``lab capacity`` again changes it in place.
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

from lab.fabric import LabError
from lab.topology import Link, LinkEnd

RDMA_DSCP = 26
QUEUE_PACKETS = 100
MIN_QUEUE = 2  # packets: a probe round sent back to back needs room behind a frame in service
MTU_BITS = 1514 * 8  # a full frame on a lab veth


def buffer_bytes(rate: str, buffer_us: float) -> int:
    """Bytes of each class's queue that hold ``buffer_us`` at ``rate``: a saturated queue
    waits at most that long (plus the frame in service) and drops beyond."""
    return int(buffer_us * 1e-6 * parse_rate(rate) / 8)


def buffer_packets(rate: str, buffer_us: float) -> int:
    """Packets of each class's queue that hold ``buffer_us`` of full frames at ``rate``
    (a switch buffer sized in time): at least 1. A saturated queue then waits at most
    that long (plus the frame in service) and drops beyond."""
    return max(1, int(buffer_us * 1e-6 * parse_rate(rate) / MTU_BITS))


class CapacityError(LabError):
    pass


def _tc(end: LinkEnd, args: list[str]) -> None:
    cmd = ["ip", "netns", "exec", end.namespace, "tc", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise CapacityError(
            f"tc {' '.join(args[:2])} on {end.node}:{end.interface}: {res.stderr.strip()}"
        )


def parse_rate(rate: str) -> float:
    """tc-style rate ('50mbit', '1gbit', '800kbit') -> bits per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    text = rate.strip().lower()
    for unit, mult in units.items():
        if text.endswith(unit):
            with contextlib.suppress(ValueError):
                value = float(text[: -len(unit)])
                if value > 0:
                    return value * mult
    raise LabError(f"--rate: expected a rate like 50mbit, 800kbit or 1gbit, got {rate!r}")


def queue_for(rate: str, queue: int = QUEUE_PACKETS, buffer_us: float | None = None) -> int:
    """Packets of each class's queue: ``queue``, or ``buffer_us`` of full frames at ``rate``.
    Refuses (:class:`CapacityError`) a queue under :data:`MIN_QUEUE` packets: with one, the
    probes' own rounds are dropped behind any frame in service on every link (loss with no
    wait everywhere, which no switch buffer of a real fabric does)."""
    bps = parse_rate(rate)
    if buffer_us is not None:
        if buffer_us <= 0:
            raise CapacityError(f"--buffer: expected a time above 0, got {buffer_us:g} µs")
        queue = buffer_packets(rate, buffer_us)
        if queue < MIN_QUEUE:
            frame_us = MTU_BITS / bps * 1e6
            raise CapacityError(
                f"--buffer: {buffer_us:g} µs holds {queue} full frame at {rate} ({frame_us:.0f} µs "
                f"each); expected at least {MIN_QUEUE}: {MIN_QUEUE * frame_us:.0f}us or more, "
                f"or a higher --rate"
            )
    elif queue < MIN_QUEUE:
        raise CapacityError(f"--queue: expected at least {MIN_QUEUE} packets, got {queue}")
    return queue


def _root_is_ours(end: LinkEnd) -> bool:
    """The link end's root qdisc is already ``shape_end``'s htb (``tc qdisc replace`` cannot
    change an htb in place: 'Change operation not supported')."""
    res = subprocess.run(["ip", "netns", "exec", end.namespace, "tc", "qdisc", "show", "dev",
                          end.interface, "root"], capture_output=True, text=True, timeout=30)  # fmt: skip
    return res.returncode == 0 and res.stdout.startswith("qdisc htb 1: root")


def shape_end(
    end: LinkEnd,
    rate: str,
    dscp: int = RDMA_DSCP,
    queue: int = QUEUE_PACKETS,
    limit_bytes: int | None = None,
) -> None:
    """Shape one link end (a capacity already there is changed in place: classes and
    queues replaced, the root kept); each class's queue ``limit_bytes`` deep (a
    ``bfifo``), else ``queue`` packets (a ``pfifo``)."""
    bps = parse_rate(rate)
    dev = ["dev", end.interface]
    quantum = ["quantum", "1514"]
    if not _root_is_ours(end):
        _tc(end, ["qdisc", "replace", *dev, "root", "handle", "1:", "htb", "default", "20"])
    _tc(end, ["class", "replace", *dev, "parent", "1:", "classid", "1:1", "htb",
              "rate", f"{bps:.0f}bit", "ceil", f"{bps:.0f}bit", *quantum])  # fmt: skip
    # Children: network control (CS6/CS7: BGP, BFD, ICMP errors) first, then the RDMA
    # class (the DSCP), then best effort; each its own queue.
    for cls, share, prio in (("5", 0.05, "0"), ("10", 0.90, "1"), ("20", 0.05, "2")):
        _tc(end, ["class", "replace", *dev, "parent", "1:1", "classid", f"1:{cls}", "htb",
                  "rate", f"{bps * share:.0f}bit", "ceil", f"{bps:.0f}bit", "prio", prio,
                  *quantum])  # fmt: skip
    fifo = ["bfifo", "limit", str(limit_bytes)] if limit_bytes else ["pfifo", "limit", str(queue)]
    for cls in ("5", "10", "20"):
        _tc(end, ["qdisc", "replace", *dev, "parent", f"1:{cls}", "handle", f"{cls}:", *fifo])
    _tc(end, ["filter", "replace", *dev, "parent", "1:", "protocol", "ip", "prio", "1",
              "u32", "match", "ip", "dsfield", "0xc0", "0xc0", "flowid", "1:5"])  # fmt: skip
    _tc(end, ["filter", "replace", *dev, "parent", "1:", "protocol", "ip", "prio", "2",
              "u32", "match", "ip", "dsfield", f"{dscp << 2:#x}", "0xfc",
              "flowid", "1:10"])  # fmt: skip


def apply(
    lab: Any,
    rate: str,
    dscp: int = RDMA_DSCP,
    queue: int = QUEUE_PACKETS,
    buffer_us: float | None = None,
) -> int:
    """Shape every fabric link (both ends) and record it; returns the link ends shaped.
    ``buffer_us`` sizes each queue in time, in bytes (:func:`buffer_bytes`), instead of
    ``queue`` packets; a capacity already applied is changed."""
    queue = queue_for(rate, queue, buffer_us)  # bad input fails before anything is touched
    limit = None if buffer_us is None else buffer_bytes(rate, buffer_us)
    links = [lk for lk in lab.topology.links if lk.kind == "fabric"]
    with lab.state.update() as st:
        st["capacity"] = {"rate": rate, "dscp": dscp, "queue": queue}
        if buffer_us is not None:
            st["capacity"].update(buffer_us=buffer_us, buffer_bytes=limit)
    n = 0
    for lk in links:
        for end in (lk.a, lk.b):
            shape_end(end, rate, dscp, queue, limit)
            n += 1
    return n


def current(lab: Any) -> dict[str, Any]:
    """The recorded capacity ({} when the fabric links are unlimited)."""
    return dict(lab.state.read().get("capacity") or {})


def reapply(lab: Any, link: Link) -> bool:
    """Put the recorded capacity back on ``link`` (after a fault's qdisc was removed)."""
    cap = current(lab)
    if not cap or link.kind != "fabric":
        return False
    for end in (link.a, link.b):
        shape_end(end, cap["rate"], int(cap.get("dscp", RDMA_DSCP)),
                  int(cap.get("queue", QUEUE_PACKETS)), cap.get("buffer_bytes"))  # fmt: skip
    return True


def remove(lab: Any) -> int:
    """Fabric links unlimited again."""
    n = 0
    for lk in lab.topology.links:
        if lk.kind != "fabric":
            continue
        for end in (lk.a, lk.b):
            subprocess.run(["ip", "netns", "exec", end.namespace, "tc", "qdisc", "del", "dev",
                            end.interface, "root"], capture_output=True, timeout=30)  # fmt: skip
            n += 1
    with lab.state.update() as st:
        st.pop("capacity", None)
    return n
