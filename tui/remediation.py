"""The remediation dialogs: plan → check-mode preview → explicit confirmation → real run.

:class:`RemediationScreen` opens on an anomaly (enter on the Anomalies tab): it shows the
plan in words (the app's :meth:`~tui.app.ClockmeshApp.plan_text`, the same preflight as the
playbook), previews it in check mode, asks :class:`ConfirmScreen` (whose default answer is
No) before the real run, and streams the playbook's output; escape or Cancel stops a run.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Log, Static

from tui import preview

if TYPE_CHECKING:
    from tui.app import ClockmeshApp


class ConfirmScreen(ModalScreen[bool]):
    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(self.question)
            with Horizontal():
                yield Button("No", id="no", variant="primary")
                yield Button("Yes, run it", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # enter alone never says yes

    @on(Button.Pressed)
    def answer(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class RemediationScreen(ModalScreen[None]):
    """Plan → check-mode preview → explicit confirmation → real run (streamed, cancellable)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel / close")]

    def __init__(self, anomaly: dict[str, Any]) -> None:
        super().__init__()
        self.anomaly = anomaly
        self.plan: dict[str, Any] | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.previewed = False

    @property
    def clockmesh(self) -> ClockmeshApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        a = self.anomaly
        with Vertical(id="remediation"):
            yield Label(f"{a.get('anomaly_id')}  {a.get('kind')}  {a.get('link') or a.get('job_id')}",
                        id="rem-title")  # fmt: skip
            yield Static("planning…", id="plan")
            with Horizontal(id="rem-buttons"):
                yield Button("Preview (check mode)", id="preview", disabled=True)
                yield Button("Run for real", id="run", variant="error", disabled=True)
                yield Button("Cancel", id="cancel")
            yield Log(id="output", highlight=False)

    def on_mount(self) -> None:
        self.make_plan()

    @work(thread=True, exclusive=True, group="plan")
    def make_plan(self) -> None:
        app = self.clockmesh
        text, ok = app.plan_text(self.anomaly["anomaly_id"])
        self.app.call_from_thread(self._planned, text, ok)

    def _planned(self, text: str, ok: bool) -> None:
        app = self.clockmesh
        plan = self.query_one("#plan", Static)
        if not ok:
            plan.update(Text(f"refused: {text}", style="bold red"))
            return
        if app.inventory is None:
            plan.update(Text(f"{text}\nstart the TUI with --inventory to run playbooks",
                             style="yellow"))  # fmt: skip
            return
        plan.update(text)
        preview = self.query_one("#preview", Button)
        preview.disabled = False
        preview.focus()  # enter previews (the dialog opened with only Cancel to focus)

    @on(Button.Pressed, "#preview")
    def preview(self) -> None:
        self.query_one("#preview", Button).disabled = True
        self.run_playbook(check=True)

    @on(Button.Pressed, "#run")
    def confirm_run(self) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.query_one("#run", Button).disabled = True
                self.run_playbook(check=False)
            else:
                self.query_one("#output", Log).write_line("not confirmed: nothing changed")

        self.app.push_screen(
            ConfirmScreen(f"Run {self.anomaly.get('anomaly_id')}'s remediation for real?"), answered
        )

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.query_one("#output", Log).write_line("cancelled: the playbook was stopped")
            return
        self.dismiss(None)

    @work(thread=True, exclusive=True, group="playbook")
    def run_playbook(self, check: bool) -> None:
        from analytics.remediate import runner

        app = self.clockmesh
        assert app.inventory is not None
        log = self.query_one("#output", Log)
        argv = runner.playbook_argv(app.inventory, "remediate.yml",
                                    {"anomaly_id": self.anomaly["anomaly_id"]}, check=check)  # fmt: skip

        def started(p: subprocess.Popen[str]) -> None:
            self.proc = p

        def echo(line: str) -> None:
            if not line.startswith("skipping: ["):  # folded: the roles' branches not taken
                self.app.call_from_thread(log.write_line, line)

        result = runner.stream(argv, echo, on_start=started)
        self.proc = None
        self.app.call_from_thread(self._finished, check, result.ok, result.changed, result.lines)

    def _finished(
        self, check: bool, ok: bool, changed: dict[str, int], lines: list[str] | None = None
    ) -> None:
        log = self.query_one("#output", Log)
        if check and ok:
            self.previewed = True
            # The change itself first (which lines on which host or switch), then the log
            # with the skipped tasks folded away (tui/preview.py).
            log.clear()
            log.write_lines(preview.render(preview.parse(lines or [])))
            log.scroll_home(animate=False)
            log.write_line(
                f"== the real run would change: {({h: n for h, n in changed.items() if n}) or 'nothing'}"
            )
            run = self.query_one("#run", Button)
            run.disabled = False
            run.focus()  # enter asks; the question's default answer is No
        elif check:
            log.write_line("== the preview failed or was refused: nothing changed")
        else:
            log.write_line("== done" if ok else "== the run failed (recorded as failed)")
