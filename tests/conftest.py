"""The suite's two halves (CONTRIBUTING.md): rootless tests run in parallel (pytest-xdist),
tests marked ``root``, ``lab`` or ``molecule`` run after them, one at a time. Collection
refuses a test that would break that split:

* ``tests/unit`` is the fast rootless half: no test there carries a root/lab/molecule mark
  (they live in tests/integration, tests/lab, tests/ansible);
* a test that builds namespaces or a lab (through the lab fixtures) carries ``root`` or
  ``lab``, so it never runs beside other tests in the parallel half.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERIAL = {"root", "lab", "molecule"}
# Fixtures that build network namespaces or a lab fabric.
NAMESPACE_FIXTURES = {"lab_factory", "small_lab", "netns"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        where = Path(str(item.path)).resolve().relative_to(ROOT).parts[:2]
        if where == ("tests", "unit") and marks & SERIAL:
            wrong.append(f"{item.nodeid}: marked {sorted(marks & SERIAL)} but in tests/unit "
                         "(the fast rootless tests): move it to tests/integration")  # fmt: skip
        uses = NAMESPACE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses and not marks & {"root", "lab"}:
            wrong.append(f"{item.nodeid}: uses {sorted(uses)} (namespaces) without a root "
                         "or lab mark: it would run in the parallel rootless half")  # fmt: skip
    if wrong:
        raise pytest.UsageError("\n".join(wrong))
