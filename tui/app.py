"""``clockmesh tui``: the fleet at a glance, drill-down, anomalies, audit, remediation.

Live state comes from the ingest daemon's ``/v1/live`` over HTTP, fetched once a second in
a thread worker (never on the UI thread); history from the store's read-only views. When
the daemon cannot be reached the last picture stays, under a red "STALE since …" banner,
and the TUI keeps retrying by itself. Remediation runs the same code as ``clockmesh
remediate``: check-mode preview → explicit confirmation → real run, streamed, cancellable.

The remediation dialogs are :mod:`tui.remediation`.

Over 500 lines: the app and its four panes (fleet, anomalies, jobs, audit), one screen.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import (
    DataTable,
    Footer,
    Header,
    Input,
    Label,
    Static,
    TabbedContent,
    TabPane,
    Tree,
)

from analytics.detect import attribution
from analytics.detect.anomalies import quiet_note
from tui.data import (
    AFFECTED,
    AMBER,
    CULPRIT,
    GREEN,
    GREY,
    RED,
    Fleet,
    LiveSource,
    Thresholds,
    fleet,
    matches,
)
from tui.drill import HostScreen, JobScreen, for_anomaly
from tui.remediation import RemediationScreen
from tui.widgets import GLYPH, STYLE, RowList, fill, us

HOST_COLUMNS = [("rack", 10), ("host", 20), ("state", 8), ("worst OWD µs", 12), ("loss", 7),
                ("worst peer", 20), ("because of", 20), ("clock σ ns", 10),
                ("last batch", 10)]  # fmt: skip
ORDER = {CULPRIT: 0, RED: 1, AMBER: 1, GREY: 1, AFFECTED: 2, GREEN: 3}  # the table's order


class FleetPane(Vertical):
    """NICs grouped by rack (an ECMP group), coloured by worst corrected OWD and loss."""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: name, address, rack, tag or state "
                    "(ok/slow/loss/silent/culprit/affected)", id="filter")  # fmt: skip
        with VerticalScroll(id="tiles-box"):
            yield Static(id="tiles")
        yield RowList(HOST_COLUMNS, id="hosts")

    _tiles_key: tuple[Any, ...] = ()

    def _words(self) -> dict[str, str]:
        app = self.app
        assert isinstance(app, ClockmeshApp)
        return app.search_words

    def show(self, f: Fleet, query: str) -> None:
        # The tile map changes when a NIC changes state, not every second: rebuilding it
        # (and the layout it triggers) only then keeps a refresh within its budget.
        key = (query, tuple((t.rack, t.host, t.state) for t in f.tiles))
        if key != self._tiles_key:
            self._tiles_key = key
            self._show_tiles(f, query)
        self._show_table(f, query)

    def _show_tiles(self, f: Fleet, query: str) -> None:
        text = Text()
        for rack in sorted(f.racks):
            tiles = [t for t in f.racks[rack] if matches(t, query, self._words())]
            if not tiles:
                continue
            ok = sum(1 for t in tiles if t.state == GREEN)
            text.append(f"{rack:<12}", style="bold")
            text.append(f"{ok:>4}/{len(tiles):<4} ")
            for t in tiles:
                text.append(f"{GLYPH[t.state]} {t.host}  ", style=STYLE[t.state])
            text.append("\n")
        text.rstrip()
        self.query_one("#tiles", Static).update(text or Text("no host matches the filter"))

    def _show_table(self, f: Fleet, query: str) -> None:
        rows = [t for t in f.tiles if matches(t, query, self._words())] if query else f.tiles[:]
        # the culprits first, then what fails unexplained, then the affected
        rows.sort(key=lambda t: (ORDER[t.state], t.rack, t.host))
        self.query_one("#hosts", RowList).set_rows([
            (t.host, (t.rack, t.host, (t.state, STYLE[t.state]), us(t.worst_owd_us),
                      f"{t.worst_loss:.2%}", t.worst_peer, t.because,
                      "—" if t.uncertainty_ns is None else f"{t.uncertainty_ns:.0f}",
                      f"{t.age_s:.0f} s"))
            for t in rows
        ])  # fmt: skip


class AnomaliesPane(Vertical):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort", "Sort by column"),
        Binding("enter", "remediate", "Remediate", show=True),
        Binding("d", "drill", "Details: its link or job"),
    ]

    def compose(self) -> ComposeResult:
        yield Label("open anomalies — enter: remediate (preview first) · d: its link or job · "
                    "s: sort by column", id="anom-help")  # fmt: skip
        yield DataTable(id="anomaly-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        for label, width in (("class", 13), ("where", 24), ("since", 7), ("outages s", 16),
                             ("score", 5), ("probability", 11), ("remediation", 30),
                             ("summary", 80)):  # fmt: skip
            t.add_column(label, width=width)
        self.sort_column = 0

    def show(self, f: Fleet, now_s: float) -> None:
        app = self.app
        assert isinstance(app, ClockmeshApp)
        rows = []
        for a in f.anomalies:
            ev = a.get("evidence") or {}
            outages = ev.get("outages_s") or []
            since = max(0.0, now_s - a.get("opened_ns", 0) / 1e9)
            prob = (ev.get("model") or {}).get("probability")
            quiet = quiet_note(a, f.clear_s)
            rows.append((str(a.get("anomaly_id")), (
                a.get("kind", ""), attribution.place_name(a), f"{since:.0f} s",
                ", ".join(f"{o:.1f}" if o is not None else "?" for o in outages[-5:]) or "—",
                f"{a.get('score', 0):.2f}", "—" if prob is None else f"{prob:.2f}",
                app.recommended(a), f"{quiet} {a.get('summary', '')}" if quiet else a.get("summary", ""),
            )))  # fmt: skip
        fill(self.query_one(DataTable), rows)

    def action_sort(self) -> None:
        table = self.query_one(DataTable)
        self.sort_column = (self.sort_column + 1) % len(table.columns)
        key = list(table.columns)[self.sort_column]
        table.sort(key)
        self.app.notify(f"sorted by {table.columns[key].label}")

    def _selected(self) -> dict[str, Any] | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        app = self.app
        assert isinstance(app, ClockmeshApp)
        return next((a for a in app.fleet.anomalies if a.get("anomaly_id") == key), None)

    def action_remediate(self) -> None:
        anomaly = self._selected()
        if anomaly is not None:
            self.app.push_screen(RemediationScreen(anomaly))

    def action_drill(self) -> None:
        anomaly = self._selected()
        screen = None if anomaly is None else for_anomaly(anomaly)
        if screen is not None:
            self.app.push_screen(screen)


class JobsPane(Vertical):
    """The jobs running now (``/v1/live`` ``jobs``): hosts, GID types, RoCE v1 hosts, the
    anomalies that name them; enter: the job's drill-down."""

    def compose(self) -> ComposeResult:
        yield Label("running jobs — enter: its hosts' GID types and its flows' delay",
                    id="jobs-help")  # fmt: skip
        yield DataTable(id="jobs-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        for label, width in (("job", 24), ("hosts", 5), ("GID type(s)", 24), ("RoCE v1 hosts", 13),
                             ("open anomalies", 40)):  # fmt: skip
            t.add_column(label, width=width)

    def show(self, jobs: list[dict[str, Any]], f: Fleet) -> None:
        named: dict[str, list[str]] = {}
        for a in f.anomalies:
            ev = a.get("evidence") or {}
            for job in {a.get("job_id") or "", *ev.get("jobs", [])} - {""}:
                named.setdefault(str(job), []).append(str(a.get("kind")))
        rows = []
        for j in sorted(jobs, key=lambda j: (-j.get("roce_v1_hosts", 0), j["job_id"])):
            v1 = int(j.get("roce_v1_hosts", 0))
            rows.append((j["job_id"], (
                j["job_id"], str(len(j.get("hosts", []))), ", ".join(j.get("gid_types", [])),
                Text(str(v1), style="bold red") if v1 else "0",
                ", ".join(sorted(named.get(j["job_id"], []))) or "—",
            )))  # fmt: skip
        fill(self.query_one(DataTable), rows)


