"""``clockmesh live``: fleet health at a glance, from the ingest daemon's ``/v1/live``.

One row per host: how fresh its telemetry is, how many buddies it probes, what share of
the probes it sent and of those sent to it were lost, the raw (not yet clock-corrected)
one-way delay, and its verdict: the culprit of an open anomaly (its own link), affected
by one (all its loss or queueing is explained), lossy, slow (a path of it queued beyond
that path's own healthy delay, as the detector judged it), stale, silent or ok. Meant for
the first minute after a deploy and for a 3 a.m. "is the fleet even reporting, and who is
at fault?".
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml

from analytics.detect import attribution
from analytics.detect.anomalies import quiet_note
from analytics.ingest import endpoints


@dataclass(frozen=True)
class HostHealth:
    host: str
    last_batch_age_s: float
    buddies: int  # distinct hosts it probes (pairs it sends on)
    sent: int
    received: int  # of its probes, how many arrived (at any buddy)
    loss: float  # the worse of loss_sent and loss_received
    loss_sent: float  # of the probes it sent, lost
    loss_received: float  # of the probes sent to it, lost
    owd_raw_p50_us: float | None
    status: str  # culprit | stale | silent | lossy | slow | affected | ok
    culprit_of: list[str] = field(default_factory=list)  # open anomalies naming its link
    affected_by: list[str] = field(default_factory=list)  # open anomalies explaining its loss
    queue_us: float = 0.0  # its worst unexplained queue beyond a path's healthy delay
    queue_peer: str = ""  # ... on its pair with this host
    probe_age_s: float | None = None  # since the last batch with probes it sent

    @property
    def healthy(self) -> bool:
        return self.status == "ok"


def summarise(live: dict[str, Any], stale_s: float | None = None) -> list[HostHealth]:
    """Per-host health from a /v1/live document: loss judged in both directions, and
    attributed to the open anomalies that explain it (analytics/detect/attribution.py).
    ``stale_s``: by default :func:`attribution.stale_after` the shipping interval the
    daemon advises."""
    if stale_s is None:
        stale_s = attribution.stale_after((live.get("ingest") or {}).get("advised_roll_s"))
    pairs = live.get("pairs", [])
    names = [str(h["host"]) for h in live.get("hosts", [])]
    # The daemon places every open anomaly (it knows the racks): each pair's explained_by.
    # Without it (an older daemon), host links are still placed from their evidence.
    given = [p.get("explained_by") for p in pairs]
    explained = given if all(isinstance(x, list) for x in given) else None
    _, losses = attribution.attribute(names, pairs, _open(live), {}, {}, explained=explained)
    by_src: dict[str, list[dict[str, Any]]] = {}
    for pair in pairs:
        by_src.setdefault(str(pair["src"]), []).append(pair)
    rows = []
    for host in live.get("hosts", []):
        name = str(host["host"])
        mine = by_src.get(name, [])
        loss = losses[name]
        delays = sorted(p["owd_raw_p50_us"] for p in mine if p.get("owd_raw_p50_us") is not None)
        age = float(host["last_batch_age_s"])
        probe_age = attribution.probe_age(host)
        rows.append(
            HostHealth(
                host=name,
                last_batch_age_s=age,
                buddies=len({p["dst"] for p in mine}),
                sent=loss.sent,
                received=loss.sent - loss.lost,
                loss=loss.worst,
                loss_sent=loss.loss_sent,
                loss_received=loss.loss_received,
                owd_raw_p50_us=delays[len(delays) // 2] if delays else None,
                status=attribution.verdict(
                    loss, age, attribution.host_stale_after(host, stale_s), probe_age_s=probe_age
                ),
                culprit_of=list(loss.culprit_of),
                affected_by=sorted(loss.affected_by),
                queue_us=loss.queue_us,
                queue_peer=loss.queue_peer,
                probe_age_s=probe_age,
            )
        )
    return rows


def _open(live: dict[str, Any]) -> list[dict[str, Any]]:
    anomalies = live.get("anomalies")
    open_ = anomalies.get("open", []) if isinstance(anomalies, dict) else []
    return [a for a in open_ if isinstance(a, dict)]


def _because(r: HostHealth, where: dict[str, str], closed: frozenset[str] = frozenset()) -> str:
    """Whose fault, naming the anomaly and its place: ``where`` is id -> link or job;
    ``closed``: ids of anomalies closed within the live window (their loss still counts
    there, so they still explain it, and say they are closed)."""

    def named(ids: list[str]) -> str:
        return ", ".join(
            (f"{where[i]} ({i}" if where.get(i) else f"({i}")
            + (", closed)" if i in closed else ")")
            for i in ids
        )

    if r.culprit_of:
        return "its own link " + named(r.culprit_of)
    if r.affected_by and r.status == "affected":
        return "affected by " + named(r.affected_by)
    if r.status == "slow":
        queue = attribution.queue_text(r.queue_us)
        return f"queued {queue} beyond its healthy delay (with {r.queue_peer})"
    if r.status == "silent":
        if r.sent and r.probe_age_s is not None:  # its earlier probes are still counted
            return f"has sent no probes for {r.probe_age_s:.0f} s (its batches arrive)"
        return "sends no probes (its batches arrive)"
    return ""


def render(rows: list[HostHealth], live: dict[str, Any], url: str) -> str:
    header = (f"{'HOST':<12} {'STATUS':<8} {'LAST':>7} {'BUDDIES':>7} {'SENT':>8} "
              f"{'LOSS OUT':>8} {'LOSS IN':>8} {'RAW OWD p50':>12}  WHY")  # fmt: skip
    lines = [f"fleet health from {url} (last {live.get('live_window_s', '?')} s)", header]
    anomalies = live.get("anomalies") or {}
    open_ = _open(live)
    where = {str(a.get("anomaly_id")): attribution.place_name(a)
             for a in [*open_, *(anomalies.get("recently_closed") or [])]}  # fmt: skip
    closed = frozenset(where) - {str(a.get("anomaly_id")) for a in open_}
    for r in rows:
        owd = f"{r.owd_raw_p50_us:.1f} µs" if r.owd_raw_p50_us is not None else "-"
        lines.append(
            f"{r.host:<12} {r.status:<8} {r.last_batch_age_s:>6.1f}s {r.buddies:>7} {r.sent:>8} "
            f"{r.loss_sent:>8.2%} {r.loss_received:>8.2%} {owd:>12}  {_because(r, where, closed)}".rstrip()
        )
    healthy = sum(r.healthy for r in rows)
    count = {s: sum(r.status == s for r in rows) for s in ("culprit", "affected")}
    failing = len(rows) - healthy - count["affected"]
    store = live.get("store", {})
    lines.append(
        f"{healthy}/{len(rows)} hosts healthy, {failing} failing"
        + (f" ({count['culprit']} culprit)" if count["culprit"] else "")
        + f", {count['affected']} affected by an anomaly (open or closed in the window); store "
        + ("accepting" if store.get("accepting", True) else f"NOT accepting: {store.get('reason')}")
    )
    lines.append("LOSS OUT = of the probes it sent, LOSS IN = of the probes sent to it; "
                 "raw OWD = receiver clock minus sender clock, before clock solving")  # fmt: skip
    if not open_:
        lines.append("no open anomalies")
    else:
        lines.append(f"open anomalies: {len(open_)}")
        clear_s = anomalies.get("clear_s")
        for a in open_:
            place = attribution.place_name(a)  # a silent drop with no link: its switch
            quiet = quiet_note(a, clear_s)
            lines.append(
                f"  {a.get('kind', '?'):<14} {place or '-':<14} score {a.get('score', 0):.2f}  "
                f"{a.get('anomaly_id', '')}  {a.get('summary', '')}"
                + (f"  {quiet}" if quiet else "")
            )
    return "\n".join(lines)


def open_anomalies(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Open anomalies of ``kind`` in a /v1/live document."""
    anomalies = doc.get("anomalies")
    open_ = anomalies.get("open", []) if isinstance(anomalies, dict) else []
    return [a for a in open_ if isinstance(a, dict) and a.get("kind") == kind]


