"""Which spine each probed path crosses now, as the path traces say
(:class:`analytics.detect.paths.FabricPaths` keeps it), with a count of its changes: a
reader that derives something from every path (the contention pass's routes) rebuilds it
only when the map moved."""

from __future__ import annotations

from typing import Any


class SpineMap(dict[tuple[int, int, int], str]):
    """(src, dst, sport) -> the spine its probes cross now, with ``version``: how many
    times it changed (a path new, moved or forgotten), so that a reader rebuilds what it
    derived from every path only when a trace moved one, not on every pass."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = 0

    def __setitem__(self, key: tuple[int, int, int], value: str) -> None:
        if self.get(key) != value:
            self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: tuple[int, int, int]) -> None:
        self.version += 1
        super().__delitem__(key)

    def __ior__(self, other: Any) -> SpineMap:  # type: ignore[override,misc]
        self.update(other)
        return self

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.version += 1
        super().update(*args, **kwargs)

    def setdefault(self, key: tuple[int, int, int], default: str) -> str:  # type: ignore[override]
        if key not in self:
            self.version += 1
        return super().setdefault(key, default)

    def pop(self, *args: Any) -> Any:
        self.version += 1
        return super().pop(*args)

    def popitem(self) -> tuple[tuple[int, int, int], str]:
        self.version += 1
        return super().popitem()

    def clear(self) -> None:
        self.version += 1
        super().clear()
