"""``clockmesh daemon``: keep one clockmesh service running on a host without systemd.

The lab (and any host whose PID 1 is not systemd) runs the collector and the ingest
daemon under this small supervisor::

    clockmesh daemon start --name clockmesh-collector --pidfile /run/clockmesh/collector.pid \\
        --log /var/lib/clockmesh/log/collector.log -- clockmesh collector run --config ...
    clockmesh daemon status --name clockmesh-collector --pidfile /run/clockmesh/collector.pid

``start`` detaches (double fork, new session, stdio to the log), and returns once the
supervisor holds its lock and has written the pidfile (atomically, by rename). The
supervisor starts the command, restarts it with exponential back-off whenever it
exits, forwards SIGTERM/SIGINT (stop) and SIGHUP (reload) to it, and removes the
pidfile when it stops. ``stop`` waits until the supervisor has exited. ``status``
uses LSB exit codes: 0 running, 1 dead but the pidfile remains, 3 not running.

Liveness is decided by an ``flock`` on ``PIDFILE.lock`` that the supervisor holds for
its whole life, never by a bare PID (PIDs get reused). Standard library only: this
runs on fleet hosts.

Over 500 lines: one job, the supervisor (fork, lock, back-off) and its five small commands.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

EXIT_RUNNING = 0
EXIT_DEAD = 1  # LSB: program is dead and the pidfile exists
EXIT_STOPPED = 3  # LSB: program is not running

_PR_SET_PDEATHSIG = 1
_KEEP_RUNNING_S = 10.0  # a child that ran this long resets the back-off


@dataclass(frozen=True)
class ServicePaths:
    """Files that describe one supervised service."""

    pidfile: Path

    @property
    def lockfile(self) -> Path:
        return self.pidfile.with_name(self.pidfile.name + ".lock")

    @property
    def statefile(self) -> Path:
        return self.pidfile.with_name(self.pidfile.name + ".state.json")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_pid(pidfile: Path) -> int | None:
    """The PID in ``pidfile``, or None when it is absent or not a PID."""
    try:
        text = pidfile.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def read_state(paths: ServicePaths) -> dict[str, object]:
    try:
        data = json.loads(paths.statefile.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lock_is_held(lockfile: Path) -> bool:
    """True when a live supervisor holds the service lock."""
    try:
        fd = os.open(lockfile, os.O_RDONLY)
    except OSError:  # absent, or its directory is not one: nobody can hold it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our probe lock, if we got it
    return False


def next_backoff(previous: float | None, ran_for: float, initial: float, maximum: float) -> float:
    """Delay before the next restart: ``initial`` after a first (or a long-lived) run's
    exit, then doubling up to ``maximum`` while the child keeps dying quickly."""
    if previous is None or ran_for >= _KEEP_RUNNING_S:
        return min(initial, maximum)
    return min(maximum, max(initial, previous * 2))


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    os.setpgrp()  # own process group: a terminal's ^C reaches only the supervisor


class Supervisor:
    """The detached process: runs the command and restarts it when it exits."""

    def __init__(
        self,
        name: str,
        paths: ServicePaths,
        command: Sequence[str],
        backoff_initial: float,
        backoff_max: float,
        stop_timeout: float,
    ) -> None:
        self.name = name
        self.paths = paths
        self.command = list(command)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stop_timeout = stop_timeout
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts = 0
        self.last_exit: int | None = None

    def log(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        sys.stderr.write(f"{stamp} clockmesh daemon[{self.name}]: {message}\n")
        sys.stderr.flush()

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stopping = True
        self._forward(signum)

    def _on_reload(self, signum: int, _frame: object) -> None:
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    def _write_state(self) -> None:
        state = {
            "name": self.name,
            "supervisor_pid": os.getpid(),
            "child_pid": self.child.pid if self.child is not None else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "command": self.command,
        }
        with contextlib.suppress(OSError):
            write_atomically(self.paths.statefile, json.dumps(state) + "\n")

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _spawn(self) -> bool:
        try:
            self.child = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),
                stderr=sys.stderr.fileno(),
                preexec_fn=_set_parent_death_signal,
                close_fds=True,
            )
        except OSError as exc:
            self.child = None
            self.last_exit = 127
            self.log(f"cannot start {self.command[0]}: {exc.strerror}")
            return False
        self.log(f"started {' '.join(self.command)} (pid {self.child.pid})")
        self._write_state()
        return True

    def _wait_child(self) -> int:
        assert self.child is not None
        deadline: float | None = None
        while True:
            code = self.child.poll()
            if code is not None:
                return code
            if self.stopping and deadline is None:
                deadline = time.monotonic() + self.stop_timeout
            if deadline is not None and time.monotonic() > deadline:
                self.log(
                    f"child {self.child.pid} ignored SIGTERM for {self.stop_timeout:g} s; killing"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child.pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.05)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        backoff: float | None = None
        self._write_state()
        while not self.stopping:
            started = time.monotonic()
            if self._spawn():
                code = self._wait_child()
                self.last_exit = code
            ran_for = time.monotonic() - started
            if self.stopping:
                break
            backoff = next_backoff(backoff, ran_for, self.backoff_initial, self.backoff_max)
            self.restarts += 1
            self.log(f"child exited with status {self.last_exit}; restarting in {backoff:g} s")
            self.child = None
            self._write_state()
            self._sleep(backoff)
        self.log(f"stopped (child exit status {self.last_exit})")
        return 0


def _detach_and_supervise(
    name: str,
    paths: ServicePaths,
    command: Sequence[str],
    log: Path | None,
    backoff_initial: float,
    backoff_max: float,
    stop_timeout: float,
) -> tuple[bool, str]:
    """Double-fork a supervisor. Returns (started, message) in the calling process."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first > 0:  # the caller: wait for the supervisor's word
        os.close(write_end)
        os.waitpid(first, 0)
        chunks = []
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
        os.close(read_end)
        reply = b"".join(chunks).decode(errors="replace").strip()
        if reply.startswith("ok "):
            return True, f"started {name} (pid {reply[3:]})"
        return False, reply or f"{name}: the supervisor exited before it was ready"

    # First child: new session, then fork again so the supervisor is never a session leader.
    code = 1
    try:
        os.close(read_end)
        os.setsid()
        if os.fork() > 0:
            code = 0
        else:
            code = _become_supervisor(
                name,
                paths,
                command,
                log,
                write_end,
                backoff_initial,
                backoff_max,
                stop_timeout,
            )
    except BaseException as exc:  # never return into the caller's stack from a fork
        with contextlib.suppress(OSError):
            os.write(write_end, f"{name}: {exc}\n".encode())
    finally:
        os._exit(code)


