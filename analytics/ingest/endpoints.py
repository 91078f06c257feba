"""Several ops boxes for one reader: use the first that answers, and say which.

A pair of ops boxes (docs/deploy.md, "Two ops boxes") each hold the whole picture, so a
reader (``clockmesh live``, ``clockmesh tui``, ``clockmesh remediate``) given both reads
from the first that answers and names it, and the ones that do not. URLs and stores are
given as a comma list (``--url http://a:8470,http://b:8470``, ``--store /a,/b``) or a
repeated option; the order is the preference: the first box is read whenever it answers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import click

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

RETRY_DOWN_S = 10.0  # a box that did not answer is tried again after this long
STORE_TIMEOUT_S = 3.0  # a store (a network mount) that takes longer to list is down


def split(values: str | Path | Iterable[str | Path]) -> list[str]:
    """``"a,b"`` or ``["a", "b,c"]`` -> ``["a", "b", "c"]``: blanks dropped, each once."""
    items = [values] if isinstance(values, str | Path) else list(values)
    out: list[str] = []
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    return out


class FirstAnswering(Generic[T]):
    """``fetch(target)`` on each target in order; the first answer wins.

    After a call, ``used`` is the target that answered and ``down`` maps each target
    that did not (tried this time or within ``retry_down_s``) to its one-line error.
    A target that failed is skipped for ``retry_down_s`` while a later one answers, so
    a box that times out does not slow every read; the first target is always preferred
    once it answers again. All down: the error names each.
    """

    def __init__(
        self,
        targets: Sequence[str],
        fetch: Callable[[str], T],
        *,
        retry_down_s: float = RETRY_DOWN_S,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not targets:
            raise ValueError("no URL or store given")
        self.targets = list(targets)
        self.fetch = fetch
        self.retry_down_s = retry_down_s
        self.on_change = on_change  # called with note() whenever it changes
        self.clock = clock
        self.used = ""
        self.down: dict[str, str] = {}
        self._down_at: dict[str, float] = {}
        self._last_error: dict[str, str] = {}
        self._note = ""
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            now = self.clock()
            errors: dict[str, str] = {}
            # Targets down within retry_down_s go last (tried only if nothing else answers).
            recent = [
                t for t in self.targets if now - self._down_at.get(t, -1e18) < self.retry_down_s
            ]
            order = [t for t in self.targets if t not in recent] + recent
            for target in order:
                try:
                    answer = self.fetch(target)
                except Exception as exc:  # any failure of a box: try the next
                    errors[target] = self._last_error[target] = _one_line(exc)
                    self._down_at[target] = now
                    continue
                self._down_at.pop(target, None)
                self.used = target
                skipped = [t for t in recent if t not in errors and t != target]
                self.down = errors | {t: self._last_error[t] for t in skipped}
                self._changed()
                return answer
            self.used = ""
            self.down = errors
            self._changed()
            raise ConnectionError(
                "; ".join(f"{t}: {e}" for t, e in errors.items()) + " (none answers)"
            )

    def note(self) -> str:
        """``"http://b:8470 (http://a:8470 is down: refused)"``; the target alone when
        every other answers or there is only one; "" before the first call."""
        if not self.used:
            return ""
        if not self.down:
            return self.used
        downs = "; ".join(f"{t} is down: {e}" for t, e in self.down.items())
        return f"{self.used} ({downs})"

    def _changed(self) -> None:
        note = self.note()
        if note != self._note:
            self._note = note
            if self.on_change is not None and len(self.targets) > 1:
                self.on_change(note)


def _one_line(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    text = str(reason).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


def store_answers(store: str) -> Path:
    """``store`` as a Path when it is a directory this machine can list within
    ``STORE_TIMEOUT_S`` (a lost box's network mount hangs or fails); raises otherwise."""
    path = Path(store)
    box: dict[str, object] = {}

    def probe() -> None:
        try:
            box["ok"] = (path / "catalog.duckdb").exists() or any(
                p.is_dir() for p in path.iterdir()
            )
        except OSError as exc:
            box["error"] = exc

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    th.join(STORE_TIMEOUT_S)
    if th.is_alive():
        raise TimeoutError(f"no answer within {STORE_TIMEOUT_S:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    if not box.get("ok"):
        raise FileNotFoundError("not a clockmesh store (no catalog.duckdb, no tables)")
    return path


def first_store(stores: str | Path | Iterable[str | Path]) -> tuple[Path, str]:
    """The first store of a comma list that answers, and the note naming it (and the
    stores that do not); one store: it as given, no check (as before), note ""."""
    names = split(stores)
    if len(names) <= 1:
        return Path(names[0] if names else str(stores)), ""
    pick = FirstAnswering(names, store_answers)
    path = pick()
    return path, pick.note()


def tui_sources(
    url: str, store: Path, live_source: Callable[[str], Callable[[], T]]
) -> tuple[Callable[[], T], Path, Callable[[Any], None]]:
    """``clockmesh tui``'s live source and store from comma lists, and ``say(app)``, which
    shows in the app's subtitle the box read from and the boxes that are down (updated
    from the poll worker thread when that changes). One URL and one store: the plain
    source and store, an empty subtitle (as before)."""
    urls = split(url)
    notes = {"live": "", "store": ""}
    apps: list[Any] = []

    def show() -> None:
        text = " · ".join(f"{k}: {v}" for k, v in notes.items() if v)
        for app in apps:
            app.sub_title = text

    def live_changed(note: str) -> None:
        notes["live"] = note
        for app in apps:
            app.call_from_thread(show)  # from the poll worker thread

    source: Callable[[], T]
    if len(urls) > 1:
        sources = {u: live_source(u) for u in urls}
        source = FirstAnswering(urls, lambda u: sources[u](), on_change=live_changed)
    else:
        source = live_source(url)
    try:
        path, notes["store"] = first_store(store)
    except ConnectionError as exc:  # no store answers: the first, shown as missing
        path, notes["store"] = Path(split(store)[0]), f"none answers ({exc})"

    def say(app: Any) -> None:
        apps.append(app)
        show()

    return source, path, say


def store_choice(option: Callable[[F], F]) -> Callable[[F], F]:
    """``option`` (the ``--store`` click option) for a command that reads the first
    store of a comma list that answers: the command gets that store as ``store`` and
    stderr says which one (and which do not answer); none answers: a one-line error."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if "store" in kwargs:
                try:
                    kwargs["store"], note = first_store(kwargs["store"])
                except ConnectionError as exc:
                    raise click.ClickException(f"--store: {exc}") from None
                if note:
                    click.echo(f"store: {note}", err=True)
            return fn(*args, **kwargs)

        return option(cast(F, wrapper))

    return decorate
