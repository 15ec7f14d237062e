"""`make test-compat` (localcp/compat.py) without running a stack: the rows it plans, the cells it
reads from pytest's JUnit files, the page it writes, and docs/compatibility.md as committed (a row
per supported minor and the earlier controllers' row, a column per feature, the date and commit of
the run, and no cell left "not run")."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from localcp import compat, versions

PAGE = Path(compat.PAGE)


def test_every_minor_from_1_33_to_1_37_and_the_earlier_controllers_are_planned():
    rows = compat.plan(list(compat.VERSIONS), list(compat.FEATURES), compat.VERSIONS[-1])
    assert [versions.minor(r.kubernetes) for r in rows] == [33, 34, 35, 36, 37, 37]
    assert all(r.features == list(compat.FEATURES) for r in rows[:-1])
    earlier = rows[-1]
    assert (earlier.controllers["jobset"], earlier.controllers["lws"]) == ("v0.10.1", "v0.7.0")
    assert [f.name for f in earlier.features] == ["jobset", "lws", "kueue"]


def test_the_earlier_controllers_row_only_with_its_version_and_a_workload_feature():
    fit = [compat.BY_NAME["fit"]]
    assert len(compat.plan(["v1.37.2"], fit, "v1.37.2")) == 1
    assert len(compat.plan(["v1.33.13"], [compat.BY_NAME["jobset"]], "v1.37.2")) == 1
    assert len(compat.plan(["v1.37.2"], [compat.BY_NAME["jobset"]], "v1.37.2")) == 2


def test_a_row_runs_pytest_with_its_versions_in_the_environment(monkeypatch):
    monkeypatch.setenv("K8S_VERSION", "v1.30.0")  # build.sh's one-call override: never passed on
    row = compat.Row("v1.33.13", {"jobset": "v0.10.1", "lws": "v0.7.0", "kueue": "v0.17.0"}, [])
    env = row.environment()
    assert env[versions.K8S] == "v1.33.13" and "K8S_VERSION" not in env
    assert (env["GPU_SCHEDULER_JOBSET"], env["GPU_SCHEDULER_LWS"]) == ("v0.10.1", "v0.7.0")


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7">
<testcase classname="tests.test_fit_cluster" name="test_a"/>
<testcase classname="tests.test_fit_cluster" name="test_b"><failure message="assert 1 == 2&#10;more">x</failure></testcase>
<testcase classname="tests.test_fit_cluster" name="test_c"><error message="TimeoutError: node1">y</error></testcase>
</testsuite></testsuites>"""


def test_a_cell_is_what_pytest_saw(tmp_path):
    junit = tmp_path / "fit.xml"
    junit.write_text(JUNIT)
    cell = compat.read_junit(junit)
    assert cell.text == "3 passed, 1 failed, 1 errors, 2 skipped" and not cell.ok
    assert cell.failures == ["tests/test_fit_cluster.py::test_b (failure): assert 1 == 2",
                             "tests/test_fit_cluster.py::test_c (error): TimeoutError: node1"]


@pytest.mark.parametrize("cell, ok", [
    (compat.Cell("12 passed", passed=12), True), (compat.Cell("3 passed, 1 skipped", 3, skipped=1), True),
    (compat.Cell("not served"), True), (compat.Cell("no tests"), False), (compat.Cell("build failed"), False),
    (compat.Cell("no result (exit -9)"), False), (compat.Cell("1 passed, 1 failed", 1, 1), False)])
def test_only_a_run_without_failures_or_an_unserved_api_is_ok(cell, ok):
    assert cell.ok is ok


def test_the_page_marks_dra_not_served_before_1_34_and_lists_failures():
    rows = compat.plan(["v1.33.13", "v1.34.0"], [compat.BY_NAME["fit"], compat.BY_NAME["dra"]], None)
    cells = {rows[0].key: {"fit": compat.Cell("16 passed", 16)},
             rows[1].key: {"fit": compat.Cell("15 passed, 1 failed", 15, 1, failures=["t.py::x (failure): no"]),
                           "dra": compat.Cell("12 passed", 12)}}
    page = compat.render(rows, cells, "2026-11-28", "abc1234", "make test-compat", 80)
    table = [line for line in page.splitlines() if line.startswith("| v1.")]
    assert table == ["| v1.33.13 | v0.11.1 / v0.8.0 / v0.17.0 | 16 passed | not served |",
                     "| v1.34.0 | v0.11.1 / v0.8.0 / v0.17.0 | 15 passed, 1 failed | 12 passed |"]
    assert "Run on 2026-11-28 at commit abc1234, 80 minutes (`make test-compat`)." in page
    assert "- v1.34.0 (v0.11.1 / v0.8.0 / v0.17.0), fit:\n  - `t.py::x (failure): no`" in page


# -- docs/compatibility.md as committed ------------------------------------------------------------
def page_rows() -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in PAGE.read_text().splitlines()
            if line.startswith("| v1.")]


def test_the_committed_page_has_every_minor_and_feature():
    header = next(line for line in PAGE.read_text().splitlines() if line.startswith("| Kubernetes |"))
    assert [c.strip() for c in header.strip("|").split("|")][2:] == [f.title for f in compat.FEATURES]
    rows = page_rows()
    assert [r[0] for r in rows] == [*compat.VERSIONS, compat.VERSIONS[-1]]
    assert rows[-1][1].startswith("v0.10.1 / v0.7.0 /")


def test_the_committed_page_says_when_and_at_which_commit_it_ran_and_every_cell_ran():
    text = PAGE.read_text()
    assert re.search(r"Run on \d{4}-\d{2}-\d{2} at commit [0-9a-f]{7,}", text), "docs/compatibility.md: not run"
    cells = [cell for row in page_rows() for cell in row[2:]]
    assert "not run" not in cells