class AuditPane(Vertical):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("R", "reload", "Reload audit")]

    def compose(self) -> ComposeResult:
        yield Label("", id="audit-summary")
        yield Tree("fleet audit", id="audit-tree")

    def on_mount(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        app = self.app
        assert isinstance(app, ClockmeshApp)
        tree = self.query_one(Tree)
        tree.clear()
        label = self.query_one("#audit-summary", Label)
        if app.store is None:
            label.update("no store given (--store): the audit is read from the ops box's store")
            return
        import click

        from analytics.audit.cli import STATUSES, latest

        try:
            run_id, rows = latest(app.store)
        except click.ClickException as exc:
            label.update(exc.message)
            return
        counts = {s: sum(1 for r in rows if r[3] == s) for s in STATUSES}
        label.update(f"{run_id}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        tree.root.set_label(f"fleet audit {run_id}")
        cats: dict[str, Any] = {}
        checks: dict[tuple[str, str], Any] = {}
        style = {"pass": "green", "fail": "bold red", "skipped": "dim"}
        for host, category, check, status, reason, value in rows:
            if category not in cats:
                n = {s: sum(1 for r in rows if r[1] == category and r[3] == s) for s in STATUSES}
                cats[category] = tree.root.add(
                    f"{category} ({n['pass']} pass, {n['fail']} fail, {n['skipped']} skipped)",
                    expand=True,
                )
            if (category, check) not in checks:
                bad = any(r[1] == category and r[2] == check and r[3] == "fail" for r in rows)
                checks[(category, check)] = cats[category].add(
                    Text(check, style="bold red" if bad else ""), expand=bad
                )
            checks[(category, check)].add_leaf(
                Text(
                    f"{host}: {status} — {reason}" + (f" [{value}]" if value else ""),
                    style=style.get(status, ""),
                )
            )
        tree.root.expand()


class ClockmeshApp(App[None]):
    TITLE = "clockmesh"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "show_tab('fleet')", "Fleet"),
        Binding("a", "show_tab('anomalies')", "Anomalies"),
        Binding("j", "show_tab('jobs')", "Jobs"),
        Binding("u", "show_tab('audit')", "Audit"),
        Binding("slash", "focus_filter", "Filter"),
        Binding("question_mark", "toggle_help", "Help"),
        Binding("t", "toggle_theme", "Light/dark"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: Callable[[], dict[str, Any]],
        racks: dict[str, str] | None = None,
        store: Path | None = None,
        inventory: Path | None = None,
        topology: Path | None = None,
        refresh_s: float = 1.0,
        thresholds: Thresholds | None = None,
        now: Callable[[], float] = time.time,
        search_words: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.racks = racks or {}
        self.search_words = search_words or {}  # host -> addresses and tags, for the filter
        self.topology_doc: dict[str, Any] | None = None
        self._recommended: dict[tuple[str, str, str], str] = {}
        if topology is not None:
            from analytics.topology import TopologyError, read_topology

            with contextlib.suppress(TopologyError):  # `clockmesh tui` checked it already
                self.topology_doc = read_topology(topology)
        self.store = store
        self.inventory = inventory
        self.topology = topology
        self.refresh_s = refresh_s
        self.thresholds = thresholds or Thresholds()
        self.now = now
        self.snapshot: dict[str, Any] | None = None
        self.fleet = Fleet()
        self.fetched_at: float | None = None
        self.stale_since: float | None = None
        self.error = ""
        self.query_text = ""
        self._gc_frozen = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="banner")
        yield Static("connecting to the ingest daemon…", id="summary")
        with TabbedContent(initial="fleet"):
            with TabPane("Fleet", id="fleet"):
                yield FleetPane()
            with TabPane("Anomalies", id="anomalies"):
                yield AnomaliesPane()
            with TabPane("Jobs", id="jobs"):
                yield JobsPane()
            with TabPane("Audit", id="audit"):
                yield AuditPane()
        yield Footer()

    def on_mount(self) -> None:
        # References, not queries: a pushed screen (drill-down, remediation) is on top
        # while the main screen keeps refreshing underneath.
        self.banner = self.query_one("#banner", Static)
        self.summary = self.query_one("#summary", Static)
        self.fleet_pane = self.query_one(FleetPane)
        self.anomalies_pane = self.query_one(AnomaliesPane)
        self.jobs_pane = self.query_one(JobsPane)
        self.tabs = self.query_one(TabbedContent)
        self.banner.display = False
        self.poll()
        self.set_interval(self.refresh_s, self.poll)

    # ---- live data ---------------------------------------------------------------
    @work(thread=True, exclusive=True, group="live")
    def poll(self) -> None:
        try:
            live = self.source()
            model = fleet(live, self.racks, self.thresholds)  # here, off the UI thread
        except Exception as exc:  # daemon down, refused, bad JSON: keep the last picture
            self.call_from_thread(self.apply, None, str(exc).splitlines()[0][:160] or repr(exc))
            return
        self.call_from_thread(self.apply, live, "", model)

    def apply(self, live: dict[str, Any] | None, error: str, model: Fleet | None = None) -> None:
        """Show a new answer (``model``: its fleet model, built by the poll worker)."""
        now = self.now()
        if live is not None:
            self.snapshot, self.fetched_at, self.stale_since, self.error = live, now, None, ""
            self.fleet = model if model is not None else fleet(live, self.racks, self.thresholds)
            if not self._gc_frozen:
                # A refresh makes ~10^5 short-lived objects; a full collection over Textual's
                # own long-lived ones costs ~70 ms (every ~15 refreshes at 1,024 NICs). As
                # the ingest daemon does: freeze what exists after start, collect gen 0 less.
                self._gc_frozen = True
                gc.freeze()
                gc.set_threshold(50_000, 20, 100)
        else:
            self.error = error
            if self.stale_since is None:
                self.stale_since = now
        with contextlib.suppress(NoMatches):  # a fetch that lands while the app shuts down
            self.render_all()
        # A refresh leaves a few thousand container objects behind; left to the automatic
        # threshold they are collected ~every 14 refreshes in one 10-ms gen-0 pass in the
        # middle of a refresh. Collected here, each pass costs ~1 ms.
        gc.collect(0)

    def render_all(self) -> None:
        now = self.now()
        banner = self.banner
        if self.stale_since is not None:
            when = time.strftime("%H:%M:%S UTC", time.gmtime(self.stale_since))
            what = "showing the last picture" if self.snapshot else "no data yet"
            banner.update(f" STALE since {when} — the ingest daemon does not answer ({self.error});"
                          f" {what}, retrying every {self.refresh_s:g} s ")  # fmt: skip
            banner.display = True
        else:
            banner.display = False
        f = self.fleet
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(f.anomalies_by_kind.items())) or "none"
        sigma = "—" if f.clock_sigma_ns is None else f"{f.clock_sigma_ns:.0f} ns"
        summary = Text()
        summary.append(f" {f.healthy}/{len(f.tiles)} NICs healthy ", style="bold")
        summary.append(f"· {f.failing} failing ", style="bold red" if f.failing else "")
        if f.culprits:
            who = "; ".join(f"{t.host}: {t.because}" for t in f.culprits[:3])
            more = f" +{len(f.culprits) - 3}" if len(f.culprits) > 3 else ""
            summary.append(f"(culprit {who}{more}) ", style="bold red")
        summary.append(f"· {f.affected} affected ", style="cyan" if f.affected else "")
        summary.append(f"· open anomalies: {kinds} · jobs: {f.jobs} running")
        if f.jobs_v1:
            summary.append(f", {f.jobs_v1} on RoCE v1", style="bold red")
        summary.append(f" · clock: {f.clock_solved}/{f.clock_hosts} solved, median σ {sigma}")
        if self.fetched_at is not None:
            summary.append(f" · updated {max(0.0, now - self.fetched_at):.0f} s ago", style="dim")
        if self.snapshot is not None and not self.snapshot.get("hosts"):
            summary.append(" · no host has shipped yet", style="yellow")
        self.summary.update(summary)
        # Only the pane on screen is rendered; the other catches up when it is shown.
        if self.tabs.active == "anomalies":
            self.anomalies_pane.show(f, now)
        elif self.tabs.active == "jobs":
            self.jobs_pane.show((self.snapshot or {}).get("jobs") or [], f)
        else:
            self.fleet_pane.show(f, self.query_text)

    @on(TabbedContent.TabActivated)
    def tab_shown(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id != self.tabs.active:
            # Superseded (a key pressed before the start's own activation was handled): the
            # newer one renders; focusing this one's list would switch back to it.
            return
        with contextlib.suppress(NoMatches):
            self.render_all()
            # The keys of a tab (enter, d, s) act on its list: give it the focus, so `a`
            # then enter remediates without a click first.
            main = {"fleet": "#hosts", "anomalies": "#anomaly-table", "jobs": "#jobs-table",
                    "audit": "#audit-tree"}.get(event.pane.id or "")  # fmt: skip
            if main is not None:
                self.query_one(main).focus()

    # ---- actions ---------------------------------------------------------------------
    @on(Input.Submitted, "#filter")
    def filter_done(self) -> None:
        self.query_one("#hosts").focus()

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.query_text = event.value
        self.fleet_pane.show(self.fleet, self.query_text)

    @on(RowList.Selected, "#hosts")
    def host_selected(self, event: RowList.Selected) -> None:
        self.push_screen(HostScreen(event.key))

    @on(DataTable.RowSelected, "#jobs-table")
    def job_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.push_screen(JobScreen(event.row_key.value))

    @on(DataTable.RowSelected, "#anomaly-table")
    def anomaly_selected(self, event: DataTable.RowSelected) -> None:
        self.anomalies_pane.action_remediate()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): Textual's commands and every screen of ours."""
        yield from super().get_system_commands(screen)
        for tab, help_ in (("fleet", "NICs by rack, coloured by delay and loss"),
                           ("anomalies", "open anomalies and their remediation"),
                           ("jobs", "running jobs and their GID types"),
                           ("audit", "the latest fleet audit")):  # fmt: skip
            yield SystemCommand(tab.capitalize(), help_, lambda t=tab: self.action_show_tab(t))
        yield SystemCommand("Filter", "find hosts by name, rack, state, address or tag",
                            self.action_focus_filter)  # fmt: skip

    def action_show_tab(self, tab: str) -> None:
        # Nothing focused while the panes swap: hiding the focused list made Textual move
        # the focus to the next widget of the pane being hidden (the filter), which
        # switched back to that pane on a loaded machine. tab_shown focuses the new list.
        if tab != self.tabs.active:
            self.screen.set_focus(None)
        self.tabs.active = tab

    def action_focus_filter(self) -> None:
        self.action_show_tab("fleet")
        self.query_one("#filter", Input).focus()

    def action_toggle_help(self) -> None:
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def recommended(self, anomaly: dict[str, Any]) -> str:
        """The remediation an anomaly calls for, in a few words (``plan.recommended``)."""
        from analytics.remediate.plan import no_remedy, recommended

        key = (str(anomaly.get("kind", "")), str(anomaly.get("link") or ""),
               str(anomaly.get("job_id") or ""))  # fmt: skip
        if key not in self._recommended:  # a topology lookup per anomaly, once
            if key[0] == "flapping_link" and self.topology_doc is None:
                self._recommended[key] = "needs --topology"
            else:
                action, target = recommended(self.topology_doc, *key)
                self._recommended[key] = (f"{action} {target}".strip()
                                          or no_remedy(self.topology_doc, *key[:2]))  # fmt: skip
        return self._recommended[key]

    def plan_text(self, anomaly_id: str) -> tuple[str, bool]:
        """The remediation plan in words (same preflight as the playbook), or the refusal."""
        if self.store is None or self.topology is None:
            return "start the TUI with --store and --topology to plan remediations", False
        from analytics.remediate.plan import Refused, plan, read_topology
        from analytics.remediate.records import RecordError

        try:
            # the topology read at start; read again only to say why it could not be
            topology = self.topology_doc or read_topology(self.topology)
            p = plan(self.store, topology, anomaly_id=anomaly_id)
        except (Refused, RecordError) as exc:
            return str(exc), False
        return p.describe() + self._remediated(anomaly_id), True

    def _remediated(self, anomaly_id: str) -> str:
        """This anomaly's remediations so far, in their state now (lines to add to a plan)."""
        import duckdb

        from analytics.store.catalog import connect_views
        from tui import history

        if self.store is None:
            return ""
        try:
            con = connect_views(self.store, only=["remediation_current"])
            try:
                rows = history.remediations(con, anomaly_id)
            finally:
                con.close()
        except (FileNotFoundError, duckdb.Error) as exc:
            return f"\n  its remediations so far: cannot be read ({exc})"
        return "".join(f"\n  so far: {r['remediation_id']} {r['action']} {r['target']}: "
                       f"{r['state']} (by {r['actor']})" for r in rows)  # fmt: skip


def main_app(url: str, **kw: Any) -> ClockmeshApp:
    return ClockmeshApp(LiveSource(url), **kw)
