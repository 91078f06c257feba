"""Small helpers the lab tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """``pred()``'s first truthy value within ``timeout`` seconds, else AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s: {what}")
