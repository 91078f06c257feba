"""Link events from the kernel, the moment they happen.

The counters are sampled once a second; a port that goes down should not wait for the
next sample, nor for the next segment. The kernel announces every change of a link's
state (carrier, operstate, admin up/down) to the ``RTMGRP_LINK`` netlink group as an
``RTM_NEWLINK`` message. :class:`LinkWatch` listens to that group and says whether one of
the watched interfaces changed; the agent then samples the counters at once and ships
them as an urgent segment.

Only the fixed header of each message is read (``nlmsghdr`` + ``ifinfomsg``: the
interface index), nothing of its attributes: the state itself is read from sysfs by the
same code as every sample, so an urgent sample and a regular one cannot disagree. The
standard library's ``AF_NETLINK`` socket is all this needs; a netlink library would add a
dependency to every fleet host for two ``struct`` reads.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct

log = logging.getLogger("clockmesh.collector.links")

RTMGRP_LINK = 1
RTM_NEWLINK = 16
RTM_DELLINK = 17
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change


class LinkWatch:
    """A non-blocking netlink socket on ``RTMGRP_LINK``, for the agent's selector."""

    def __init__(self, interfaces: list[str]) -> None:
        self.interfaces = list(interfaces)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            self.sock.setblocking(False)
            self.sock.bind((0, RTMGRP_LINK))
        except OSError:
            self.sock.close()
            raise
        self.events = 0  # changes of a watched interface (or notifications lost: ENOBUFS)

    def fileno(self) -> int:
        return self.sock.fileno()

    def _indexes(self) -> set[int]:
        """Indexes now (an interface may be re-created with a new index)."""
        out = set()
        for name in self.interfaces:
            try:
                out.add(socket.if_nametoindex(name))
            except OSError:
                continue
        return out

    def drain(self) -> bool:
        """Read every pending message; True if one was about a watched interface."""
        changed = False
        watched: set[int] | None = None
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # lost some: assume they were ours
                    changed = True
                    continue
                log.warning("event=link_watch_error reason=%r", str(exc))
                break
            if not data:
                break
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, off)
                if length < _NLMSGHDR.size:
                    break
                if kind in (RTM_NEWLINK, RTM_DELLINK) and length >= (
                    _NLMSGHDR.size + _IFINFOMSG.size
                ):
                    index = _IFINFOMSG.unpack_from(data, off + _NLMSGHDR.size)[2]
                    if watched is None:
                        watched = self._indexes()
                    if index in watched:
                        changed = True
                off += (length + 3) & ~3
        if changed:
            self.events += 1
        return changed

    def close(self) -> None:
        self.sock.close()
