"""``clockmesh lab ...``: build, inspect and break a leaf-spine lab (root only).

Over 500 lines: one thin command per ``clockmesh lab`` verb; the work is in lab's modules.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from collector.configfile import ConfigError
from lab.fabric import Lab, LabError
from lab.plan import PlanError
from lab.status import LabStatus

F = TypeVar("F", bound=Callable[..., Any])


def _user_errors(func: F) -> F:
    """Turn lab/user errors into one-line click errors (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (LabError, PlanError, ConfigError) as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper  # type: ignore[return-value]


def _lab_options(func: F) -> F:
    func = click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="State directory (default: ./.lab/NAME).",
    )(func)
    func = click.option(
        "--name",
        default="demo",
        show_default=True,
        envvar="CLOCKMESH_LAB",
        help="Lab name (1-12 lowercase letters/digits); prefixes its namespaces.",
    )(func)
    return func


def _make_lab(name: str, state_dir: Path | None) -> Lab:
    try:
        return Lab(name, state_dir)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(us|µs|ms|s|m)?$")


def parse_duration(text: str, option: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise click.BadParameter(
            f"expected a duration like 3s, 500ms or 1m, got {text!r}", param_hint=option
        )
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0}[unit]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def lab() -> None:
    """Build and break a leaf-spine lab fabric in network namespaces (root only).

    Hosts h<leaf>-<n>, leaves, spines and an ops box, each a network namespace; a
    management bridge in the root namespace; sshd per host. See docs/lab.md.
    """


@lab.command()
@_lab_options
@click.option("--spines", type=int, default=2, show_default=True)
@click.option("--leaves", type=int, default=4, show_default=True)
@click.option("--hosts-per-leaf", type=int, default=4, show_default=True)
@click.option(
    "--clock-skew",
    "clock_seed",
    type=int,
    default=None,
    metavar="SEED",
    help="Give every host a seeded ground-truth clock error (±5 ms, ±50 ppm) in the inventory.",
)
@click.option("--ops", type=click.IntRange(1, 2), default=1, show_default=True,
              help="Ops boxes: 2 adds a standby (ops2, mgmt .3) the collectors ship to as well.")  # fmt: skip
@_user_errors
def up(
    name: str,
    state_dir: Path | None,
    spines: int,
    leaves: int,
    hosts_per_leaf: int,
    clock_seed: int | None,
    ops: int,
) -> None:
    """Build the lab: namespaces, veths, ECMP routes, mgmt bridge, sshd per host."""
    the_lab = _make_lab(name, state_dir)
    t0 = time.monotonic()
    topo = the_lab.up(spines, leaves, hosts_per_leaf, clock_seed, ops)
    took = time.monotonic() - t0
    click.echo(
        f"lab {name}: {len(topo.hosts)} hosts, {len(topo.leaves)} leaves, "
        f"{len(topo.spines)} spines, ops box"
        f"{'es' if topo.standby else ''} {', '.join(b.mgmt_address for b in topo.ops_boxes)}, "
        f"mgmt {topo.mgmt.subnet} on {topo.mgmt.bridge} — up in {took:.1f}s"
    )
    click.echo(f"inventory: {the_lab.inventory_path}")
    click.echo(f"topology:  {the_lab.topology_path}")


@lab.command()
@_lab_options
@click.option(
    "--all", "all_labs", is_flag=True, help="Tear down every clockmesh lab on this machine."
)
@click.option("--keep-files", is_flag=True, help="Keep the state directory (logs, per-host dirs).")
@_user_errors
def down(name: str, state_dir: Path | None, all_labs: bool, keep_files: bool) -> None:
    """Remove every namespace, veth, bridge, mount and process of the lab (idempotent)."""
    if all_labs:
        reports = Lab.down_all()
        for lab_name, rep in reports:
            click.echo(
                f"lab {lab_name}: removed {len(rep.namespaces)} namespaces, "
                f"{len(rep.root_links)} root links, stopped {len(rep.pids)} processes"
            )
        if not reports:
            click.echo("no labs found")
        return
    rep = _make_lab(name, state_dir).down(keep_files=keep_files)
    click.echo(
        f"lab {name}: removed {len(rep.namespaces)} namespaces, {len(rep.root_links)} root "
        f"links, stopped {len(rep.pids)} processes"
    )


