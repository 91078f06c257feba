"""Drill-downs: a host, a pair (one direction), a link, a job.

Each screen has a live part, redrawn every second from the app's last ``/v1/live`` answer,
and a history part read from the store's views in a thread worker (never on the UI
thread) when the screen opens and every 30 s after (history is per minute). No store, an
empty store or a store being rewritten: the screen says so in one line and keeps going.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import duckdb
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Static

from analytics.detect import attribution
from analytics.store.catalog import connect_views
from tui import history
from tui.data import Clocks, Tile
from tui.history import Series
from tui.widgets import GLYPH, STYLE, Chart, fill, us

if TYPE_CHECKING:
    from tui.app import ClockmeshApp

HISTORY_EVERY_S = 30.0


def _num(x: Any, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _worst_loss(series: list[Series]) -> str:
    loss = next((s for s in series if s.label.startswith("loss")), None)
    if loss is None or not loss.y:
        return ""
    worst = max(range(len(loss.y)), key=lambda i: loss.y[i])
    if loss.y[worst] <= 0:
        return "no loss in any minute of the window"
    return f"worst minute's loss {loss.y[worst]:.2f} % ({-loss.x[worst]:.0f} min ago)"


class DrillScreen(Screen[None]):
    """Head (live) · history note · chart · table(s). Subclasses say what goes in each."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "reload", "Reload history"),
    ]
    TABLES: ClassVar[tuple[tuple[str, tuple[tuple[str, int], ...]], ...]] = ()

    @property
    def clockmesh(self) -> ClockmeshApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="drill-head")
        yield Label("", id="hist-label")
        yield Chart(id="chart")
        for table_id, _ in self.TABLES:
            yield DataTable(id=table_id, cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        for table_id, columns in self.TABLES:
            table = self.query_one(f"#{table_id}", DataTable)
            for label, width in columns:
                table.add_column(label, width=width)
        self.render_now()
        self.action_reload()
        self.set_interval(1.0, self.render_now)
        self.set_interval(HISTORY_EVERY_S, self.action_reload)

    def render_now(self) -> None:
        """The live part, from the app's last answer."""

    def head(self, text: Text) -> None:
        if self.clockmesh.stale_since is not None:
            text.append("\nSTALE: the daemon is not answering; showing the last picture",
                        style="bold red")  # fmt: skip
        self.query_one("#drill-head", Static).update(text)

    def read_history(self, con: duckdb.DuckDBPyConnection, now_s: float) -> Any:
        """The history, read from the store (in the worker thread)."""
        raise NotImplementedError

    def show_history(self, result: Any) -> str:
        """Show the history (UI thread); returns the note above the chart."""
        raise NotImplementedError

    _asked = 0  # history requests so far: an answer to an older one is dropped

    def action_reload(self) -> None:
        self._asked += 1
        self._load(self.clockmesh.store, self.clockmesh.now(), self._asked)

    @work(thread=True, exclusive=True, group="history")
    def _load(self, store: Path | None, now_s: float, asked: int) -> None:
        result: Any = None
        if store is None:
            note = "history: no store given (--store)"
        else:
            try:
                con = connect_views(store)
                try:
                    result = self.read_history(con, now_s)
                finally:
                    con.close()
                note = ""
            except Exception as exc:  # a store being written or absent: say so, keep going
                note = f"history unavailable: {str(exc).splitlines()[0][:160]}"
        self.app.call_from_thread(self._loaded, result, note, asked)

    def _loaded(self, result: Any, note: str, asked: int) -> None:
        if asked != self._asked:  # e.g. the pair turned round while this was read
            return
        if result is not None:
            note = self.show_history(result) or note
        self.query_one("#hist-label", Label).update(note)


def _blame(tile: Tile, live: dict[str, Any]) -> str:
    """Whose fault, in words: the anomaly naming this host's own link, or those explaining
    its loss or delay; and its loss in both directions when the daemon gave it."""
    me: dict[str, Any] = next((h for h in live.get("hosts", []) if h.get("host") == tile.host), {})
    summaries = {a.get("anomaly_id"): a.get("summary", "")
                 for a in (live.get("anomalies") or {}).get("open", [])}  # fmt: skip
    out = ""
    if "loss_sent" in me:
        out += (f"  loss: {me['loss_sent']:.2%} of what it sent, "
                f"{me['loss_received']:.2%} of what was sent to it")  # fmt: skip
    ids = tile.culprit_of or tile.affected_by
    if ids:
        what = "the culprit of" if tile.culprit_of else "affected by"
        out += f"\n{what} " + "; ".join(f"{i}: {summaries.get(i, '')}".rstrip(": ") for i in ids)
    return out


class HostScreen(DrillScreen):
    """One host: its pairs now (raw and corrected OWD, loss; enter: the pair), its clock,
    its one-way delay over the last hour, its NIC and RDMA counters."""

    TABLES = (
        ("peers", (("direction", 9), ("peer", 20), ("sent", 6), ("loss", 7),
                   ("raw p50 µs", 12), ("raw p99 µs", 12), ("corrected p50 µs", 16),
                   ("explained by", 19))),
        ("counters", (("device", 10), ("counter", 28), ("value", 16), ("Δ 10 min", 10),
                      ("sampled", 8))),
    )  # fmt: skip

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def render_now(self) -> None:
        app = self.clockmesh
        live = app.snapshot or {}
        clock = {h["host"]: h for h in (live.get("clock") or {}).get("hosts", [])}
        me = clock.get(self.host, {})
        tile = next((t for t in app.fleet.tiles if t.host == self.host), None)
        text = Text(f"{self.host}", style="bold")
        if tile is not None:
            text.append(f"  rack {tile.rack}  ")
            text.append(f"{GLYPH[tile.state]} {tile.state}", style=STYLE[tile.state])
            text.append(_blame(tile, live))
        text.append(
            f"\nclock: offset {_num(me.get('offset_ns'), ',.0f')} ns "
            f"± {_num(me.get('uncertainty_ns'), ',.0f')} ns, "
            f"drift {_num(me.get('drift_ppm'), '.2f')} ppm, {me.get('status', 'not solved yet')}"
            "  ·  enter on a peer: that pair's paths and history"
        )
        self.head(text)
        clocks = Clocks.of(live)
        rows = []
        seen = set()
        for p in live.get("pairs", []):
            key = f"{p['src']}>{p['dst']}"
            if self.host not in (p["src"], p["dst"]) or key in seen:
                continue
            seen.add(key)
            out = p["src"] == self.host
            raw = p.get("owd_raw_p50_us")
            rows.append((key, (
                "→ to" if out else "← from", p["dst"] if out else p["src"], str(p.get("sent", 0)),
                f"{p.get('loss', 0):.2%}", us(raw), us(p.get("owd_raw_p99_us")),
                us(clocks.corrected(raw, p["src"], p["dst"])), ", ".join(p.get("explained_by") or []),
            )))  # fmt: skip
        fill(self.query_one("#peers", DataTable), rows)

    def read_history(self, con: duckdb.DuckDBPyConnection, now_s: float) -> Any:
        return (history.host_delay(con, self.host, now_s),
                history.host_counters(con, self.host, now_s))  # fmt: skip

    def show_history(self, result: Any) -> str:
        series, counters = result
        cor, loss = series
        self.query_one(Chart).show(f"{self.host}: corrected one-way delay p50 per minute "
                                   "(worst pair) and loss", [cor], [loss], "µs", "loss %")  # fmt: skip
        fill(self.query_one("#counters", DataTable), [
            (f"{c.device}/{c.name}", (c.device, c.name, str(c.value),
                                      f"{c.delta:+d}" if c.delta else "0", f"{c.age_s:.0f} s ago"))
            for c in counters
        ])  # fmt: skip
        if not cor.x and not loss.x:
            return "history: no one-way delay for this host in the last hour yet"
        return _worst_loss(series) + ("" if counters else "  ·  no counters in the last 10 min")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "peers" or event.row_key.value is None:
            return
        src, dst = event.row_key.value.split(">", 1)
        self.app.push_screen(PairScreen(src, dst))


class PairScreen(DrillScreen):
    """One direction of a pair: live loss and delay, delay over the last hour (corrected
    and raw), and the spread across its ECMP paths (one row per source port) with the
    fabric link each crossed at its last trace. ``x`` turns to the other direction."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("x", "swap", "Other direction")]
    TABLES = (
        ("paths", (("source port", 11), ("via", 26), ("sent", 8), ("loss", 7),
                   ("corrected p50 µs", 17), ("raw p50 µs", 12), ("raw worst p99 µs", 16))),
    )  # fmt: skip

    def __init__(self, src: str, dst: str) -> None:
        super().__init__()
        self.src, self.dst = src, dst

    def action_swap(self) -> None:
        self.src, self.dst = self.dst, self.src
        self.query_one("#paths", DataTable).clear()
        self.render_now()
        self.action_reload()

    def render_now(self) -> None:
        live = self.clockmesh.snapshot or {}
        clocks = Clocks.of(live)
        text = Text(f"{self.src} → {self.dst}", style="bold")
        text.append("  (x: the other direction)", style="dim")
        p = next((p for p in live.get("pairs", [])
                  if p["src"] == self.src and p["dst"] == self.dst), None)  # fmt: skip
        if p is None:
            text.append("\nnow: no probes of this direction in the live window")
        else:
            raw = p.get("owd_raw_p50_us")
            loss = float(p.get("loss") or 0.0)
            text.append(f"\nnow: {p.get('sent', 0)} sent, ")
            red = loss > self.clockmesh.thresholds.red_loss  # the tiles' line
            text.append(f"loss {loss:.2%}", style="bold red" if red else "")
            text.append(f", corrected p50 {us(clocks.corrected(raw, self.src, self.dst))} µs, "
                        f"raw p50 {us(raw)} µs, raw p99 {us(p.get('owd_raw_p99_us'))} µs")  # fmt: skip
            queue = p.get("queue_us")
            if isinstance(queue, int | float):  # the detector judged a route of it slow
                text.append(f"\nqueued {attribution.queue_text(queue)} beyond its healthy delay",
                            style="bold yellow")  # fmt: skip
        self.head(text)

    def read_history(self, con: duckdb.DuckDBPyConnection, now_s: float) -> Any:
        hops = fabric_hops(self.clockmesh.topology_doc)
        return (history.pair_delay(con, self.src, self.dst, now_s),
                history.pair_paths(con, self.src, self.dst, now_s, hops))  # fmt: skip

    def show_history(self, result: Any) -> str:
        series, paths = result
        cor, p50, p99, _ = series
        self.query_one(Chart).show(f"{self.src} → {self.dst}: one-way delay per minute",
                                   [cor], [p50, p99], "corrected µs", "raw µs (with clock offsets)")  # fmt: skip
        fill(self.query_one("#paths", DataTable), [
            (str(r.sport), (str(r.sport), r.via or "not traced", str(r.sent), f"{r.loss:.2%}",
                            us(r.corrected_p50_us), us(r.p50_us), us(r.p99_us)))
            for r in paths
        ])  # fmt: skip
        spread = [r.p50_us for r in paths if r.p50_us is not None]  # raw: one pair, one offset
        note = _worst_loss(series)
        if len(spread) > 1:
            note += f"  ·  {len(spread)} paths, p50 spread {max(spread) - min(spread):.1f} µs"
        elif not paths:
            note += "  ·  no per-path minutes in the last 10 min"
        return note.strip(" ·") or "history: no minutes for this pair in the last hour yet"


class LinkScreen(DrillScreen):
    """One link: the anomalies that named it; a host's access link: the host's delay, its
    interface counters and outages; a leaf–spine link: the delay of the paths crossing it
    against the others', and how many 5-tuples cross it now."""

    TABLES = (
        ("link-anomalies", (("anomaly", 20), ("class", 13), ("opened", 9), ("closed", 9),
                            ("outages s", 18), ("summary", 80))),
        ("link-counters", (("device", 10), ("counter", 28), ("value", 16), ("Δ 1 h", 10),
                           ("sampled", 8))),
    )  # fmt: skip

    def __init__(self, link: str) -> None:
        super().__init__()
        # Tomography names twins it cannot tell apart ("leaf1-spine2 or leaf2-spine2").
        self.candidates = [x.strip() for x in link.split(" or ") if x.strip()]
        self.link = self.candidates[0] if self.candidates else link

    def render_now(self) -> None:
        text = Text(f"link {self.link}", style="bold")
        if len(self.candidates) > 1:
            text.append(f"  (or {', '.join(self.candidates[1:])}: the traces cannot tell "
                        "them apart)")  # fmt: skip
        live = self.clockmesh.fleet.anomalies
        mine = [a for a in live if self.link in str(a.get("link", "")).split(" or ")]
        for a in mine:
            text.append(f"\nopen: {a.get('anomaly_id')} {a.get('kind')}: {a.get('summary', '')}",
                        style="bold red")  # fmt: skip
        if not mine:
            text.append("\nno open anomaly names this link", style="green")
        self.head(text)

    def read_history(self, con: duckdb.DuckDBPyConnection, now_s: float) -> Any:
        view = history.link_view(con, self.link, self.clockmesh.topology_doc, now_s)
        host = history.host_delay(con, view.host, now_s) if view.host else None
        return view, host

    def show_history(self, result: Any) -> str:
        view, host = result
        chart = self.query_one(Chart)
        counters = self.query_one("#link-counters", DataTable)
        counters.display = view.kind != "fabric"
        if host is not None:
            cor, loss = host
            chart.show(f"{view.host} behind {self.link}: corrected one-way delay p50 per minute "
                       "(worst pair) and loss", [cor], [loss], "µs", "loss %")  # fmt: skip
        else:
            chart.show(f"{self.link}: corrected one-way delay of the ECMP paths crossing it "
                       "vs the others", view.delay)  # fmt: skip
        now_s = self.clockmesh.now()

        def ago(us_: int | None) -> str:
            return "open" if us_ is None else f"{max(0.0, now_s - us_ / 1e6) / 60:.0f} min ago"

        fill(self.query_one("#link-anomalies", DataTable), [
            (str(aid), (str(aid), kind, ago(opened), ago(closed),
                        ", ".join(f"{o:.1f}" for o in outages[-5:] if o is not None) or "—",
                        summary or ""))
            for aid, kind, opened, closed, summary, outages in view.anomalies
        ])  # fmt: skip
        fill(counters, [
            (f"{c.device}/{c.name}", (c.device, c.name, str(c.value),
                                      f"{c.delta:+d}" if c.delta else "0", f"{c.age_s:.0f} s ago"))
            for c in view.counters
        ])  # fmt: skip
        parts = [f"{view.kind or 'not in the topology'} link {view.ends}".strip()]
        if view.kind == "fabric":
            parts.append(f"{view.paths_now} traced 5-tuple(s) crossed it in the last minute")
        if view.host:
            downs = [f"{o:.1f} s" if o is not None else "< 1 sample" for _, o, _ in view.flaps]
            parts.append(f"{len(view.flaps)} outage(s) in the last hour"
                         + (f", the latest: {', '.join(downs[:6])}" if downs else ""))  # fmt: skip
        return "  ·  ".join(parts)


class JobScreen(DrillScreen):
    """One job: each host's RDMA device, GID index, its type (RoCE v1 in red) and how the
    index was found; its flows' in-band delay against the probes' between the same hosts."""

    TABLES = (
        ("job-hosts", (("host", 20), ("device", 10), ("GID index", 9), ("GID type", 12),
                       ("index from", 48))),
        ("job-flows", (("src", 20), ("dst", 20), ("messages", 9), ("in-band p50 µs", 14),
                       ("probes p50 µs", 13), ("in-band − probes µs", 19))),
    )  # fmt: skip

    def __init__(self, job: str) -> None:
        super().__init__()
        self.job = job
        self.stored_hosts: list[tuple[Any, ...]] = []

    def _live_job(self) -> dict[str, Any] | None:
        jobs = (self.clockmesh.snapshot or {}).get("jobs") or []
        return next((j for j in jobs if j.get("job_id") == self.job), None)

    def render_now(self) -> None:
        job = self._live_job()
        text = Text(f"job {self.job}", style="bold")
        if job is None:
            text.append("  not running now (the collectors report no process of it)", style="dim")
            rows: list[tuple[str, tuple[Any, ...]]] = [(str(h[0]), (str(h[0]), str(h[1]), str(h[2]), str(h[3] or "unknown"),
                                 f"set in {h[4]} (stored)"))
                    for h in self.stored_hosts]  # fmt: skip
        else:
            v1 = job.get("roce_v1_hosts", 0)
            text.append(f"  running on {len(job['hosts'])} host(s), GID type(s): "
                        f"{', '.join(job.get('gid_types', []))}")  # fmt: skip
            if v1:
                text.append(f"\n{v1} host(s) on RoCE v1: no IP header, no RDMA traffic class",
                            style="bold red")  # fmt: skip
            rows = [(h["host"], (h["host"], h.get("device", ""), str(h.get("gid_index")),
                                 Text(str(h.get("gid_type") or "unknown"),
                                      style="bold red" if "v1" in str(h.get("gid_type")) else ""),
                                 h.get("index_source", "")))
                    for h in job["hosts"]]  # fmt: skip
        for a in self.clockmesh.fleet.anomalies:
            if a.get("job_id") == self.job or self.job in (a.get("evidence") or {}).get("jobs", []):
                text.append(f"\nopen: {a.get('anomaly_id')} {a.get('kind')}: {a.get('summary')}",
                            style="bold red")  # fmt: skip
        self.head(text)
        fill(self.query_one("#job-hosts", DataTable), rows)

    def read_history(self, con: duckdb.DuckDBPyConnection, now_s: float) -> Any:
        return history.job_view(con, self.job, now_s)

    def show_history(self, result: Any) -> str:
        view: history.JobView = result
        self.stored_hosts = view.hosts
        self.render_now()
        self.query_one(Chart).show(f"job {self.job}: its messages' one-way delay above the "
                                   "probes' between the same hosts", view.delay, minutes=30)  # fmt: skip
        fill(self.query_one("#job-flows", DataTable), [
            (f"{s}>{d}", (str(s), str(d), str(n), us(inb), us(probe), us(excess)))
            for s, d, n, inb, probe, excess in view.flows
        ])  # fmt: skip
        if not view.flows:
            return "no in-band timestamps from this job in the last 30 min (its hook reports them)"
        return f"{len(view.flows)} flow(s) in the last 30 min; the worst first"


def fabric_hops(topo: dict[str, Any] | None) -> dict[str, str]:
    """Spine address on each leaf–spine link → the link's name (what hop 2 answers from)."""
    return {
        str(lk["b"].get("address", "")): str(lk["name"])
        for lk in (topo or {}).get("links", [])
        if lk.get("kind") == "fabric"
    }


def for_anomaly(anomaly: dict[str, Any]) -> Screen[None] | None:
    """The drill-down of an anomaly: its job, else its link."""
    if anomaly.get("job_id") and anomaly.get("kind") == "roce_v1_job":
        return JobScreen(str(anomaly["job_id"]))
    if anomaly.get("link"):
        return LinkScreen(str(anomaly["link"]))
    if anomaly.get("job_id"):
        return JobScreen(str(anomaly["job_id"]))
    return None
