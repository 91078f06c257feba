"""``clockmesh collector ...``: run or inspect the collector on a fleet host.

Started minimal by the Ansible work (the roles validate collector.yml with
``check-config`` before it replaces the old file); ``run`` and ``status`` added
by the collector work.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
import msgspec

from collector import config as collector_config
from collector.configfile import ConfigError

STALE_S = 5.0
F = TypeVar("F", bound=Callable[..., object])


def _config_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=str(collector_config.DEFAULT_PATH),
        show_default=True,
        help=help_text,
    )


def _load_or_exit(config_path: str) -> collector_config.CollectorConfig:
    """The config, or its one-line error on stderr and exit 2."""
    try:
        return collector_config.load(Path(config_path))
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(2) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def collector() -> None:
    """Run or inspect the probe/telemetry collector."""


@collector.command("check-config")
@click.argument(
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=collector_config.DEFAULT_PATH,
    required=False,
)
def check_config(path: Path) -> None:
    """Validate collector.yml at PATH (default /etc/clockmesh/collector.yml).

    Prints "PATH: ok" and exits 0, or prints one line naming the file, the key and
    what was expected and exits 2.
    """
    try:
        collector_config.load(path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(2) from None
    click.echo(f"{path}: ok")


@collector.command("run")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=str(collector_config.DEFAULT_PATH),
    show_default=True,
    help="collector.yml to run with.",
)
def run(config_path: str) -> None:
    """Run the collector in the foreground (SIGTERM stops, SIGHUP reloads)."""
    from collector.agent import Collector, setup_logging

    try:
        cfg = collector_config.load(config_path)
        setup_logging(cfg.log_level)
        agent = Collector(cfg, config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None
    try:
        sys.exit(agent.run())
    except OSError as exc:
        # e.g. the backend address is not configured on this host
        raise click.ClickException(f"{config_path}: backend: cannot open sockets: {exc}") from None


def _default_status_file() -> str:
    for info in msgspec.structs.fields(collector_config.CollectorConfig):
        if info.name == "status_file":
            return str(info.default)
    raise AssertionError("CollectorConfig has no status_file")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age(unix: float) -> str:
    if not unix:
        return "never"
    return f"{time.time() - unix:.1f}s ago"


@collector.command("status")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="collector.yml naming the status file (default: /etc/clockmesh/collector.yml).",
)
@click.option("--status-file", type=click.Path(dir_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the raw status JSON.")
def status(config_path: str | None, status_file: str | None, as_json: bool) -> None:
    """Show what the running collector is doing (reads its status file)."""
    if status_file is None:
        path = Path(config_path or collector_config.DEFAULT_PATH)
        if config_path is None and not path.exists():
            status_file = _default_status_file()
        else:
            try:
                status_file = collector_config.load(path).status_file
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from None
    try:
        data = json.loads(Path(status_file).read_text())
    except FileNotFoundError:
        raise click.ClickException(
            f"{status_file}: status file not found (is the collector running?)"
        ) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{status_file}: unreadable status file: {exc}") from None
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    age = time.time() - float(data.get("updated_unix", 0))
    if data.get("state") == "stopped":
        state = f"stopped {age:.0f}s ago"
    elif not _pid_alive(int(data.get("pid", 0))):
        state = f"NOT RUNNING (pid gone; last update {age:.0f}s ago)"
    elif age >= STALE_S:
        state = f"STALE (last update {age:.0f}s ago)"
    else:
        state = "running"
    rej = data.get("rejected", {})
    sp = data.get("spool", {})
    sh = data.get("shipping", {})
    lines = [
        f"collector {data.get('host')} pid {data.get('pid')}: {state}",
        f"  probes/s       sent {data.get('probes_sent_per_s')}  received {data.get('probes_received_per_s')}"
        f"  (total sent {data.get('probes_sent')}, received {data.get('probes_received')},"
        f" echoes {data.get('echoes_received')})",
        f"  buddies        {len(data.get('buddies', []))} x {data.get('ports_per_buddy')} ports:"
        f" {', '.join(data.get('buddies', [])) or '-'}",
        "  rejected       "
        + (", ".join(f"{k} {v}" for k, v in sorted(rej.items())) or "none")
        + f"  (total {sum(rej.values())})",
        f"  spool          {sp.get('segments')} segments, {sp.get('bytes')} bytes, {sp.get('rows')} rows"
        f" waiting; dropped {sp.get('dropped_rows')} rows",
    ]
    lines += _shipping_lines(sh)
    if data.get("lab_clock"):
        lc = data["lab_clock"]
        lines.append(
            f"  lab clock      offset {lc['offset_ns']} ns, drift {lc['drift_ppm']} ppm, t0 {lc['t0_ns']}"
        )
    click.echo("\n".join(lines))


def _shipping_lines(sh: dict) -> list[str]:
    """One ops box: its last ack (as before); several: one line per box."""
    boxes = sh.get("boxes") or [sh]
    lines = []
    for box in boxes:
        label = "last ack      " if len(boxes) == 1 else f"ops box {box.get('url')}: last ack"
        line = (
            f"  {label} segment {box.get('last_ack_segment')} {_age(box.get('last_ack_unix', 0))}"
            f" ({box.get('segments_acked')} acked, {box.get('rejected')} rejected"
        )
        if len(boxes) > 1 or box.get("refused") or box.get("dropped_rows"):
            line += (
                f", {box.get('waiting_segments', 0)} segments waiting, {box.get('refused', 0)}"
                f" refused, {box.get('dropped_rows', 0)} rows dropped unshipped"
            )
        lines.append(line + ")")
        if box.get("last_error"):
            lines.append(f"  shipping error {box['last_error']} (retry in {box.get('backoff_s')}s)")
    return lines


@collector.command("audit")
@_config_option("collector.yml: backend interface and address, peers, ops box, sysfs root.")
@click.option("--nccl-conf", default=None, help="nccl.conf to read (default: the config's).")
@click.option("--min-mtu", type=int, default=1500, show_default=True, help="Backend MTU floor.")
@click.option("--max-rtt-ms", type=float, default=1.0, show_default=True,
              help="Mesh RTT threshold to every peer.")  # fmt: skip
@click.option("--min-mem-gib", type=float, default=0.0, show_default=True, help="Memory floor.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def audit(
    config_path: str,
    nccl_conf: str | None,
    min_mtu: int,
    max_rtt_ms: float,
    min_mem_gib: float,
    as_json: bool,
) -> None:
    """Audit this host before a long job: every check pass, fail or skipped, with a reason.

    Needs root for the mesh check (ICMP echo on a raw socket). playbooks/audit.yml runs
    it on every collector and stores the results on the ops box.
    """
    from collector import audit as host_audit

    cfg = _load_or_exit(config_path)
    args = host_audit.AuditArgs(
        backend_interface=cfg.backend.interface,
        backend_address=cfg.backend.address,
        peers={p.name: p.address for p in cfg.peers if p.name != cfg.host},
        ingest_url=cfg.ingest.targets()[0],
        sysfs_root=cfg.counters.sysfs_root,
        nccl_conf=nccl_conf or cfg.rdma.nccl_conf,
        status_file=cfg.status_file,
        min_mtu=min_mtu,
        min_mem_gib=min_mem_gib,
        max_rtt_ms=max_rtt_ms,
        lab=cfg.lab,
    )
    checks = host_audit.run(args)
    if as_json:
        click.echo(host_audit.as_json(checks))
        return
    for c in checks:
        click.echo(
            f"{c.status:<8} {c.category}/{c.check}: {c.reason}"
            + (f" [{c.value}]" if c.value else "")
        )


@collector.command("gids")
@_config_option("collector.yml: sysfs and configfs roots, backend interface, nccl.conf.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gids(config_path: str, as_json: bool) -> None:
    """This host's GID table, the RoCE v2 index a job should use, and nccl.conf's index.

    `recommended` is the RoCE v2 GID on the backend interface that carries its IPv4
    address (routable), else the first RoCE v2 GID on it: read from the table, never a
    fixed number. The remediation role for RoCE v1 jobs uses it.
    """
    from collector import rdma_config

    cfg = _load_or_exit(config_path)
    rows = rdma_config.gid_table(cfg.counters.sysfs_root, cfg.rdma.configfs_root, 0, 0)
    table = [
        {"device": r["device"].decode(), "port": int(r["port"]), "index": int(r["gid_index"]),
         "gid": r["gid"].decode(), "type": r["gid_type"].decode(), "ndev": r["ndev"].decode(),
         "default_roce_mode": r["default_roce_mode"].decode()}
        for r in rows
    ]  # fmt: skip
    mine = [g for g in table if g["ndev"] == cfg.backend.interface and g["type"] == "RoCE v2"]
    routable = [g for g in mine if g["gid"].startswith("0000:0000:0000:0000:0000:ffff:")]
    pick = (routable or mine)[0] if (routable or mine) else None
    text = None
    with contextlib.suppress(OSError):
        text = Path(cfg.rdma.nccl_conf).read_text()
    doc = {
        "gids": table,
        "recommended": pick,
        "nccl_conf": cfg.rdma.nccl_conf,
        "nccl_conf_index": rdma_config.parse_nccl_conf(text) if text is not None else None,
        "configfs_root": cfg.rdma.configfs_root,
    }
    if as_json:
        click.echo(json.dumps(doc))
        return
    for g in table:
        mark = "  <- recommended" if g is pick else ""
        click.echo(f"{g['device']}/{g['port']} index {g['index']:>3} {g['type']:<11} "
                   f"{g['ndev']:<8} {g['gid']}{mark}")  # fmt: skip
    click.echo(f"{cfg.rdma.nccl_conf}: NCCL_IB_GID_INDEX={doc['nccl_conf_index']}")
