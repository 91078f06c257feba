"""``clockmesh live``: fleet health at a glance, from the ingest daemon's ``/v1/live``.

One row per host: how fresh its telemetry is, how many buddies it probes, what share
of its probes arrive, and the raw (not yet clock-corrected) one-way delay. Meant for
the first minute after a deploy and for a 3 a.m. "is the fleet even reporting?".
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import yaml

STALE_S = 5.0  # a host whose last batch is older than this is stale
LOSSY = 0.01  # more than 1 % of a host's probes lost is worth a look


@dataclass(frozen=True)
class HostHealth:
    host: str
    last_batch_age_s: float
    buddies: int  # distinct hosts it probes (pairs it sends on)
    sent: int
    received: int  # of its probes, how many arrived (at any buddy)
    loss: float
    owd_raw_p50_us: float | None
    status: str  # ok | stale | lossy | silent

    @property
    def healthy(self) -> bool:
        return self.status == "ok"


def summarise(live: dict[str, Any], stale_s: float = STALE_S) -> list[HostHealth]:
    """Per-host health from a /v1/live document."""
    by_src: dict[str, list[dict[str, Any]]] = {}
    for pair in live.get("pairs", []):
        by_src.setdefault(str(pair["src"]), []).append(pair)
    rows = []
    for host in live.get("hosts", []):
        name = str(host["host"])
        pairs = by_src.get(name, [])
        sent = sum(int(p["sent"]) for p in pairs)
        received = sum(int(p["received"]) for p in pairs)
        loss = 1.0 - received / sent if sent else 0.0
        delays = sorted(p["owd_raw_p50_us"] for p in pairs if p.get("owd_raw_p50_us") is not None)
        age = float(host["last_batch_age_s"])
        if age > stale_s:
            status = "stale"
        elif not sent:
            status = "silent"
        elif loss > LOSSY:
            status = "lossy"
        else:
            status = "ok"
        rows.append(
            HostHealth(
                host=name,
                last_batch_age_s=age,
                buddies=len({p["dst"] for p in pairs}),
                sent=sent,
                received=received,
                loss=loss,
                owd_raw_p50_us=delays[len(delays) // 2] if delays else None,
                status=status,
            )
        )
    return rows


def render(rows: list[HostHealth], live: dict[str, Any], url: str) -> str:
    header = f"{'HOST':<12} {'STATUS':<7} {'LAST':>7} {'BUDDIES':>7} {'SENT':>8} {'RECV':>8} {'LOSS':>7} {'RAW OWD p50':>12}"
    lines = [f"fleet health from {url} (last {live.get('live_window_s', '?')} s)", header]
    for r in rows:
        owd = f"{r.owd_raw_p50_us:.1f} µs" if r.owd_raw_p50_us is not None else "-"
        lines.append(
            f"{r.host:<12} {r.status:<7} {r.last_batch_age_s:>6.1f}s {r.buddies:>7} {r.sent:>8} "
            f"{r.received:>8} {r.loss:>6.2%} {owd:>12}"
        )
    healthy = sum(r.healthy for r in rows)
    store = live.get("store", {})
    lines.append(
        f"{healthy}/{len(rows)} hosts healthy; store {'accepting' if store.get('accepting', True) else 'NOT accepting: ' + str(store.get('reason'))}"
    )
    lines.append("raw OWD = receiver clock minus sender clock, before clock solving")
    anomalies = live.get("anomalies")
    if isinstance(anomalies, dict):
        open_ = anomalies.get("open") or []
        if not open_:
            lines.append("no open anomalies")
        else:
            lines.append(f"open anomalies: {len(open_)}")
            for a in open_:
                # a silent drop of a whole switch names no single link: the switch
                where = (
                    a.get("link")
                    or a.get("job_id")
                    or (a.get("evidence") or {}).get("switch")
                    or "-"
                )
                lines.append(
                    f"  {a.get('kind', '?'):<14} {where:<14} score {a.get('score', 0):.2f}  "
                    f"{a.get('anomaly_id', '')}  {a.get('summary', '')}"
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
@click.option("--url", help="Ingest daemon base URL, e.g. http://198.19.0.2:8470.")
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
    url: str | None,
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
    base = url or url_from_inventory(inventory)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            doc = fetch_live(base)
            rows = summarise(doc)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            doc, rows, error = {}, [], f"{base}/v1/live: {getattr(exc, 'reason', exc)}"
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
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        click.echo(render(rows, doc, base))
    if not found:
        raise click.ClickException(f"no open {wait_anomaly} anomaly after {timeout_s:.0f} s")
    if not done:
        missing = wait_hosts - sum(r.healthy for r in rows)
        raise click.ClickException(
            f"only {wait_hosts - missing} of {wait_hosts} hosts healthy after {timeout_s:.0f} s"
        )