def url_from_inventory(path: Path) -> str:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise click.ClickException(f"{path}: file not found") from None
    except (OSError, yaml.YAMLError) as exc:
        raise click.ClickException(
            f"{path}: cannot read inventory: {exc}".splitlines()[0]
        ) from None
    urls = ((data.get("all") or {}).get("vars") or {}).get("clockmesh_ingest_urls")
    if urls:  # two ops boxes (docs/deploy.md "Two ops boxes"): the first that answers
        if not isinstance(urls, list) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls
        ):
            raise click.ClickException(
                f"{path}: all.vars.clockmesh_ingest_urls: expected a list of http(s) URLs"
            )
        return ",".join(urls)
    url = ((data.get("all") or {}).get("vars") or {}).get("clockmesh_ingest_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise click.ClickException(
            f"{path}: all.vars.clockmesh_ingest_url: expected an http(s) URL of the ops box"
        )
    return url


def fetch_live(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    endpoint = url.rstrip("/") + "/v1/live"
    with urllib.request.urlopen(endpoint, timeout=timeout_s) as response:
        return json.load(response)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", multiple=True,
              help="Ingest daemon base URL, e.g. http://198.19.0.2:8470; two ops boxes: repeat"
              " it or a comma list (the first that answers is read).")  # fmt: skip
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the URL from an inventory's all.vars.clockmesh_ingest_url instead.",
)
@click.option("--wait-hosts", type=int, default=0, help="Wait until this many hosts are healthy.")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=60.0,
    show_default=True,
    help="Give up waiting after this many seconds (exit 1).",
)
@click.option(
    "--wait-anomaly",
    type=click.Choice(["flapping_link", "roce_v1_job", "contention", "silent_drop"]),
    help="Wait until the detector has an open anomaly of this class.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the per-host rows as JSON.")
