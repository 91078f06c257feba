"""The collector's link watch against the real kernel: veth pairs in a namespace."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.root

CHILD = textwrap.dedent(
    """
    import select, sys, time
    from collector.link_watch import LinkWatch
    watch = LinkWatch(["cmw0"])
    print("ready", flush=True)
    for line in sys.stdin:  # one line per change the parent made: report what we saw
        # the whole 2 s: the kernel reports a carrier change up to a second late
        # (linkwatch), after the far end's own message, and it must count for this step
        deadline, changed = time.monotonic() + 2.0, False
        while (left := deadline - time.monotonic()) > 0:
            select.select([watch], [], [], left)
            changed = watch.drain() or changed
        print("changed" if changed else "nothing", flush=True)
    """
)


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    name = f"cmwatch{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for a, b in (("cmw0", "cmw1"), ("other0", "other1")):
            subprocess.run(["ip", "-n", name, "link", "add", a, "type", "veth", "peer", b],
                           check=True)  # fmt: skip
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_watched_link_going_down_or_up_is_reported_and_another_is_not(netns: str) -> None:
    child = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        seen = []
        # cmw1 is the far end (the switch port): its going down is cmw0 losing carrier.
        steps = (("cmw0", "up"), ("other0", "up"), ("cmw1", "up"), ("other1", "up"),
                 ("cmw1", "down"))  # fmt: skip
        for dev, state in steps:
            subprocess.run(["ip", "-n", netns, "link", "set", dev, state], check=True)
            child.stdin.write("go\n")
            child.stdin.flush()
            seen.append(child.stdout.readline().strip())
        assert seen == ["changed", "nothing", "changed", "nothing", "changed"]
    finally:
        child.kill()
        child.wait()