def _print_status(st: LabStatus) -> None:
    click.echo(f"lab {st.name}  (state: {st.state_dir}{'' if st.recorded else ', none recorded'})")
    click.echo(
        f"  namespaces: {len(st.namespaces_present)}/{st.namespaces_expected} present"
        f"   mgmt bridge {st.bridge or '-'}: {'up' if st.bridge_exists else 'absent'}"
    )
    if st.nodes:
        bad = [n for n in st.nodes if not (n.exists and n.sshd_alive and n.ssh_port_open)]
        click.echo(f"  sshd: {len(st.nodes) - len(bad)}/{len(st.nodes)} nodes answering on :22")
        for n in bad:
            click.echo(
                f"    {n.name}: namespace {'ok' if n.exists else 'MISSING'}, "
                f"sshd pid {n.sshd_pid} {'alive' if n.sshd_alive else 'DEAD'}, "
                f"port 22 {'open' if n.ssh_port_open else 'CLOSED'}"
            )
    if st.links:
        down_links = [lk for lk in st.links if not lk.up]
        click.echo(f"  links: {len(st.links) - len(down_links)}/{len(st.links)} up")
        for lk in down_links:
            click.echo(f"    {lk.name}: DOWN (a={lk.a_up}, b={lk.b_up})")
        cap = st.capacity
        if cap:
            held = (f"{cap['buffer_bytes']} bytes, {cap['buffer_us']:g} µs"
                    if cap.get("buffer_bytes") else f"{cap.get('queue', 100)} packets")  # fmt: skip
            click.echo(
                f"  fabric capacity: {cap['rate']} per link and direction, RDMA class "
                f"DSCP {cap.get('dscp', 26)} first, queues of {held} (lab capacity)"
            )
        for lk in st.links:
            faults = [q for q in lk.qdisc if not (cap and q.endswith(":htb"))]
            if faults:
                click.echo(f"    {lk.name}: shaped ({', '.join(faults)})")
    if st.routers:
        dead = [
            f"{r.name}:{d}"
            for r in st.routers
            for d in ("zebra", "bgpd", "bfdd")
            if not r.daemons.get(d)
        ]
        click.echo(
            f"  FRR: {len(st.routers)} routers"
            + (f", NOT RUNNING: {', '.join(dead)}" if dead else ", zebra+bgpd+bfdd running")
        )
    if st.netd_alive is not None:
        click.echo(
            "  host network manager (lab.netd): "
            + ("running" if st.netd_alive else "NOT RUNNING (hosts' routes stay gone after ifdown)")
        )
    if st.routing is not None:
        sess = st.routing.sessions
        up = [x for x in sess if x.up]
        bfd_up = [x for x in up if x.bfd == "up"]
        click.echo(f"  BGP sessions: {len(up)}/{len(sess)} established, BFD up on {len(bfd_up)}")
        for x in sess:
            if not x.up:
                click.echo(f"    {x.router}–{x.peer}: {x.state}")
        for g in st.routing.groups:
            if g.router.startswith("leaf"):
                via = ", ".join(g.have) or "NONE"
                flag = "" if g.ok else f"   (expected {', '.join(g.want) or 'none'})"
                click.echo(f"    {g.router} → {g.rack}: via {via}{flag}")
        for name in sorted(st.routing.out_of_service):
            click.echo(f"  {name}: out of service (BGP shut by an operator: a remediation)")
        if st.routing.converged:
            click.echo("  fabric converged")
        else:
            click.echo(f"  fabric NOT converged ({len(st.routing.problems)}):")
            for problem in st.routing.problems:
                click.echo(f"    {problem}")
    if st.faults:
        click.echo("  faults:")
        for f in st.faults:
            state = "" if "pid" not in f else (" running" if f.get("alive") else " finished")
            detail = ", ".join(
                f"{k}={v}" for k, v in f.items() if k not in {"kind", "link", "alive", "start"}
            )
            click.echo(f"    {f.get('kind')} {f.get('link')}{state} ({detail})")
    else:
        click.echo("  faults: none")


