"""`clockmesh daemon`: real detached supervisors and real child processes.

Every test runs the command in a subprocess (the supervisor double-forks, which
must never happen inside pytest itself) and a fixture stops whatever a test
started, by the PIDs the supervisor recorded, even when the test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collector.supervise import ServicePaths, next_backoff, read_pid, write_atomically

ROOT = Path(__file__).resolve().parents[2]


def daemon(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "daemon", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")


class Service:
    """One supervised service in a test's tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.name = "cm-test"
        self.pidfile = tmp_path / "run" / "svc.pid"
        self.log = tmp_path / "log" / "svc.log"
        self.paths = ServicePaths(self.pidfile)
        self.seen_pids: set[int] = set()

    def args(self) -> list[str]:
        return ["--name", self.name, "--pidfile", str(self.pidfile)]

    def start(self, *command: str, backoff: float = 0.1) -> subprocess.CompletedProcess[str]:
        result = daemon(
            "start", *self.args(), "--log", str(self.log), "--backoff-initial", str(backoff),
            "--backoff-max", "0.5", "--stop-timeout", "1", "--", *command,
        )  # fmt: skip
        self._remember()
        return result

    def state(self) -> dict[str, object]:
        try:
            data = json.loads(self.paths.statefile.read_text())
        except (OSError, ValueError):
            return {}
        self._remember(data)
        return data

    def child_pid(self) -> int | None:
        pid = self.state().get("child_pid")
        return pid if isinstance(pid, int) else None

    def _remember(self, state: dict[str, object] | None = None) -> None:
        pid = read_pid(self.pidfile)
        if pid:
            self.seen_pids.add(pid)
        child = (state or {}).get("child_pid")
        if isinstance(child, int):
            self.seen_pids.add(child)

    def cleanup(self) -> None:
        self.state()
        daemon("stop", *self.args(), "--timeout", "5")
        for pid in self.seen_pids:  # only processes this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path)
    try:
        yield svc
    finally:
        svc.cleanup()


def child_script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def test_start_status_stop_lifecycle(service: Service) -> None:
    result = service.start("sleep", "300")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"started {service.name} (pid ")
    supervisor = read_pid(service.pidfile)
    assert supervisor is not None and alive(supervisor)
    wait_for(service.child_pid, what="the child pid in the state file")
    child = service.child_pid()
    assert child is not None and alive(child)
    assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"300"]

    status = daemon("status", *service.args())
    assert status.returncode == 0
    assert f"pid {supervisor}" in status.stdout and f"child pid {child}" in status.stdout

    again = service.start("sleep", "300")
    assert again.returncode == 0
    assert "already running" in again.stdout
    assert read_pid(service.pidfile) == supervisor  # no second supervisor

    stopped = daemon("stop", *service.args())
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"stopped {service.name}"
    # stop waits: both processes are gone when it returns.
    assert not alive(supervisor)
    wait_for(lambda: not alive(child), timeout=2, what="the child to be reaped")
    assert not service.pidfile.exists()
    final = daemon("status", *service.args())
    assert final.returncode == 3
    assert final.stdout.strip() == f"{service.name} is not running"
    assert daemon("stop", *service.args()).returncode == 0  # stopping twice is fine


def test_child_that_dies_is_restarted_with_backoff(service: Service, tmp_path: Path) -> None:
    runs = tmp_path / "runs.txt"
    command = child_script(
        tmp_path,
        f"import os\nopen({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n')\nraise SystemExit(7)\n",
    )
    assert service.start(*command).returncode == 0
    wait_for(lambda: runs.exists() and len(runs.read_text().split()) >= 3, what="three runs")
    pids = runs.read_text().split()
    assert len(set(pids)) == len(pids)  # a new process each time
    assert daemon("status", *service.args()).returncode == 0
    assert int(service.state()["restarts"]) >= 2  # type: ignore[call-overload]
    assert service.state()["last_exit"] == 7
    log = service.log.read_text()
    assert "child exited with status 7; restarting in 0.1 s" in log
    assert "restarting in 0.2 s" in log  # the delay doubles while it keeps dying


def test_killed_child_is_replaced(service: Service) -> None:
    assert service.start("sleep", "300").returncode == 0
    wait_for(service.child_pid, what="first child")
    first = service.child_pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: service.child_pid() not in (None, first), what="a replacement child")
    second = service.child_pid()
    assert second is not None and alive(second)
    assert "status -9" in service.log.read_text()


