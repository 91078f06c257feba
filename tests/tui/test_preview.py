"""The remediation preview as a person reads it (tui/preview.py): a real
``ansible-playbook --check --diff`` run on this machine (local connection) whose tasks
change a file on one host, print a switch's BGP line on another, and skip the rest."""

from __future__ import annotations

import sys
from pathlib import Path

from textual.widgets import Log

from analytics.remediate import runner
from tests.tui.sample import sample_live
from tests.tui.test_tui import Feed, _app, _until
from tui import preview
from tui.remediation import RemediationScreen

PLAYBOOK = """
- name: Remediate
  hosts: all
  gather_facts: false
  tasks:
    - name: A branch that applies nowhere
      ansible.builtin.debug: {{msg: never}}
      when: false
    - name: Point NCCL_IB_GID_INDEX in nccl.conf at the index
      ansible.builtin.lineinfile:
        path: {conf}
        regexp: '^NCCL_IB_GID_INDEX='
        line: NCCL_IB_GID_INDEX=3
      when: inventory_hostname == 'h1-1'
    - name: Preview the change (check mode)
      ansible.builtin.debug:
        msg: "{{{{ inventory_hostname }}}}: router bgp 65001: neighbor 198.18.128.1 shutdown"
      changed_when: true
      when: inventory_hostname == 'leaf1'
    - name: Report
      ansible.builtin.set_fact: {{done: true}}
"""


def _check_run(tmp_path: Path) -> runner.RunResult:
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_IB_HCA=mlx5\nNCCL_IB_GID_INDEX=0\n")
    (tmp_path / "pb.yml").write_text(PLAYBOOK.format(conf=conf))
    local = f"{{ansible_connection: local, ansible_python_interpreter: {sys.executable}}}"
    (tmp_path / "inv.yml").write_text(
        "all:\n  hosts:\n" + "".join(f"    {h}: {local}\n" for h in ("h1-1", "leaf1", "h2-1"))
    )
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i",
            str(tmp_path / "inv.yml"), str(tmp_path / "pb.yml"), "--check", "--diff"]  # fmt: skip
    result = runner.stream(argv, lambda _: None)
    assert result.ok, "\n".join(result.lines)
    assert conf.read_text().endswith("INDEX=0\n")  # check mode: nothing written
    return result


def test_the_change_leads_and_skipped_tasks_are_folded(tmp_path: Path) -> None:
    result = _check_run(tmp_path)
    p = preview.parse(result.lines)
    assert [(c.host, c.task) for c in p.changes] == [
        ("h1-1", "Point NCCL_IB_GID_INDEX in nccl.conf at the index"),
        ("leaf1", "Preview the change (check mode)"),
    ]
    assert p.changes[0].lines[-2:] == ["-NCCL_IB_GID_INDEX=0", "+NCCL_IB_GID_INDEX=3"]
    assert p.changes[1].lines == ["leaf1: router bgp 65001: neighbor 198.18.128.1 shutdown"]
    assert p.skipped_tasks == 1 and p.skipped_results == 3 + 2 + 2
    text = preview.render(p)
    assert text[0] == "== the change, on 2 host(s) or switch(es): h1-1, leaf1"
    assert text[1:3] == ["h1-1 — Point NCCL_IB_GID_INDEX in nccl.conf at the index",
                         f"    --- before: {tmp_path / 'nccl.conf'} (content)"]  # fmt: skip
    assert not any(line.startswith("skipping:") for line in text)
    assert not any("A branch that applies nowhere" in line for line in text)
    assert "1 task(s) skipped on every host, 7 skipped result(s) folded away" in "\n".join(text)
    assert any(line.startswith("PLAY RECAP") for line in text)  # the log is still there


async def test_the_tui_preview_shows_the_change_first(tmp_path: Path) -> None:
    result = _check_run(tmp_path)
    live = sample_live()
    app = _app(Feed(live))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        screen = RemediationScreen(live["anomalies"]["open"][0])
        app.push_screen(screen)
        await pilot.pause(0.1)
        screen._finished(True, True, result.changed, result.lines)
        out = screen.query_one("#output", Log)
        await _until(pilot, lambda: out.line_count > 5, "the preview in the log")
        lines = list(out.lines)
        assert lines[0].startswith("== the change, on 2 host(s) or switch(es)")
        assert "    +NCCL_IB_GID_INDEX=3" in lines[:10]
        assert lines[-1] == "== the real run would change: {'h1-1': 1, 'leaf1': 1}"
        assert not any(line.startswith("skipping:") for line in lines)