@lab.command()
@_lab_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Wait up to this many seconds for the fabric to converge before reporting.",
)
@_user_errors
def status(name: str, state_dir: Path | None, as_json: bool, wait_s: float) -> None:
    """What exists and whether the fabric is converged.

    Namespaces, sshd per host, links up/down, FRR daemons, BGP/BFD sessions, each leaf's
    ECMP next hops per rack against the topology, black holes and missing paths, active
    faults. Exits 1 when the fabric is not converged (or the lab is not up), so scripts
    can wait on it: ``clockmesh lab status --wait 10``.
    """
    lab_ = _make_lab(name, state_dir)
    if wait_s > 0 and lab_.state.exists():
        lab_.wait_converged(timeout=wait_s)
    st = lab_.status()
    if as_json:
        from dataclasses import asdict

        doc = asdict(st)
        doc["converged"] = bool(st.routing and st.routing.converged)
        plain = lambda o: sorted(o) if isinstance(o, set) else str(o)  # noqa: E731
        click.echo(json.dumps(doc, default=plain, indent=2))
    else:
        _print_status(st)
    if st.routing is None or not st.routing.converged:
        sys.exit(1)


@lab.command(name="exec", context_settings={"ignore_unknown_options": True})
@_lab_options
@click.argument("node")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@_user_errors
def exec_(name: str, state_dir: Path | None, node: str, argv: tuple[str, ...]) -> None:
    """Run a command in NODE's network (and, for hosts, private mount) namespace.

    Example: clockmesh lab exec h1-1 -- ip -br addr
    """
    try:
        rc = _make_lab(name, state_dir).exec(node, list(argv)).returncode
    except FileNotFoundError as exc:
        raise click.ClickException(f"{exc.filename}: command not found") from None
    sys.exit(rc)


@lab.command(name="inventory")
@_lab_options
@_user_errors
def inventory_(name: str, state_dir: Path | None) -> None:
    """Print the path of the lab's Ansible inventory."""
    the_lab = _make_lab(name, state_dir)
    if not the_lab.inventory_path.exists():
        raise click.ClickException(
            f"{the_lab.inventory_path}: not found (is lab {name!r} up? `clockmesh lab up --name {name}`)"
        )
    click.echo(str(the_lab.inventory_path))


@lab.command()
@_lab_options
@click.argument("link")
@click.option(
    "--down", "down_", default="3s", show_default=True, help="How long the link stays down."
)
@click.option(
    "--up", "up_", default="2s", show_default=True, help="How long it stays up between flaps."
)
@click.option(
    "--count",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Flaps (0 = until `lab heal`).",
)
@click.option("--background", is_flag=True, help="Detach; `clockmesh lab heal` stops it.")
@_user_errors
def flap(
    name: str, state_dir: Path | None, link: str, down_: str, up_: str, count: int, background: bool
) -> None:
    """Set LINK (e.g. leaf1-spine2, h1-1-leaf1) down and up COUNT times."""
    from lab import faults

    the_lab = _make_lab(name, state_dir)
    down_s, up_s = parse_duration(down_, "--down"), parse_duration(up_, "--up")
    if background:
        pid = faults.flap_background(the_lab, link, down_s, up_s, count)
        click.echo(f"flapping {link} in the background (pid {pid}); stop with `clockmesh lab heal`")
        return
    done = faults.flap(the_lab, link, down_s, up_s, count)
    click.echo(f"{link}: flapped {done} time(s), link up")


@lab.command()
@_lab_options
@click.argument("link")
@click.option(
    "--rate", default="50mbit", show_default=True, help="tbf rate (tc syntax: 50mbit, 800kbit)."
)
@click.option(
    "--direction",
    type=click.Choice(["a2b", "b2a", "both"]),
    default="a2b",
    show_default=True,
    help="a2b = host->leaf / leaf->spine egress; b2a the reverse.",
)
@click.option("--buffer", "buffer_", default=None,
              help="The queue's depth in time (e.g. 500us): a switch's shallow buffer, "
              "filled and drained by the load's bursts, dropping beyond; at least two full frames "
              "(a shorter one is raised to that, and said so). Default 50 ms.")  # fmt: skip
