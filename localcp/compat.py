"""`make test-compat`: the cluster tests that matter, feature by feature, on each Kubernetes minor
the project supports (1.33 to 1.37) and on the earlier workload controllers, written to
docs/compatibility.md as one table: a row per run (Kubernetes version, JobSet / LeaderWorkerSet /
Kueue versions), a column per feature, each cell what pytest saw there.

For each row, in turn (never two at once: one version's stack takes the machine's 2 cores):
1. localcp/build.sh --stack with GPU_SCHEDULER_K8S set to the row's version (the control plane,
   its kubelet for the real nodes and, from 1.34, its DRA test driver; each version once, into
   its own cache directory), and localcp/build-workloads.sh for the row's controllers when a
   workload feature is selected;
2. per feature, `python -m pytest <its files and -k selection> --junitxml=...` with the row's
   versions in the environment (localcp/versions.py: the stack started by the tests is that
   version), its output into the results directory;
3. the cell: "N passed" (", N failed", ", N errors", ", N skipped" when there are any), read from
   the JUnit XML; "not served" where the version lacks the API (DRA before 1.34: not run);
   "not supported by Knative" where Knative refuses the version (before 1.34: not run);
   "build failed" when step 1 failed; "no result (exit N)" when pytest wrote none (it crashed, or
   timed out: --timeout).

    python -m localcp.compat                       every row and feature: docs/compatibility.md
    python -m localcp.compat --versions v1.33.13,v1.37.2 --features fit,gangs
    python -m localcp.compat --list                the rows and features, nothing run

A subset (--versions, --features, --no-earlier-controllers) is written to the results directory
(~/.cache/gpu-scheduler/compat/<time>/compatibility.md) unless --out names a file: a quick try does
not replace the page. The results directory also keeps every JUnit file and pytest's output.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import versions

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GPU_SCHEDULER_CACHE", Path.home() / ".cache" / "gpu-scheduler"))
PAGE = REPO / "docs" / "compatibility.md"
# The newest patch release of each minor whose staging modules the Go module proxy serves.
VERSIONS = ("v1.33.13", "v1.34.0", "v1.35.4", "v1.36.3", "v1.37.2")
# The workload controllers before the defaults (localcp/versions.env), run on one version.
EARLIER_CONTROLLERS = {"jobset": "v0.10.1", "lws": "v0.7.0"}
WORKLOAD_KINDS = ("jobset", "lws", "kueue")
WIDTH = 100  # the page's prose


@dataclass(frozen=True)
class Feature:
    name: str                # --features
    title: str               # the column
    args: tuple[str, ...]    # pytest's: files and a -k selection
    dra: bool = False        # needs resource.k8s.io/v1 (1.34+)
    workloads: bool = False  # needs the workload controllers built
    knative: bool = False    # needs a Kubernetes Knative runs on (1.34+)

    def pytest_args(self) -> list[str]:
        return list(self.args)


FEATURES = (
    Feature("pinning", "pinning and env",
            ("tests/test_end_to_end.py", "tests/test_nodes.py")),
    Feature("fit", "fit", ("tests/test_fit_cluster.py",)),
    Feature("records", "records across instances", ("tests/test_records_cluster.py",)),
    Feature("gangs", "gangs", ("tests/test_gang_cluster.py",)),
    Feature("preemption", "preemption",
            ("tests/test_preemption_cluster.py", "tests/test_preemption_versus_kube_scheduler.py", "-k", "not dra")),
    Feature("quotas", "quotas",
            ("tests/test_quota_cluster.py", "tests/test_quota_strand_cluster.py", "-k", "not dra")),
    Feature("gates", "scheduling gates", ("tests/test_schedulinggates_cluster.py",)),
    Feature("dra", "DRA",
            ("tests/test_dra_cluster.py", "tests/test_dra_nodes.py", "tests/test_dra_real.py",
             "tests/test_preemption_cluster.py", "tests/test_quota_cluster.py", "-k", "dra"), dra=True),
    Feature("jobset", "JobSet",
            ("tests/test_workload_controllers_cluster.py", "tests/test_workloads_cluster.py",
             "tests/test_workloads_nodes.py", "-k", "jobset"), workloads=True),
    Feature("lws", "LeaderWorkerSet",
            ("tests/test_workload_controllers_cluster.py", "tests/test_workloads_cluster.py", "-k", "leader"),
            workloads=True),
    Feature("kueue", "Kueue",
            ("tests/test_kueue_controller_cluster.py", "tests/test_kueue_cluster.py",
             "tests/test_kueue_preemption_cluster.py"), workloads=True),
    Feature("knative", "Knative", ("tests/test_knative_cluster.py",), knative=True),
)
BY_NAME = {f.name: f for f in FEATURES}


def unavailable(feature: Feature, kubernetes: str) -> str | None:
    """Why `feature` cannot run on `kubernetes` (the cell's text), or None."""
    if feature.dra and not versions.dra_served(kubernetes):
        return "not served"
    if feature.knative and not versions.knative_supported(kubernetes):
        return "not supported by Knative"
    return None


@dataclass
class Row:
    kubernetes: str
    controllers: dict[str, str]  # jobset, lws, kueue -> version
    features: list[Feature]

    @property
    def key(self) -> str:
        return "-".join([self.kubernetes, *(f"{k}{v}" for k, v in self.controllers.items())])

    @property
    def label(self) -> str:
        """v1.37.2, or v1.37.2 with jobset v0.10.1, lws v0.7.0 (the controllers not at their default)."""
        defaults = versions.defaults()
        other = [f"{k} {v}" for k, v in self.controllers.items() if v != defaults[versions.WORKLOAD_SETTINGS[k]]]
        return self.kubernetes + (f" with {', '.join(other)}" if other else "")

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "K8S_VERSION"}  # build.sh's one-call override
        env[versions.K8S] = self.kubernetes
        for kind, version in self.controllers.items():
            env[versions.WORKLOAD_SETTINGS[kind]] = version
        return env


