"""Many UDP datagrams per system call: ``recvmmsg(2)`` / ``sendmmsg(2)`` through ctypes.

A :class:`DatagramBatch` owns preallocated numpy buffers for ``capacity`` datagrams:
payload slots (``data``, one row per datagram), ``sockaddr_in`` names, control
(cmsg) buffers and the kernel's ``struct mmsghdr`` array itself, laid out as a
numpy structured array. One ``recv`` fills up to ``capacity`` datagrams with their
kernel timestamps; the caller then parses the whole batch with numpy views
(``data.view(dtype)``, ``control.view(dtype)``) instead of unpacking each datagram
in Python. ``send`` sends ``count`` prepared datagrams in one call.

Where the C library has no ``recvmmsg``/``sendmmsg`` (or the platform is not a
64-bit one whose ``struct msghdr`` layout we mirror), the same methods fall back
to one ``recvmsg_into``/``sendto`` per datagram and write the results into the
same buffers in the kernel's format, so callers have one code path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket
import struct
from typing import Any

import numpy as np

_CMSG_HDR = struct.Struct("=Qii")  # struct cmsghdr on LP64: size_t len, int level, int type
_SOCKADDR_IN = struct.Struct("!HH4s8x")  # family is host order: fixed up below
MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
_AGAIN = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR}

MMSGHDR = np.dtype(
    {
        "names": ["name", "namelen", "iov", "iovlen", "control", "controllen", "flags", "len"],
        "formats": ["=u8", "=u4", "=u8", "=u8", "=u8", "=u8", "=i4", "=u4"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 56],
        "itemsize": 64,
    }
)
IOVEC = np.dtype({"names": ["base", "len"], "formats": ["=u8", "=u8"], "itemsize": 16})


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.c_void_p),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


def _load_libc() -> tuple[Any, Any] | None:
    """(recvmmsg, sendmmsg) from the C library, or None where they cannot be used."""
    if ctypes.sizeof(_MMsgHdr) != MMSGHDR.itemsize or _MsgHdr.controllen.offset != 40:
        return None  # not the LP64 layout mirrored by MMSGHDR
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        recv, send = libc.recvmmsg, libc.sendmmsg
    except (OSError, AttributeError):
        return None
    recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    recv.restype = ctypes.c_int
    send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    send.restype = ctypes.c_int
    return recv, send


_LIBC = _load_libc()


def native_available() -> bool:
    """True when recvmmsg/sendmmsg are called directly (else one syscall per datagram)."""
    return _LIBC is not None


class DatagramBatch:
    """Buffers for up to ``capacity`` datagrams of at most ``slot`` bytes each."""

    def __init__(self, capacity: int, slot: int, control: int = 0, *, native: bool = True) -> None:
        self.capacity = capacity
        self.slot = slot
        self.control_size = control
        self.native = native and _LIBC is not None
        self.data = np.zeros((capacity, slot), np.uint8)
        self.names = np.zeros((capacity, 16), np.uint8)
        self.control = np.zeros((capacity, max(control, 8)), np.uint8)
        self.iov = np.zeros(capacity, IOVEC)
        self.hdr = np.zeros(capacity, MMSGHDR)
        self.iov["base"] = self.data.ctypes.data + slot * np.arange(capacity, dtype=np.uint64)
        self.iov["len"] = slot
        self.hdr["name"] = self.names.ctypes.data + 16 * np.arange(capacity, dtype=np.uint64)
        self.hdr["namelen"] = 16
        self.hdr["iov"] = self.iov.ctypes.data + IOVEC.itemsize * np.arange(
            capacity, dtype=np.uint64
        )
        self.hdr["iovlen"] = 1
        if control:
            self.hdr["control"] = self.control.ctypes.data + self.control.shape[1] * np.arange(
                capacity, dtype=np.uint64
            )
        self.hdr["controllen"] = control
        self._hdr_addr = self.hdr.ctypes.data
        # Rows below this may have had namelen/controllen changed by the kernel since
        # they were last reset; rows above are still as set (resetting all 1,024 per
        # call costs more than the call itself).
        self._dirty = 0
        self._mv = memoryview(self.data.reshape(-1).data)  # flat bytes, for MAC loops
        self._views: dict[np.dtype, np.ndarray] = {}

    # ---- views ----------------------------------------------------------------------
    @property
    def buffer(self) -> memoryview:
        """All payload slots as one flat memoryview (slot ``i`` starts at ``i * slot``)."""
        return self._mv

    def lengths(self, n: int) -> np.ndarray:
        return self.hdr["len"][:n]

    def msg_flags(self, n: int) -> np.ndarray:
        return self.hdr["flags"][:n]

    def controllen(self, n: int) -> np.ndarray:
        return self.hdr["controllen"][:n]

    def ports(self, n: int) -> np.ndarray:
        """Source ports (host order) of the first ``n`` received datagrams."""
        p = self.names[:n, 2:4].astype(np.uint16)
        return (p[:, 0] << 8) | p[:, 1]

    def set_name(self, i: int, address: str, port: int) -> None:
        self.names[i] = np.frombuffer(sockaddr_in(address, port), np.uint8)

    # ---- receiving ------------------------------------------------------------------
    def recv(self, sock: socket.socket, flags: int = 0, start: int = 0) -> int:
        """Receive queued datagrams into rows ``start..capacity-1`` without blocking.

        Returns how many arrived (0: none queued). ``flags`` may add ``MSG_ERRQUEUE``.
        Errors other than "nothing queued" raise.
        """
        n = self.capacity - start
        if n <= 0:
            return 0
        if self._dirty > start:
            self.hdr["controllen"][start : self._dirty] = self.control_size
            self.hdr["namelen"][start : self._dirty] = 16
            self._dirty = start
        if self.native:
            assert _LIBC is not None
            addr = self._hdr_addr + start * MMSGHDR.itemsize
            got = _LIBC[0](sock.fileno(), addr, n, int(flags) | MSG_DONTWAIT, None)
            if got >= 0:
                self._dirty = start + got
                return got
            err = ctypes.get_errno()
            if err in _AGAIN:
                return 0
            self._dirty = self.capacity  # be safe: reset every row before the next call
            raise OSError(err, errno.errorcode.get(err, "recvmmsg failed"))
        got = self._recv_emulated(sock, flags, start)
        self._dirty = start + got
        return got

    def control_view(self, dtype: np.dtype) -> np.ndarray:
        """The control buffers as one ``dtype`` row per datagram (cached per dtype)."""
        view = self._views.get(dtype)
        if view is None:
            view = self._views[dtype] = self.control.view(dtype)[:, 0]
        return view

    def _recv_emulated(self, sock: socket.socket, flags: int, start: int) -> int:
        got = 0
        for i in range(start, self.capacity):
            try:
                nbytes, anc, mflags, addr = sock.recvmsg_into(
                    [self._mv[i * self.slot : (i + 1) * self.slot]], self.control_size, flags
                )
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                if got:
                    break
                raise
            h = self.hdr[i]
            h["len"] = nbytes
            h["flags"] = mflags
            ctrl = b"".join(_cmsg(level, ctype, data) for level, ctype, data in anc)
            ctrl = ctrl[: self.control_size]
            self.control[i, : len(ctrl)] = np.frombuffer(ctrl, np.uint8)
            h["controllen"] = len(ctrl)
            if isinstance(addr, tuple) and len(addr) == 2:
                self.names[i] = np.frombuffer(sockaddr_in(addr[0], addr[1]), np.uint8)
            got += 1
        return got

    # ---- sending --------------------------------------------------------------------
    def send(self, sock: socket.socket, start: int, count: int) -> int:
        """Send datagrams ``start .. start+count-1`` (lengths in ``hdr['iov']`` lengths).

        Returns how many were sent (>= 1); if the first one fails, raises its OSError.
        Set the lengths with :meth:`set_lengths` and the names with ``names``.
        """
        if count <= 0:
            return 0
        if self.native:
            assert _LIBC is not None
            sent = _LIBC[1](sock.fileno(), self._hdr_addr + start * MMSGHDR.itemsize, count, 0)
            if sent > 0:
                return sent
            err = ctypes.get_errno()
            raise OSError(err, errno.errorcode.get(err, "sendmmsg failed"))
        sent = 0
        for i in range(start, start + count):
            length = int(self.iov["len"][i])
            try:
                sock.sendto(self._mv[i * self.slot : i * self.slot + length], _addr(self.names[i]))
            except OSError:
                if sent:
                    return sent
                raise
            sent += 1
        return sent

    def set_lengths(self, start: int, count: int, length: int | np.ndarray) -> None:
        self.iov["len"][start : start + count] = length

    def reset_lengths(self) -> None:
        """Back to full slots (for receiving after a send)."""
        self.iov["len"] = self.slot


def _cmsg(level: int, ctype: int, data: bytes) -> bytes:
    length = _CMSG_HDR.size + len(data)
    pad = (-length) % 8
    return _CMSG_HDR.pack(length, level, ctype) + data + b"\0" * pad


def sockaddr_in(address: str, port: int) -> bytes:
    """``struct sockaddr_in`` for an IPv4 address and port (family in host order)."""
    raw = bytearray(_SOCKADDR_IN.pack(0, port, socket.inet_aton(address)))
    struct.pack_into("=H", raw, 0, socket.AF_INET)
    return bytes(raw)


def _addr(name: np.ndarray) -> tuple[str, int]:
    raw = name.tobytes()
    return socket.inet_ntoa(raw[4:8]), (raw[2] << 8) | raw[3]
