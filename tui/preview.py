"""A check-mode preview as a person reads it: the change first, the noise folded away.

``ansible-playbook --check --diff`` prints every task of every play for every host —
preflight, facts, and most of all ``skipping: [host]`` lines for the roles' branches that
do not apply. The one thing the preview is for (which lines on which host or switch
would change) is a few lines somewhere in the middle. :func:`parse` reads the default
callback's output (``callback_result_format = yaml``, ansible.cfg) into the changes —
each host's ``--- before`` / ``+++ after`` diff, or the message a role prints for a change
it cannot diff (a switch's BGP line) — and :func:`render` puts them first, then the log
without the skipped tasks. No Textual here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_TASK = re.compile(r"^TASK \[(.*)\] \**$")
_PLAY = re.compile(r"^PLAY( RECAP)? ")
_RESULT = re.compile(r"^(changed|ok|skipping|fatal|failed|included): \[([^\]]+)\]")


@dataclass
class Change:
    host: str  # the host or switch (inventory name)
    task: str
    lines: list[str] = field(default_factory=list)  # the diff, or the role's message


@dataclass
class Preview:
    changes: list[Change] = field(default_factory=list)
    skipped_tasks: int = 0  # tasks every host skipped (folded away whole)
    skipped_results: int = 0  # skipping: [host] lines (folded away)
    rest: list[str] = field(default_factory=list)  # the log without them


def parse(lines: Iterable[str]) -> Preview:
    """The changes and the folded log of one ``--check --diff`` run's output."""
    out = Preview()
    task = ""
    block: list[str] = []  # the current task's lines for the log, header first
    shown = False  # the current task has a result other than skipping
    diff: list[str] = []  # a diff printed before the ``changed: [host]`` it belongs to
    in_diff = False
    msg_of: Change | None = None  # a changed result whose indented message follows

    def close_task() -> None:
        nonlocal block, shown
        if block:
            if shown:
                out.rest.extend(block)
            else:
                out.skipped_tasks += 1
        block, shown = [], False

    for line in lines:
        m = _TASK.match(line)
        if m or _PLAY.match(line):
            close_task()
            task = m[1] if m else ""
            msg_of, in_diff = None, False
            if m:
                block = [line]
            else:
                out.rest.append(line)
            continue
        if line.startswith("--- before"):
            in_diff, diff = True, [line]
            continue
        if in_diff:
            if line.strip():
                diff.append(line)
                continue
            in_diff = False
            continue
        r = _RESULT.match(line)
        if r:
            msg_of = None
            kind, host = r[1], r[2]
            if kind == "skipping":
                out.skipped_results += 1
                continue
            shown = True
            if kind == "changed":
                change = Change(host, task, diff)
                out.changes.append(change)
                msg_of = change if line.rstrip().endswith("=>") else None
                diff = []
            (block if block else out.rest).append(line)
            continue
        if msg_of is not None and line.startswith("    "):
            text = line.strip()
            if text.startswith("msg: "):
                text = text[5:].strip("'\"")
            msg_of.lines.append(text)
        (block if block else out.rest).append(line)
    close_task()
    while out.rest and not out.rest[0].strip():
        out.rest.pop(0)
    return out


def render(p: Preview) -> list[str]:
    """The preview for a person: the change (host or switch, task, lines), then the log
    with every skipped task folded into one line."""
    hosts = sorted({c.host for c in p.changes})
    if p.changes:
        lines = [f"== the change, on {len(hosts)} host(s) or switch(es): {', '.join(hosts)}"]
        for c in p.changes:
            lines.append(f"{c.host} — {c.task}")
            lines += [f"    {x}" for x in c.lines] or ["    (changed; the task shows no diff)"]
    else:
        lines = ["== the change: nothing would change"]
    folded = (f"{p.skipped_tasks} task(s) skipped on every host, {p.skipped_results} "
              "skipped result(s)")  # fmt: skip
    lines += ["", f"== the playbook's log ({folded} folded away):", *p.rest]
    return lines