@dataclass
class Cell:
    text: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0
    failures: list[str] = field(default_factory=list)  # "nodeid: first line of the message"

    @property
    def ok(self) -> bool:
        """Ran, and nothing failed (or not served: nothing to run)."""
        return self.text in ("not served", "not supported by Knative") or (self.passed + self.skipped > 0 and not (self.failed or self.errors))


def controllers() -> dict[str, str]:
    """The workload controllers' versions of the settings (localcp/versions.env, or JOBSET=, LWS=,
    KUEUE= / GPU_SCHEDULER_JOBSET, ... in the environment)."""
    return {kind: versions.workload(kind) for kind in WORKLOAD_KINDS}


def plan(selected_versions: list[str], selected: list[Feature], earlier_on: str | None) -> list[Row]:
    """A row per Kubernetes version with every selected feature, and one with the earlier JobSet
    and LeaderWorkerSet on `earlier_on` (its workload features only) when that version is selected
    and those are not the versions of the other rows already."""
    rows = [Row(v, controllers(), list(selected)) for v in selected_versions]
    workload_features = [f for f in selected if f.workloads]
    earlier = {**controllers(), **EARLIER_CONTROLLERS}
    if earlier_on and earlier_on in selected_versions and workload_features and earlier != controllers():
        rows.append(Row(earlier_on, earlier, workload_features))
    return rows


# -- running ---------------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[compat {datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


def build(row: Row, results: Path) -> str | None:
    """The row's binaries, built or found; None when all is there, else what failed."""
    out = results / f"{row.key}-build.log"
    steps = [["bash", str(REPO / "localcp" / "build.sh"), "--stack"]]
    if any(f.workloads for f in row.features):
        steps.append(["bash", str(REPO / "localcp" / "build-workloads.sh"), *row.controllers])
    if any(f.knative for f in row.features):  # Knative and the helm its tests install the chart with
        steps += [["bash", str(REPO / "localcp" / "build-knative.sh")], ["bash", str(REPO / "localcp" / "build-helm.sh")]]
    with out.open("ab") as sink:
        for argv in steps:
            log(f"{row.label}: {' '.join(Path(a).name if a.startswith('/') else a for a in argv[1:])}")
            done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, env=row.environment(), cwd=REPO)
            if done.returncode != 0:
                return f"{Path(argv[1]).name} exited with {done.returncode} (see {out})"
    return None


def run_pytest(row: Row, feature: Feature, results: Path, timeout: float) -> Cell:
    junit = results / f"{row.key}-{feature.name}.xml"
    output = results / f"{row.key}-{feature.name}.log"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", f"--junitxml={junit}",
            *feature.pytest_args()]
    started = time.monotonic()
    with output.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=row.environment(), cwd=REPO)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = stop(process)
            log(f"{row.label} {feature.name}: stopped after {timeout:.0f} s (--timeout)")
    seconds = time.monotonic() - started
    cell = read_junit(junit) if junit.exists() else Cell(f"no result (exit {code})")
    cell.seconds = seconds
    if code == 5 and not junit.exists():
        cell.text = "no tests"
    return cell