def live(
    url: tuple[str, ...],
    inventory: Path | None,
    wait_hosts: int,
    timeout_s: float,
    wait_anomaly: str | None,
    as_json: bool,
) -> None:
    """Show fleet health now: telemetry freshness, probe loss and raw delay per host,
    and the detector's open anomalies."""
    if bool(url) == bool(inventory):
        raise click.UsageError("give exactly one of --url or --inventory")
    base = ",".join(url) or url_from_inventory(inventory)  # type: ignore[arg-type]
    pick = endpoints.FirstAnswering(endpoints.split(base), fetch_live)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            doc = pick() if len(pick.targets) > 1 else fetch_live(base)
            rows = summarise(doc)
        except (urllib.error.URLError, OSError, ValueError) as exc:  # none answers: ConnectionError
            error = f"{base}/v1/live: {getattr(exc, 'reason', exc)}"
            if len(pick.targets) > 1:  # each box's error, /v1/live of each
                error = f"no ops box answers /v1/live: {exc}"
            doc, rows = {}, []
        else:
            error = ""
        done = not wait_hosts or sum(r.healthy for r in rows) >= wait_hosts
        found = not wait_anomaly or bool(open_anomalies(doc, wait_anomaly))
        if (done and found) or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if error:
        raise click.ClickException(error)
    if as_json:
        if len(pick.targets) > 1:
            click.echo(f"read from {pick.note()}", err=True)  # which box (stdout stays JSON)
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        click.echo(render(rows, doc, pick.note() or base))
    if not found:
        raise click.ClickException(f"no open {wait_anomaly} anomaly after {timeout_s:.0f} s")
    if not done:
        missing = wait_hosts - sum(r.healthy for r in rows)
        raise click.ClickException(
            f"only {wait_hosts - missing} of {wait_hosts} hosts healthy after {timeout_s:.0f} s"
        )