@_user_errors
def congest(
    name: str, state_dir: Path | None, link: str, rate: str, direction: str, buffer_: str | None
) -> None:
    """Shape LINK with tbf and push UDP load hashed onto it (stop with `lab heal`)."""
    from lab import capacity, faults

    buffer_us = parse_duration(buffer_, "--buffer") * 1e6 if buffer_ else None
    for rec in faults.congest(_make_lab(name, state_dir), link, rate, direction,
                              buffer_us=buffer_us):  # fmt: skip
        # the queue tbf holds: at least capacity's least, so a --buffer under that is raised
        held = rec.get("queue_us")
        raised = held and held > (buffer_us or 0) + 1
        least = f" (raised to the least: {capacity.MIN_QUEUE} full frames)" if raised else ""
        click.echo(
            f"{rec['link']} {rec['direction']}: tbf {rec['rate']} on {rec['node']}:{rec['interface']}"
            f"{f', queue {held} µs' if held else ''}{least}, "
            f"load {rec['src']}->{rec['dst']} sport {rec['sport']} at {rec['pps']} pkt/s (pid {rec['pid']})"
        )


@lab.command()
@_lab_options
@click.argument("src")
@click.argument("dst")
@click.option("--rate", default="50mbit", show_default=True,
              help="The links' capacity: the load is 1.5x this over each spine.")  # fmt: skip
@click.option("--dscp", type=click.IntRange(0, 63), default=0, show_default=True,
              help="26: the RDMA class of `lab capacity` (contends with jobs and probes).")  # fmt: skip
@_user_errors
def bulk(name: str, state_dir: Path | None, src: str, dst: str, rate: str, dscp: int) -> None:
    """Bulk traffic from host SRC to host DST over every spine (stop with `lab heal`):
    with `lab capacity`, every path between their racks queues (best effort by default)."""
    from lab import faults

    for rec in faults.bulk(_make_lab(name, state_dir), src, dst, rate, dscp=dscp):
        click.echo(f"{rec['link']}: load {rec['src']}->{rec['dst']} sport {rec['sport']} at "
                   f"{rec['pps']} pkt/s, DSCP {dscp} (pid {rec['pid']})")  # fmt: skip


@lab.command()
@_lab_options
@click.argument("link")
@click.option("--direction", type=click.Choice(["a2b", "b2a"]), default="a2b",
              show_default=True, help="a2b = leaf->spine, b2a = spine->leaf.")  # fmt: skip
@click.option("--rate", default="50mbit", show_default=True,
              help="The links' capacity (lab capacity): the load is 1.3x this.")  # fmt: skip
@click.option("--dscp", type=click.IntRange(0, 63), default=26, show_default=True,
              help="26: the RDMA class, as another job's RoCE v2 traffic.")  # fmt: skip
@_user_errors
def saturate(
    name: str, state_dir: Path | None, link: str, direction: str, rate: str, dscp: int
) -> None:
    """Fill one direction of LINK and no other queue (stop with `lab heal`): with
    `lab capacity --buffer`, sub-millisecond contention, drops beyond the buffer."""
    from lab import loadgen

    for rec in loadgen.saturate(_make_lab(name, state_dir), link, direction, rate, dscp):
        click.echo(f"{rec['link']} {direction}: load {rec['src']}->{rec['dst']} sport "
                   f"{rec['sport']} at {rec['pps']} pkt/s, DSCP {dscp} (pid {rec['pid']})")  # fmt: skip


@lab.command(name="drop")
@_lab_options
@click.argument("switch")
@click.option("--to", "to", multiple=True, metavar="HOST",
              help="Drop what SWITCH forwards to this host (repeatable).")  # fmt: skip
@click.option("--share", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0,
              show_default=True, help="Share of the flows (5-tuple hash) dropped.")  # fmt: skip
@click.option("--toward", metavar="NODE", default=None,
              help="With --packets: the neighbour whose port loses them.")  # fmt: skip
@click.option("--packets", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=None, help="Share of the packets SWITCH sends out its port --toward "
              "NODE lost at random (a bad optic), e.g. 0.02.")  # fmt: skip
@_user_errors
def drop_cmd(name: str, state_dir: Path | None, switch: str, to: tuple[str, ...],
             share: float, toward: str | None, packets: float | None) -> None:  # fmt: skip
    """Make SWITCH silently drop traffic while its links and BGP stay up (stop with `lab
    heal`): everything towards --to HOST (a blackhole /32 in its kernel table), or --share
    of the flows (towards HOST, or all), by nftables hashing the 5-tuple; or --packets of
    what it sends out its port --toward NODE, at random (nftables numgen)."""
    from lab import faults

    if (toward is None) != (packets is None):
        raise click.UsageError("--toward and --packets go together")
    if packets is not None:
        if to or share < 1.0:
            raise click.UsageError("--packets drops at a port: not with --to or --share")
        rec = faults.lossy_port(_make_lab(name, state_dir), switch, str(toward), packets)
        click.echo(f"{switch} drops: {rec['how']}; links and BGP stay up")
        return
    rec = faults.drop(_make_lab(name, state_dir), switch, list(to), share)
    towards = f" towards {', '.join(rec['to'])}" if rec["to"] else ""
    click.echo(f"{switch} drops{towards}: {rec['how']}; links and BGP stay up")