def stop(process: subprocess.Popen) -> int:
    """pytest past its time: SIGINT first (its fixtures tear the stack down, as on Ctrl-C), then
    SIGTERM, then SIGKILL."""
    for sig, grace in ((signal.SIGINT, 180), (signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        process.send_signal(sig)
        try:
            return process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def read_junit(path: Path) -> Cell:
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) for s in suites)
    errors = sum(int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    failures = []
    for case in root.iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            failures.append(f"{name} ({bad.tag}): {message[0][:200] if message else ''}")
    passed = total - failed - errors - skipped
    return Cell(counts(passed, failed, errors, skipped), passed, failed, errors, skipped, failures=failures)


def counts(passed: int, failed: int, errors: int, skipped: int) -> str:
    parts = [f"{passed} passed"]
    parts += [f"{n} {word}" for n, word in ((failed, "failed"), (errors, "errors"), (skipped, "skipped")) if n]
    return ", ".join(parts) if (passed or failed or errors or skipped) else "no tests"


def run(rows: list[Row], results: Path, timeout: float) -> dict[str, dict[str, Cell]]:
    cells: dict[str, dict[str, Cell]] = {}
    for row in rows:
        cells[row.key] = row_cells = {}
        runnable = [f for f in row.features if not unavailable(f, row.kubernetes)]
        for feature in row.features:
            if feature not in runnable:
                row_cells[feature.name] = Cell(unavailable(feature, row.kubernetes))
        failure = build(row, results) if runnable else None
        if failure:
            log(f"{row.label}: build failed: {failure}")
            for feature in runnable:
                row_cells[feature.name] = Cell("build failed", failures=[failure])
            continue
        for feature in runnable:
            log(f"{row.label} {feature.name}: pytest {' '.join(quoted(a) for a in feature.args)}")
            cell = row_cells[feature.name] = run_pytest(row, feature, results, timeout)
            log(f"{row.label} {feature.name}: {cell.text} in {cell.seconds:.0f} s")
            save(rows, cells, results)
    return cells


def save(rows: list[Row], cells: dict[str, dict[str, Cell]], results: Path) -> None:
    (results / "results.json").write_text(json.dumps({
        row.key: {"kubernetes": row.kubernetes, "controllers": row.controllers,
                  "cells": {name: vars(cell) for name, cell in cells.get(row.key, {}).items()}}
        for row in rows}, indent=1))


# -- the page ----------------------------------------------------------------------------------
def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else head


INTRO = (
    "Which Kubernetes versions and workload controllers gpu-scheduler's cluster tests pass on: `make test-compat` "
    "(`localcp/compat.py`) builds each Kubernetes version with `localcp/build.sh` (the real kube-apiserver, "
    "kube-controller-manager, kube-scheduler and kubelet of that release, and from 1.34 its DRA test driver; etcd "
    "and containerd 1.7 are the same for all) and runs the tests of each feature against it: a row per run, each "
    "cell what pytest saw there. \"not served\": the version lacks the API (DRA's `resource.k8s.io/v1`, from "
    "1.34), not run; \"not supported by Knative\": Knative v0.50.0 refuses to start before 1.34 (knative.dev/pkg's "
    "minimum), not run; \"—\": not in that row.")
NOT_RUN = ("Not run yet: `make test-compat` runs it and writes this page (about half an hour per version on 2 "
           "cores, plus each version's first build).")
COLUMNS = ("What each column runs (pytest, with the row's versions in `GPU_SCHEDULER_K8S`, `GPU_SCHEDULER_JOBSET`, "
           "`GPU_SCHEDULER_LWS`, `GPU_SCHEDULER_KUEUE`):")


def wrapped(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, break_on_hyphens=False, break_long_words=False)


def render(rows: list[Row], cells: dict[str, dict[str, Cell]], when: str | None = None, at: str = "",
           command: str = "", minutes: float = 0) -> str:
    """The page; when=None: not run yet, every cell "not run" (or "not served")."""
    columns = [f for f in FEATURES if any(f in row.features for row in rows)] or list(FEATURES)
    ran = f"Run on {when} at commit {at}, {minutes:.0f} minutes (`{command}`)." if when else NOT_RUN
    lines = ["# Compatibility", "", *wrapped(INTRO), "", *wrapped(ran), "",
             "| Kubernetes | JobSet / LWS / Kueue | " + " | ".join(f.title for f in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for row in rows:
        controllers = " / ".join(row.controllers[k] for k in WORKLOAD_KINDS)
        shown = []
        for feature in columns:
            cell = cells.get(row.key, {}).get(feature.name)
            if feature not in row.features:
                shown.append("—")
            elif unavailable(feature, row.kubernetes):
                shown.append(unavailable(feature, row.kubernetes))
            else:
                shown.append(cell.text if cell else "not run")
        lines.append(f"| {row.kubernetes} | {controllers} | " + " | ".join(shown) + " |")
    lines += ["", *wrapped(COLUMNS), ""]
    lines += [f"- {f.title}: `{' '.join(quoted(a) for a in f.args)}`" for f in columns]
    failed = [(row, name, cell) for row in rows for name, cell in cells.get(row.key, {}).items() if cell.failures]
    if failed:
        lines += ["", "## Failures", ""]
        for row, name, cell in failed:
            lines.append(f"- {row.kubernetes} ({' / '.join(row.controllers[k] for k in WORKLOAD_KINDS)}), "
                         f"{BY_NAME[name].title}:")
            lines += [f"  - `{failure}`" for failure in cell.failures]
    return "\n".join(lines) + "\n"


def quoted(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg


# -- main ----------------------------------------------------------------------------------------
def split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcp.compat", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=split, default=list(VERSIONS),
                        help=f"Kubernetes versions, comma-separated (default: {','.join(VERSIONS)})")
    parser.add_argument("--features", type=split, default=[f.name for f in FEATURES],
                        help=f"features, comma-separated (default: all: {','.join(f.name for f in FEATURES)})")
    parser.add_argument("--earlier-controllers-on", default=VERSIONS[-1], metavar="VERSION",
                        help="the Kubernetes version of the extra row with JobSet "
                             f"{EARLIER_CONTROLLERS['jobset']} and LWS {EARLIER_CONTROLLERS['lws']} (its workload "
                             "features only; default: %(default)s; it runs when that version is selected)")
    parser.add_argument("--no-earlier-controllers", action="store_true", help="leave that row out")
    parser.add_argument("--timeout", type=float, default=45, metavar="MINUTES",
                        help="per feature and version, after which pytest is stopped (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="the page (default: docs/compatibility.md for the whole run;"
                                                 " <results>/compatibility.md for a subset)")
    parser.add_argument("--results", type=Path, help="where JUnit files and logs go"
                                                     " (default: ~/.cache/gpu-scheduler/compat/<time>)")
    parser.add_argument("--list", action="store_true", help="print the rows and features, run nothing")
    args = parser.parse_args(argv)

    unknown = [name for name in args.features if name not in BY_NAME]
    if unknown:
        parser.error(f"unknown features {unknown}; known: {', '.join(BY_NAME)}")
    for version in args.versions + [args.earlier_controllers_on]:
        try:
            versions.minor(version)
        except ValueError as error:
            parser.error(str(error))
    selected = [f for f in FEATURES if f.name in args.features]
    rows = plan(args.versions, selected, None if args.no_earlier_controllers else args.earlier_controllers_on)
    if args.list:
        for row in rows:
            served = [f"{f.name} ({unavailable(f, row.kubernetes)})" if unavailable(f, row.kubernetes) else f.name
                      for f in row.features]
            print(f"{row.kubernetes}  {' / '.join(row.controllers[k] for k in WORKLOAD_KINDS)}  {', '.join(served)}")
        for feature in FEATURES:
            print(f"  {feature.name:<11} {feature.title}: pytest {' '.join(quoted(a) for a in feature.args)}")
        return 0

    whole = (set(args.versions) == set(VERSIONS) and len(selected) == len(FEATURES)
             and not args.no_earlier_controllers and args.earlier_controllers_on == VERSIONS[-1])
    stamp = datetime.now(timezone.utc)
    results = args.results or CACHE / "compat" / stamp.strftime("%Y%m%dT%H%M%SZ")
    results.mkdir(parents=True, exist_ok=True)
    out = args.out or (PAGE if whole else results / "compatibility.md")
    at = commit()
    log(f"{len(rows)} rows, results in {results}; the page: {out}")
    began = time.monotonic()
    cells = run(rows, results, args.timeout * 60)
    command = "make test-compat" if whole else "python -m localcp.compat " + " ".join(
        quoted(a) for a in (argv if argv is not None else sys.argv[1:]))
    page = render(rows, cells, stamp.strftime("%Y-%m-%d"), at, command, (time.monotonic() - began) / 60)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    if out != results / "compatibility.md":
        shutil.copy(out, results / "compatibility.md")
    print(page)
    log(f"written: {out}")
    return 0 if all(c.ok for row in cells.values() for c in row.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
