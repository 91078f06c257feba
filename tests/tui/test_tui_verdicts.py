"""The TUI's colours are ``clockmesh live``'s verdicts, on any answer (issue 27: one
definition per fact). Both read one ``/v1/live`` document annotated by the daemon's
attribution (analytics/detect/attribution.py); the TUI then builds its own fleet model
(tui/data.fleet). Hypothesis draws fleets with stale hosts, hosts that send nothing,
lost and queued pairs, and open anomalies of every place (a host's own link, a leaf gone
whole, a leaf–spine link, one direction of it, a switch dropping towards a host) and
checks that every host gets the same verdict in both."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.detect import attribution
from analytics.ingest.live_cli import summarise
from tests.tui.sample import sample_live, sample_racks, sample_topology
from tui.data import fleet

# clockmesh live's status -> the TUI's state (the TUI greys both hosts it does not hear
# from and hosts that send nothing: neither is measured)
SAME = {"culprit": "culprit", "stale": "silent", "silent": "silent", "lossy": "loss",
        "slow": "slow", "affected": "affected", "ok": "ok"}  # fmt: skip
RACKS = sample_racks()
HOSTS = sorted(RACKS)
LEAVES = sorted(set(RACKS.values()))


def _anomaly(n: int, kind: str, link: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return {"anomaly_id": f"a-{n}", "kind": kind, "link": link, "job_id": "",
            "score": 0.9, "summary": link, "evidence": evidence}  # fmt: skip


@st.composite
def anomalies(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(draw(st.integers(0, 3))):
        what = draw(st.sampled_from(["host", "leaf", "fabric", "direction", "drop"]))
        host, leaf = draw(st.sampled_from(HOSTS)), draw(st.sampled_from(LEAVES))
        spine = draw(st.sampled_from(["spine1", "spine2"]))
        if what == "host":
            out.append(_anomaly(n, "flapping_link", f"{host}-{RACKS[host]}", {"host": host}))
        elif what == "leaf":
            cut = [h for h in HOSTS if RACKS[h] == leaf]
            out.append(_anomaly(n, "flapping_link", leaf,
                                {"switch": leaf, "hosts_cut_off": cut}))  # fmt: skip
        elif what == "fabric":
            out.append(_anomaly(n, "flapping_link", f"{leaf}-{spine}", {}))
        elif what == "direction":
            way = draw(st.sampled_from(["leaf→spine", "spine→leaf"]))
            out.append(_anomaly(n, "contention", f"{leaf}-{spine}", {"direction": way}))
        else:
            froms = [r for r in LEAVES if r != RACKS[host]]
            out.append(_anomaly(n, "silent_drop", f"{RACKS[host]}-{spine}",
                                {"switch": spine, "destinations": [host],
                                 "from_racks": froms}))  # fmt: skip
    return out


@settings(max_examples=300, deadline=None)
@given(data=st.data(), open_=anomalies())
def test_every_host_gets_the_same_verdict_in_the_tui_and_clockmesh_live(
    data: st.DataObject, open_: list[dict[str, Any]]
) -> None:
    live = sample_live(anomalies=0)
    for h in live["hosts"]:
        h["last_batch_age_s"] = data.draw(st.sampled_from([0.4, 0.4, 3.0, 30.0]))
        # its batches arrive without the probes it sends (a firewall fails their sends)
        h["last_probe_age_s"] = data.draw(st.sampled_from([None, 0.4, 0.4, 3.0, 12.0]))
    quiet = data.draw(st.sets(st.sampled_from(HOSTS), max_size=2))
    live["pairs"] = [p for p in live["pairs"] if p["src"] not in quiet]
    for p in live["pairs"]:
        lost = data.draw(st.sampled_from([0, 0, 0, 3, 12, 600]))  # 0.5 %, 2 %, all
        p.update(received=p["sent"] - lost, loss=lost / p["sent"],
                 queue_us=data.draw(st.sampled_from([None, None, None, 61.0, 4_600.0])))  # fmt: skip
    live["anomalies"]["open"] = open_
    attribution.annotate(live["hosts"], live["pairs"], open_, RACKS,
                         attribution.link_leaves(sample_topology()))  # fmt: skip
    cli = {r.host: SAME[r.status] for r in summarise(live)}
    tui = {t.host: t.state for t in fleet(live, RACKS).tiles}
    assert tui == cli, {h: (tui[h], cli[h]) for h in HOSTS if tui[h] != cli[h]}