@lab.command(name="capacity")
@_lab_options
@click.option("--rate", default="50mbit", show_default=True,
              help="Capacity of every leaf–spine link, each direction (tc syntax).")  # fmt: skip
@click.option("--dscp", type=click.IntRange(0, 63), default=26, show_default=True,
              help="DSCP of the RDMA traffic class (RoCE v2), served first.")  # fmt: skip
@click.option("--queue", type=click.IntRange(2, 100_000), default=100, show_default=True,
              help="Packets each class may queue (a switch's buffer).")  # fmt: skip
@click.option("--buffer", "buffer_", default=None,
              help="Size each queue in time instead (e.g. 400us, 1ms), in bytes at the rate: "
              "a switch's shallow buffer; a saturated port queues at most this long and drops "
              "beyond. At least 2 full frames at the rate.")  # fmt: skip
@click.option("--off", is_flag=True, help="Remove the capacity: unlimited links again.")
@_user_errors
def capacity_cmd(
    name: str,
    state_dir: Path | None,
    rate: str,
    dscp: int,
    queue: int,
    buffer_: str | None,
    off: bool,
) -> None:
    """Give every leaf–spine link a capacity and an RDMA traffic class (by DSCP), as a
    RoCE fabric has: jobs sharing a link slow each other, RoCE v1 traffic (no IP header,
    so no DSCP) queues behind bulk traffic while RoCE v2 and the probes do not."""
    from lab import capacity

    lab = _make_lab(name, state_dir)
    if off:
        click.echo(f"{capacity.remove(lab)} link ends unlimited again")
        return
    buffer_us = parse_duration(buffer_, "--buffer") * 1e6 if buffer_ else None
    n = capacity.apply(lab, rate, dscp, queue, buffer_us)
    cap = capacity.current(lab)
    held = (f"{cap['buffer_bytes']} bytes ({buffer_} at {rate}, {cap['queue']} full frames)"
            if cap.get("buffer_bytes") else f"{cap['queue']} packets")  # fmt: skip
    click.echo(f"{n} link ends at {rate}, DSCP {dscp} in the RDMA class, queues of {held}")


@lab.command()
@_lab_options
@_user_errors
def heal(name: str, state_dir: Path | None) -> None:
    """Remove every fault: links up, qdiscs removed, load generators and flappers stopped."""
    from lab import faults

    res = faults.heal(_make_lab(name, state_dir))
    click.echo(
        f"lab {name}: stopped {res['stopped']} fault process(es), {res['links_up']} link(s) "
        f"brought up, {res['qdiscs_removed']} qdisc(s) removed, {res['drops_removed']} "
        "silent drop(s) removed"
    )


# ---- lab jobs (lab/jobgen.py; added by the collector work) ----------------------------
@lab.group()
def job() -> None:
    """All-to-all job traffic between lab hosts, reported through the collector's hook."""


@job.command("start")
@_lab_options
@click.argument("job_name", metavar="NAME")
@click.option("--hosts", required=True, help="Comma-separated lab hosts, e.g. h1-1,h2-1,h3-1.")
@click.option("--gid-index", type=int, default=None, help="NCCL_IB_GID_INDEX in the job's env.")
@click.option("--nccl-version", default=None, metavar="X.Y.Z",
              help="Map a libnccl.so.X.Y.Z, as a job of that NCCL version does (default: "
              "none, the job's NCCL version is unknown).")  # fmt: skip
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE",
              help="An NCCL_*/UCX_* variable in the job's environment (repeatable), e.g. "
              "NCCL_IB_TIMEOUT=14.")  # fmt: skip
