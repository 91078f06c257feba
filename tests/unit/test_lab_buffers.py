"""Shallow buffers: queues sized in time at the link's capacity (lab capacity --buffer)."""

from __future__ import annotations

import pytest

from lab import capacity
from lab.cli import parse_duration


@pytest.mark.parametrize(
    ("rate", "buffer_us", "packets"),
    [("50mbit", 500, 2), ("1gbit", 400, 33), ("20mbit", 100, 1), ("10gbit", 100, 82)],
)
def test_a_buffer_in_time_is_whole_full_size_frames_at_the_rate(
    rate: str, buffer_us: float, packets: int
) -> None:
    n = capacity.buffer_packets(rate, buffer_us)
    assert n == packets
    # never more than the buffer asked for, unless one frame is already longer
    assert n * capacity.MTU_BITS / capacity.parse_rate(rate) * 1e6 <= max(
        buffer_us, capacity.MTU_BITS / capacity.parse_rate(rate) * 1e6
    )


def test_durations_take_microseconds() -> None:
    assert parse_duration("500us", "--buffer") == pytest.approx(5e-4)
    assert parse_duration("500µs", "--buffer") == pytest.approx(5e-4)
    assert parse_duration("1ms", "--buffer") == pytest.approx(1e-3)


def test_a_queue_under_two_frames_is_refused_with_the_buffer_that_would_do() -> None:
    with pytest.raises(capacity.CapacityError) as err:
        capacity.queue_for("50mbit", buffer_us=200)
    assert str(err.value) == (
        "--buffer: 200 µs holds 1 full frame at 50mbit (242 µs each); expected at least 2: "
        "484us or more, or a higher --rate"
    )
    assert capacity.queue_for("50mbit", buffer_us=484.5) == 2
    assert capacity.queue_for("1gbit", buffer_us=200) == 16
    with pytest.raises(capacity.CapacityError, match="--queue: expected at least 2 packets"):
        capacity.queue_for("50mbit", queue=1)
