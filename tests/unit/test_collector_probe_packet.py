from __future__ import annotations

import numpy as np
import pytest

from collector.probe_packet import (
    FLAG_ECHO,
    KIND_ECHO,
    KIND_PROBE,
    SIZE,
    PacketCodec,
    PacketError,
    ReplayWindow,
)

KEY = b"k" * 32


def test_round_trip_carries_every_field() -> None:
    codec = PacketCodec(KEY)
    pkt = codec.pack(
        KIND_ECHO,
        1,
        99,
        7,
        -8,
        20_000,
        123,
        ts_kind=1,
        t2_ns=5,
        t3_ns=6,
        sport=40001,
        flags=FLAG_ECHO,
    )
    assert len(pkt) == SIZE == 88
    p = codec.unpack(pkt)
    assert (p.kind, p.pair, p.seq, p.src, p.dst, p.spacing_ns, p.send_ns) == (
        KIND_ECHO,
        1,
        99,
        7,
        -8,
        20_000,
        123,
    )
    assert (p.ts_kind, p.t2_ns, p.t3_ns, p.sport, p.flags) == (1, 5, 6, 40001, FLAG_ECHO)


def test_mac_is_standard_keyed_blake2b() -> None:
    import hashlib

    for key in (KEY, b"short-key-16byte", b"L" * 64):
        pkt = PacketCodec(key).pack(KIND_PROBE, 1, 2, 3, 4, 5, 6)
        want = hashlib.blake2b(pkt[:72], key=key, digest_size=16, person=b"clockmesh-probe")
        assert pkt[72:] == want.digest()
    long_key = b"L" * 100  # over BLAKE2b's 64-byte key limit: hashed to 64 bytes first
    pkt = PacketCodec(long_key).pack(KIND_PROBE, 1, 2, 3, 4, 5, 6)
    k64 = hashlib.blake2b(long_key, digest_size=64, person=b"clockmesh-probe").digest()
    assert (
        pkt[72:]
        == hashlib.blake2b(pkt[:72], key=k64, digest_size=16, person=b"clockmesh-probe").digest()
    )


def test_version_1_packets_are_malformed() -> None:
    pkt = bytearray(PacketCodec(KEY).pack(KIND_PROBE, 0, 1, 2, 3, 4, 5))
    pkt[4] = 1  # the HMAC-SHA256 generation of the format
    with pytest.raises(PacketError, match="malformed"):
        PacketCodec(KEY).unpack(bytes(pkt))


def test_forged_tampered_and_malformed_are_told_apart() -> None:
    good = PacketCodec(KEY).pack(KIND_PROBE, 0, 1, 2, 3, 4, 5)
    forged = PacketCodec(b"x" * 32).pack(KIND_PROBE, 0, 1, 2, 3, 4, 5)
    codec = PacketCodec(KEY)
    with pytest.raises(PacketError) as info:
        codec.unpack(forged)
    assert info.value.reason == "auth"
    tampered = bytearray(good)
    tampered[10] ^= 1  # seq changed after signing
    with pytest.raises(PacketError, match="auth"):
        codec.unpack(bytes(tampered))
    for bad in (good[:-1], good + b"\0", b"XXXX" + good[4:], b""):
        with pytest.raises(PacketError, match="malformed"):
            codec.unpack(bad)


def test_replay_window_accepts_each_seq_once_and_reordering() -> None:
    w = ReplayWindow(size=64)
    assert w.check_and_set(1, 100)
    assert not w.check_and_set(1, 100)
    assert w.check_and_set(1, 103)
    assert w.check_and_set(1, 101)  # late, inside the window
    assert not w.check_and_set(1, 101)
    assert w.check_and_set(2, 100)  # another sender has its own window
    assert w.check_and_set(1, 500)
    assert not w.check_and_set(1, 500 - 64)  # fell out of the window
    assert w.check_and_set(1, 500 - 63)
    for src in range(3, 40):  # grows past the initial slot count
        assert w.check_and_set(src, 1)
        assert not w.check_and_set(src, 1)


def test_replay_window_batch_matches_one_by_one() -> None:
    """check_batch gives the loop's answers and leaves the loop's state, for in-order,
    interleaved (spaced pairs), replayed, late, window-jumping and mixed-sender batches."""
    rng = np.random.default_rng(7)
    size = 64
    batch_w, loop_w = ReplayWindow(size=size), ReplayWindow(size=size)
    top = {1: 1000, 2: 5000, 3: 10**12}
    kinds_seen = set()
    for step in range(400):
        kind = step % 6
        kinds_seen.add(kind)
        srcs, seqs = [], []
        for src in (1, 2, 3) if kind == 5 else (1 + step % 3,):
            t = top[src]
            if kind == 0:  # in order, all new
                q = list(range(t + 1, t + 1 + int(rng.integers(1, 40))))
            elif kind == 1:  # spaced pairs: firsts, then seconds
                k = int(rng.integers(1, 20))
                q = [t + 2 + 2 * i for i in range(k)] + [t + 3 + 2 * i for i in range(k)]
            elif kind == 2:  # replays and late ones mixed in
                q = [int(x) for x in rng.integers(t - 2 * size, t + 20, 30)]
            elif kind == 3:  # a jump of more than the window inside the batch
                q = [t + 1, t + 3 * size, t + 2, t + 3 * size - 5]
            else:  # random new ones, shuffled (some beyond the window of others)
                q = [int(x) for x in rng.permutation(np.arange(t + 1, t + 1 + 2 * size))[:50]]
            top[src] = max(top[src], *q)
            srcs += [src] * len(q)
            seqs += q
        want = [loop_w.check_and_set(s, q) for s, q in zip(srcs, seqs, strict=True)]
        got = batch_w.check_batch(np.array(srcs, np.uint32), np.array(seqs, np.uint64))
        assert got.tolist() == want, (step, kind)
        assert batch_w._state == loop_w._state, (step, kind)
    assert kinds_seen == set(range(6))
    assert batch_w.check_batch(np.zeros(0, np.uint32), np.zeros(0, np.uint64)).shape == (0,)