def _become_supervisor(
    name: str,
    paths: ServicePaths,
    command: Sequence[str],
    log: Path | None,
    ready_fd: int,
    backoff_initial: float,
    backoff_max: float,
    stop_timeout: float,
) -> int:
    os.chdir("/")
    os.umask(0o022)
    # Close everything inherited (an ssh session's pipes must not stay open) but the pipe.
    os.closerange(3, ready_fd)
    os.closerange(ready_fd + 1, 65536)

    def fail(message: str) -> int:
        os.write(ready_fd, f"{message}\n".encode())
        os.close(ready_fd)
        return 1

    try:
        paths.pidfile.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return fail(
            f"{paths.pidfile.parent}: expected a directory for the pidfile ({exc.strerror})"
        )
    try:
        lock_fd = os.open(paths.lockfile, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        return fail(f"{paths.lockfile}: cannot create: {exc.strerror}")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = read_pid(paths.pidfile)
        return fail(f"{name} is already running (pid {pid})")
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        else:
            out_fd = os.open(os.devnull, os.O_WRONLY)
    except OSError as exc:
        return fail(f"{log}: cannot open the log: {exc.strerror}")
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(null_fd)
    os.close(out_fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own stdio
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    try:
        write_atomically(paths.pidfile, f"{os.getpid()}\n")
    except OSError as exc:
        return fail(f"{paths.pidfile}: cannot write the pidfile: {exc.strerror}")
    os.write(ready_fd, f"ok {os.getpid()}\n".encode())
    os.close(ready_fd)
    supervisor = Supervisor(name, paths, command, backoff_initial, backoff_max, stop_timeout)
    try:
        return supervisor.run()
    finally:
        with contextlib.suppress(OSError):
            paths.pidfile.unlink()
        with contextlib.suppress(OSError):
            paths.statefile.unlink()
        os.close(lock_fd)


def stop_service(name: str, paths: ServicePaths, timeout: float) -> tuple[int, str]:
    """SIGTERM the supervisor and wait for it to exit. Returns (exit code, message)."""
    if not lock_is_held(paths.lockfile):
        stale = paths.pidfile.exists()
        with contextlib.suppress(OSError):
            paths.pidfile.unlink()
        return 0, f"{name} is not running" + (" (removed a stale pidfile)" if stale else "")
    pid = read_pid(paths.pidfile)
    if pid is None:
        return 1, f"{paths.pidfile}: expected the supervisor's PID, found none"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not lock_is_held(paths.lockfile):
            return 0, f"stopped {name}"
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # its child gets SIGTERM via the parent-death signal
    for _ in range(100):
        if not lock_is_held(paths.lockfile):
            break
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        paths.pidfile.unlink()
    return 1, f"{name} did not stop within {timeout:g} s; killed the supervisor (pid {pid})"


def service_status(name: str, paths: ServicePaths) -> tuple[int, str]:
    """(LSB exit code, one-line description) of the service."""
    if lock_is_held(paths.lockfile):
        state = read_state(paths)
        pid = read_pid(paths.pidfile)
        child = state.get("child_pid")
        child_text = f"child pid {child}" if child else "child waiting to restart"
        return EXIT_RUNNING, (
            f"{name} is running (pid {pid}, {child_text}, restarts {state.get('restarts', 0)})"
        )
    if paths.pidfile.exists():
        return EXIT_DEAD, f"{name} is dead but {paths.pidfile} exists"
    return EXIT_STOPPED, f"{name} is not running"


# --- command line ------------------------------------------------------------------------

_name_option = click.option(
    "--name", required=True, help="Service name used in messages, e.g. clockmesh-collector."
)
_pidfile_option = click.option(
    "--pidfile",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Supervisor pidfile; PIDFILE.lock and PIDFILE.state.json live next to it.",
)
_start_options: list[Callable[[Any], Any]] = [
    click.option(
        "--log",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Append the supervisor's and the command's output here (default: discard).",
    ),
    click.option(
        "--backoff-initial",
        type=click.FloatRange(min=0.05),
        default=1.0,
        show_default=True,
        help="Seconds before the first restart of a dying command.",
    ),
    click.option(
        "--backoff-max",
        type=click.FloatRange(min=0.05),
        default=30.0,
        show_default=True,
        help="Cap of the doubling restart delay.",
    ),
    click.option(
        "--stop-timeout",
        type=click.FloatRange(min=0.1),
        default=20.0,
        show_default=True,
        help="Seconds the command gets to exit after SIGTERM before SIGKILL.",
    ),
    click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED),
]


def _with(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def daemon() -> None:
    """Supervise a clockmesh service on hosts without systemd.

    \b
    clockmesh daemon start --name N --pidfile P [--log FILE] -- CMD ...
    clockmesh daemon stop|status|reload --name N --pidfile P
    clockmesh daemon restart --name N --pidfile P [--log FILE] -- CMD ...
    """


def _start(
    name: str,
    pidfile: Path,
    log: Path | None,
    bi: float,
    bm: float,
    st: float,
    command: tuple[str, ...],
) -> int:
    paths = ServicePaths(pidfile.absolute())
    if lock_is_held(paths.lockfile):
        click.echo(f"{name} is already running (pid {read_pid(paths.pidfile)})")
        return 0
    started, message = _detach_and_supervise(
        name, paths, command, log.absolute() if log else None, bi, bm, st
    )
    if not started and "already running" in message:
        click.echo(message)
        return 0
    click.echo(message, err=not started)
    return 0 if started else 1


@daemon.command()
@_name_option
@_pidfile_option
@_with(_start_options)
def start(
    name: str,
    pidfile: Path,
    log: Path | None,
    backoff_initial: float,
    backoff_max: float,
    stop_timeout: float,
    command: tuple[str, ...],
) -> None:
    """Start CMD under a detached supervisor (no-op when it already runs).

    Prints "started NAME (pid N)" or "NAME is already running (pid N)".
    """
    sys.exit(_start(name, pidfile, log, backoff_initial, backoff_max, stop_timeout, command))


@daemon.command()
@_name_option
@_pidfile_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the supervisor to exit before SIGKILL.",
)
def stop(name: str, pidfile: Path, timeout: float) -> None:
    """Stop the supervisor and its command, waiting until they have exited."""
    code, message = stop_service(name, ServicePaths(pidfile.absolute()), timeout)
    click.echo(message, err=code != 0)
    sys.exit(code)


@daemon.command()
@_name_option
@_pidfile_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the old supervisor to exit.",
)
@_with(_start_options)
def restart(
    name: str,
    pidfile: Path,
    timeout: float,
    log: Path | None,
    backoff_initial: float,
    backoff_max: float,
    stop_timeout: float,
    command: tuple[str, ...],
) -> None:
    """Stop the service (if it runs) and start CMD again."""
    code, message = stop_service(name, ServicePaths(pidfile.absolute()), timeout)
    click.echo(message, err=code != 0)
    if code != 0:
        sys.exit(code)
    sys.exit(_start(name, pidfile, log, backoff_initial, backoff_max, stop_timeout, command))


@daemon.command()
@_name_option
@_pidfile_option
def status(name: str, pidfile: Path) -> None:
    """Report whether the service runs. Exit 0 running, 1 dead with pidfile, 3 stopped."""
    code, message = service_status(name, ServicePaths(pidfile.absolute()))
    click.echo(message)
    sys.exit(code)


@daemon.command()
@_name_option
@_pidfile_option
def reload(name: str, pidfile: Path) -> None:
    """Send SIGHUP to the supervised command (via its supervisor)."""
    paths = ServicePaths(pidfile.absolute())
    pid = read_pid(paths.pidfile)
    if not lock_is_held(paths.lockfile) or pid is None:
        click.echo(f"{name} is not running", err=True)
        sys.exit(EXIT_STOPPED)
    os.kill(pid, signal.SIGHUP)
    click.echo(f"reloaded {name}")
