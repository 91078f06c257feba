"""``clockmesh tui``: the Textual terminal UI."""

from __future__ import annotations

from pathlib import Path

import click

from analytics.cli_options import store_option, topology_option
from analytics.ingest import endpoints


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", default="http://127.0.0.1:8470", show_default=True,
              help="Ingest daemon base URL (/v1/live over HTTP: runs from the controller too);"
              " two ops boxes: a comma list, the first that answers is read.")  # fmt: skip
@store_option("Store for history, audits and remediation (read-only); two ops boxes: a comma"
              " list, the first that answers is read.")  # fmt: skip
@topology_option("Topology: racks for grouping, links for remediation.")
@click.option("-i", "--inventory", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Ansible inventory: enables remediation playbooks.")  # fmt: skip
@click.option("--refresh", "refresh_s", type=click.FloatRange(min=0.2), default=1.0,
              show_default=True, help="Seconds between /v1/live fetches.")  # fmt: skip
@click.option("--amber-us", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="A NIC is amber when the detector judged a path of it queued beyond the "
                   "path's own healthy delay by more than this (µs); 0: every such path.")  # fmt: skip
@click.option("--red-loss", type=click.FloatRange(min=0, max=1), default=0.01, show_default=True,
              help="Loss (a fraction, either direction) above which a NIC is red; the "
                   "default is clockmesh live's 'lossy'.")  # fmt: skip
@click.option("--silent-s", type=click.FloatRange(min=1), default=None,
              help="Seconds without a batch after which a NIC is grey (silent). Default: "
                   "clockmesh live's 'stale' — 5 s, or 2.5 times the shipping interval the "
                   "ops box advises or the host's own when longer (a large fleet ships less "
                   "often).")  # fmt: skip
def tui(url: str, store: Path, topology: Path, inventory: Path | None, refresh_s: float,
        amber_us: float, red_loss: float, silent_s: float | None) -> None:  # fmt: skip
    """The fleet at a glance: NICs by rack, anomalies, jobs, audit, drill-downs (host,
    pair, link, job) and remediation with a check-mode preview.

    Keys: f fleet · a anomalies · j jobs · u audit · / filter · enter drill down (fleet,
    jobs) or remediate (anomalies) · d an anomaly's link or job · x a pair's other
    direction · esc back · ? help · t light/dark · ctrl+p command palette · q quit.
    """
    from analytics.topology import TopologyError, read_topology, search_words
    from analytics.topology import racks as racks_of
    from tui.app import ClockmeshApp
    from tui.data import LiveSource, Thresholds

    topo = topology if topology.is_file() else None
    try:
        doc = read_topology(topo) if topo is not None else None
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None
    racks, words = racks_of(doc), search_words(doc)
    source, store, say = endpoints.tui_sources(url, store, LiveSource)  # several ops boxes
    app = ClockmeshApp(
        source, racks=racks, search_words=words, store=store if store.is_dir() else None,
        inventory=inventory, topology=topo, refresh_s=refresh_s,
        thresholds=Thresholds(amber_us=amber_us, red_loss=red_loss, silent_s=silent_s),
    )  # fmt: skip
    say(app)
    app.run()