def test_sigterm_and_sighup_are_forwarded(service: Service, tmp_path: Path) -> None:
    events = tmp_path / "events.txt"
    command = child_script(
        tmp_path,
        "import signal, sys, time\n"
        f"def note(what):\n    open({str(events)!r}, 'a').write(what + '\\n')\n"
        "signal.signal(signal.SIGHUP, lambda *_: note('hup'))\n"
        "def term(*_):\n    note('term')\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "note('ready')\n"
        "while True:\n    time.sleep(0.05)\n",
    )
    assert service.start(*command).returncode == 0
    wait_for(lambda: events.exists() and "ready" in events.read_text(), what="child ready")
    reload = daemon("reload", *service.args())
    assert reload.returncode == 0, reload.stderr
    wait_for(lambda: "hup" in events.read_text(), what="SIGHUP at the child")
    assert daemon("status", *service.args()).returncode == 0  # reload does not restart
    assert daemon("stop", *service.args()).returncode == 0
    assert events.read_text().split() == ["ready", "hup", "term"]


def test_stop_kills_a_child_that_ignores_sigterm(service: Service, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = child_script(
        tmp_path,
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(ready)!r}, 'w').close()\nwhile True:\n    time.sleep(0.05)\n",
    )
    assert service.start(*command).returncode == 0
    wait_for(ready.exists, what="child ready")
    child = service.child_pid()
    assert child is not None
    begun = time.monotonic()
    result = daemon("stop", *service.args())
    assert result.returncode == 0, result.stderr
    assert 0.9 <= time.monotonic() - begun < 10  # --stop-timeout 1, then SIGKILL
    wait_for(lambda: not alive(child), timeout=2, what="the stubborn child to die")
    assert "ignored SIGTERM" in service.log.read_text()


def test_killed_supervisor_reports_dead_takes_child_along_and_restarts(service: Service) -> None:
    assert service.start("sleep", "300").returncode == 0
    wait_for(service.child_pid, what="child")
    supervisor, child = read_pid(service.pidfile), service.child_pid()
    assert supervisor and child
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not alive(supervisor), what="supervisor gone")
    wait_for(lambda: not alive(child), what="child ended by the parent-death signal")
    status = daemon("status", *service.args())
    assert status.returncode == 1
    assert "dead" in status.stdout
    restarted = service.start("sleep", "300")  # the stale pidfile does not block a start
    assert restarted.returncode == 0, restarted.stderr
    assert read_pid(service.pidfile) not in (None, supervisor)


def test_restart_replaces_supervisor_and_command(service: Service) -> None:
    assert service.start("sleep", "300").returncode == 0
    old = read_pid(service.pidfile)
    result = daemon("restart", *service.args(), "--log", str(service.log), "--", "sleep", "301")
    assert result.returncode == 0, result.stderr
    assert "stopped" in result.stdout and "started" in result.stdout
    service.state()
    new = read_pid(service.pidfile)
    assert new is not None and new != old
    wait_for(service.child_pid, what="new child")
    child = service.child_pid()
    assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[1] == b"301"


def test_missing_program_keeps_supervisor_retrying(service: Service, tmp_path: Path) -> None:
    assert service.start(str(tmp_path / "no-such-program")).returncode == 0
    wait_for(lambda: "cannot start" in service.log.read_text(), what="the failure in the log")
    assert daemon("status", *service.args()).returncode == 0


def test_unusable_pidfile_location_fails_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = daemon("start", "--name", "x", "--pidfile", str(blocker / "x.pid"), "--", "true")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(blocker) in lines[0]
    assert "Traceback" not in result.stderr


def test_command_is_required_and_help_works() -> None:
    missing = daemon("start", "--name", "x", "--pidfile", "/tmp/never.pid")
    assert missing.returncode == 2
    assert "COMMAND" in missing.stderr
    for sub in ("start", "stop", "status", "restart", "reload"):
        helped = daemon(sub, "--help")
        assert helped.returncode == 0 and "--pidfile" in helped.stdout


def test_next_backoff_doubles_and_resets() -> None:
    assert next_backoff(None, 0.1, 1.0, 30.0) == 1.0
    assert next_backoff(1.0, 0.1, 1.0, 30.0) == 2.0
    assert next_backoff(16.0, 0.1, 1.0, 30.0) == 30.0
    assert next_backoff(30.0, 60.0, 1.0, 30.0) == 1.0  # it ran long enough: start over


def test_write_atomically_replaces_without_leftovers(tmp_path: Path) -> None:
    target = tmp_path / "p.pid"
    target.write_text("old\n")
    write_atomically(target, "123\n")
    assert target.read_text() == "123\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.pid"]