@click.option("--rate", type=float, default=20.0, show_default=True, help="Messages/s per peer.")
@click.option("--size", type=int, default=1024, show_default=True, help="Message bytes.")
@_user_errors
def job_start(
    name: str,
    state_dir: Path | None,
    job_name: str,
    hosts: str,
    gid_index: int | None,
    nccl_version: str | None,
    env: tuple[str, ...],
    rate: float,
    size: int,
) -> None:
    """Start job NAME: one traffic generator per host, holding the fake RDMA device."""
    from lab import jobgen

    pairs = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.ClickException(f"--env {item!r}: expected KEY=VALUE")
        pairs[key] = value
    try:
        recs = jobgen.start_job(
            _make_lab(name, state_dir),
            job_name,
            [h.strip() for h in hosts.split(",") if h.strip()],
            gid_index,
            rate,
            size,
            nccl_version=nccl_version,
            env=pairs,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    for rec in recs:
        click.echo(f"job {job_name}: {rec['node']} pid {rec['pid']} gid_index {rec['gid_index']} "
                   f"nccl {rec.get('nccl_version') or 'unknown'}")  # fmt: skip


@job.command("stop")
@_lab_options
@click.argument("job_name", metavar="NAME")
@_user_errors
def job_stop(name: str, state_dir: Path | None, job_name: str) -> None:
    """Stop every generator of job NAME."""
    from lab import jobgen

    click.echo(f"job {job_name}: stopped {jobgen.stop_job(_make_lab(name, state_dir), job_name)}")


@job.command("list")
@_lab_options
@_user_errors
def job_list(name: str, state_dir: Path | None) -> None:
    """List the lab's jobs and whether their generators are alive."""
    from lab import jobgen

    for rec in jobgen.list_jobs(_make_lab(name, state_dir)):
        state = "running" if rec["alive"] else "dead"
        click.echo(
            f"{rec['job']} {rec['node']} pid {rec['pid']} gid_index {rec['gid_index']} "
            f"nccl {rec.get('nccl_version') or 'unknown'} {state}"
        )


@lab.group()
def scenario() -> None:
    """Labelled scenarios: random faults with the ground truth, for the detector."""


@scenario.command("run")
@click.option(
    "--seed",
    type=int,
    required=True,
    help="Seeds the fault mix (never reuse eval seeds for training).",
)
@click.option("--minutes", type=click.FloatRange(min=1.0), default=10.0, show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Run directory: store/, truth.json, topology.json, logs.",
)
@click.option("--spines", type=int, default=2, show_default=True)
@click.option("--leaves", type=int, default=3, show_default=True)
@click.option("--hosts-per-leaf", type=int, default=2, show_default=True)
@click.option(
    "--kinds",
    default=None,
    show_default="every kind the scenario generator has (lab.scenario.KINDS)",
    help="Comma list of fault kinds to draw from.",
)
@click.option("--name", default=None, help="Lab name (default sc<seed>); unique per machine.")
@click.option("--buffers/--no-buffers", default=True, show_default=True,
              help="Leaf–spine links at 50 Mbit/s with 500-µs buffers (a switch's shallow "
              "buffer) before the fleet starts; --no-buffers: unlimited links.")  # fmt: skip
@_user_errors
def scenario_run(
    seed: int,
    minutes: float,
    out: Path,
    spines: int,
    leaves: int,
    hosts_per_leaf: int,
    kinds: str | None,
    name: str | None,
    buffers: bool,
) -> None:
    """Build a lab, run a fleet in it, inject a seeded random fault mix, record the truth.

    The lab (named sc<seed> unless --name) is torn down at the end, even on failure; the run directory
    keeps the ops box's store and truth.json for `clockmesh detector eval OUT`.
    """
    from lab import scenario as sc

    kinds = ",".join(sc.KINDS) if kinds is None else kinds
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in chosen if k not in sc.KINDS]
    if unknown or not chosen:
        raise click.ClickException(
            f"--kinds: expected some of {', '.join(sc.KINDS)}, got {kinds!r}"
        )
    if (out / "truth.json").exists():
        raise click.ClickException(f"{out}: already holds a run (truth.json); choose another --out")
    the_lab = Lab(name or f"sc{seed % 10_000_000}", out / "lab")
    the_lab.up(spines, leaves, hosts_per_leaf)
    try:
        truth = sc.Scenario(the_lab, out, seed, log=click.echo, buffers=buffers).run(
            minutes, chosen
        )
    except (RuntimeError, OSError, ValueError) as exc:
        raise click.ClickException(f"scenario {seed}: {exc} (logs in {out})") from None
    finally:
        the_lab.down()
    click.echo(f"truth: {truth}")
