"""The import graph of the five packages, read from the source (ast, no imports run): no
circle between modules, and every arrow between parts points down the layers below.

docs/architecture.md ("Packages and the one-way import rule") explains the layers. A lazy
import inside a function is an arrow like any other (it only moves the cost, not the
dependency); an import under ``if TYPE_CHECKING:`` is not (it never runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("clockmesh", "collector", "analytics", "tui", "lab")

# A part is a top-level package, or one subpackage/module of ``analytics`` (whose ``cli``
# modules, the commands, form a part of their own). A part may import the parts of lower
# layers only (and itself). ``clockmesh`` names its subcommands
# as strings (importlib), so it has no static arrows at all.
LAYERS: list[tuple[str, ...]] = [
    ("collector",),
    # leaves of the ops box: no other analytics part
    (
        "analytics",
        "analytics.thread_priority",
        "analytics.topology",
        "analytics.cli_options",
        "analytics.sim",
    ),
    ("analytics.store",),  # layout, writer, compactor, catalog, export
    ("analytics.clock",),  # the solver; writes through the store
    # the remediations/audits tables (records) are read by the detector to close anomalies
    ("analytics.remediate",),
    ("analytics.detect",),
    # the commands and the daemon on top
    ("analytics.ingest", "analytics.audit", "analytics.report"),
    # every command: the `cli` module of each part, ingest's live_cli and the loose sql_cli
    ("analytics commands",),
    ("tui",),
]
# Parts that stand beside the stack rather than on it: they may import only these.
SIDE: dict[str, tuple[str, ...]] = {
    "lab": ("collector",),  # the lab builds fabrics and runs collectors; never the ops box
    "clockmesh": (),
}
# Known arrows back up, each with the reason it is still here (none today: the last one,
# the hot window's arrow from the store up to the clock solver, went when the hot window
# moved to analytics/ingest/, issue 27).
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, *([node.module] if node.module else [])])
            for a in node.names:  # `from pkg import module` depends on the module only
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES else _resolve(base))
    return {m for m in found if m is not None and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "analytics" or len(parts) == 1:
        return parts[0]
    if parts[-1] in ("cli", "sql_cli", "live_cli"):  # analytics.remediate.cli: a command
        return "analytics commands"
    return ".".join(parts[:2])


def _rank(part: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if part in layer), None)


def test_every_part_has_a_place_in_the_layers() -> None:
    parts = {_part(m) for m in MODULES}
    unplaced = sorted(p for p in parts if _rank(p) is None and p not in SIDE)
    assert not unplaced, f"add these to LAYERS (docs/architecture.md too): {unplaced}"


def _arrows_against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for mod, deps in graph.items():
        a = _part(mod)
        for dep in deps:
            b = _part(dep)
            if a == b or (mod, dep) in EXCEPTIONS:
                continue
            if a in SIDE or b in SIDE:
                ok = a in SIDE and b in SIDE[a]
            else:
                ra, rb = _rank(a), _rank(b)
                ok = ra is not None and rb is not None and rb < ra
            if not ok:
                wrong.append(f"{mod} -> {dep}")
    return wrong


def test_no_arrow_points_back_up_the_layers() -> None:
    wrong = _arrows_against_the_layers(GRAPH)
    assert not wrong, "imports against the layers (docs/architecture.md):\n" + "\n".join(wrong)


def test_the_known_exceptions_are_still_real() -> None:
    """An exception nobody needs any more is removed, so it cannot hide a new arrow."""
    stale = [f"{a} -> {b}" for a, b in EXCEPTIONS if b not in GRAPH.get(a, set())]
    assert not stale, f"remove these from EXCEPTIONS: {stale}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, set())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles() -> None:
    assert not _cycles(GRAPH), f"import circles: {_cycles(GRAPH)}"


def test_the_checker_sees_a_circle_and_an_arrow_up() -> None:
    """The checks above can fail: a made-up circle is found, and so is a real one today's
    code would have if store_writer imported the compactor's class again."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    fake = dict(GRAPH)
    fake["analytics.store.compactor"] = fake["analytics.store.compactor"] | {
        "analytics.store.store_writer"
    }
    assert ["analytics.store.compactor", "analytics.store.store_writer"] in _cycles(fake)
    assert _rank("analytics.store") < _rank("analytics.detect")  # type: ignore[operator]
    # the hot window's imports of the clock solver point down from ingest; had it stayed in
    # the store, they would point up
    assert "analytics.clock.probe_samples" in GRAPH["analytics.ingest.hot_window"]
    assert not _arrows_against_the_layers(
        {"analytics.ingest.hot_window": GRAPH["analytics.ingest.hot_window"]}
    )
    up = {"analytics.store.hot_window": GRAPH["analytics.ingest.hot_window"]}
    assert "analytics.store.hot_window -> analytics.clock.probe_samples" in (
        _arrows_against_the_layers(up)
    )
