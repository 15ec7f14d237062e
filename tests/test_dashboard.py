"""dashboards/gpu-scheduler.json is a dashboard Grafana can import, its queries name only metrics
(and labels) that the functions export, and docs/metrics.md lists exactly those metrics.

The exported metrics are read from the functions' sources with ast, not by importing them:
bind's entry module connects to the Kubernetes API at import. Every prometheus_client metric a
function defines is found, and a name that is not a string literal fails the test rather than
being skipped."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "dashboards" / "gpu-scheduler.json"
METRICS_DOC = REPO / "docs" / "metrics.md"

# The series prometheus_client writes for each kind of metric: a Counter "x" or "x_total" is
# exposed as x_total and x_created; a Histogram as x_bucket, x_count, x_sum, x_created.
SUFFIXES = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_count", "_sum", "_created"),
    "Summary": ("", "_count", "_sum", "_created"),
    "Info": ("_info",),
    "Enum": ("",),
}
# Labels the series get from the Prometheus target (Kubernetes service discovery), not the code.
TARGET_LABELS = {"namespace", "pod", "container", "instance", "job", "service", "endpoint"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                "and", "or", "unless", "inf", "nan", "atan2"}


def declared_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric defined in functions/*/*.py: its name as written -> (kind, label names)."""
    return {name: definition for path in sorted((REPO / "functions").glob("*/*.py"))
            for name, definition in metrics_in(path).items()}


def metrics_in(path: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The prometheus_client metrics one source file defines."""
    metrics = {}
    tree = ast.parse(path.read_text(), str(path))
    modules = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names if alias.name == "prometheus_client"}
    classes = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
               for alias in node.names if alias.name in SUFFIXES}
    for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
        kind = _metric_kind(call.func, modules, classes)
        if kind is None:
            continue
        where = f"{path.relative_to(REPO)}:{call.lineno}"
        keywords = {k.arg: k.value for k in call.keywords}
        name = call.args[0] if call.args else keywords.get("name")
        assert isinstance(name, ast.Constant) and isinstance(name.value, str), f"{where}: metric name is not a literal"
        labels = call.args[2] if len(call.args) > 2 else keywords.get("labelnames", ast.Tuple(elts=[]))
        assert isinstance(labels, (ast.List, ast.Tuple)), f"{where}: label names are not a literal list"
        metrics[name.value] = (kind, tuple(ast.literal_eval(label) for label in labels.elts))
    return metrics


def imported_by_entry(function: Path) -> set[Path]:
    """The function's main.py and the sibling modules it imports, directly or through each other
    (functions-framework puts the function's directory on sys.path)."""
    seen, todo = set(), [function / "main.py"]
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            todo += [function / f"{name.split('.')[0]}.py" for name in names]
    return seen


def _metric_kind(func: ast.expr, modules: set[str], classes: dict[str, str]) -> str | None:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
        return func.attr if func.attr in SUFFIXES else None
    if isinstance(func, ast.Name):
        return classes.get(func.id)
    return None


def exported_series() -> dict[str, set[str]]:
    """Every series name the functions expose -> the labels it carries."""
    series = {}
    for name, (kind, labels) in declared_metrics().items():
        base = name.removesuffix("_total") if kind == "Counter" else name
        for suffix in SUFFIXES[kind]:
            extra = {"le"} if suffix == "_bucket" else {"quantile"} if kind == "Summary" and not suffix else set()
            series[base + suffix] = set(labels) | extra
    return series


def query_parts(expr: str) -> tuple[set[str], list[tuple[str, set[str]]], set[str]]:
    """A PromQL expression's metric names, its selectors' (metric, matcher labels), and the labels
    of its by/without/on/ignoring/group_* clauses. Enough PromQL for dashboards: strings, ranges,
    Grafana variables and label lists are taken out before the names are read."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)
    selectors = [(metric, set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers)))
                 for metric, matchers in re.findall(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}", expr)]
    clauses = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
    grouping = {label for labels in re.findall(clauses, expr) for label in re.findall(r"\w+", labels)}
    bare = re.sub(clauses, " ", re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr))
    names = set(re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", bare)) - PROMQL_WORDS
    return names, selectors, grouping


def problems(expr: str, series: dict[str, set[str]]) -> list[str]:
    """What in expr the functions do not export: unknown metrics, and labels no metric of it has."""
    names, selectors, grouping = query_parts(expr)
    found = [f"unknown metric {name}" for name in sorted(names - series.keys())]
    for metric, labels in selectors:
        if metric in series:
            found += [f"{metric} has no label {label}" for label in sorted(labels - series[metric] - TARGET_LABELS)]
    if not found:  # an unknown metric says it all; its labels would only repeat it
        known = set().union(TARGET_LABELS, *(series[name] for name in names))
        found = [f"no metric in it has the label {label}" for label in sorted(grouping - known)]
    return found


def grafana_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (label_values' label is checked too)."""
    queries = [(f"panel {panel['title']!r} {target['refId']}", target["expr"])
               for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            if m := re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query):
                query = f"count by ({m[2]}) ({m[1]})"
            queries.append((f"variable {variable['name']}", query))
    return queries


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def series() -> dict[str, set[str]]:
    return exported_series()


def test_the_dashboard_has_what_grafana_imports(dashboard):
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for panel in dashboard["panels"]:
        assert panel["id"] not in ids, f"panel id {panel['id']} twice"
        ids.add(panel["id"])
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(set(refs)) == len(refs), f"panel {panel['title']!r}: refIds {refs}"
        for target in panel["targets"]:
            assert target["expr"].strip() and target.get("datasource", panel["datasource"]) == panel["datasource"]


def test_every_query_names_only_what_the_functions_export(dashboard, series):
    found = [f"{where}: {problem}" for where, expr in grafana_queries(dashboard) for problem in problems(expr, series)]
    assert not found, "\n".join(found)


def test_the_dashboard_shows_each_function_s_main_metrics(dashboard):
    used = set().union(*(query_parts(expr)[0] for _, expr in grafana_queries(dashboard)))
    assert {"gpu_scheduler_schedule_attempts_total", "gpu_scheduler_scheduling_attempt_duration_seconds_bucket",
            "gpu_scheduler_pending_pods", "gpu_scheduler_gpus_held", "gpu_scheduler_bind_events_total",
            "gpu_scheduler_admission_decisions_total", "gpu_scheduler_admission_duration_seconds_bucket"} <= used


def test_every_module_that_defines_metrics_is_served_by_its_function():
    unserved = [str(path.relative_to(REPO)) for function in sorted((REPO / "functions").iterdir()) if function.is_dir()
                for path in sorted(function.glob("*.py")) if metrics_in(path) and path not in imported_by_entry(function)]
    assert not unserved, f"defined but never imported by the function's main.py: {unserved}"


@pytest.mark.parametrize("expr, expected", [
    ('sum by (result) (rate(gpu_scheduler_schedule_attempts_total{result="scheduled"}[$__rate_interval]))', []),
    ("histogram_quantile(0.99, sum by (le) (rate(gpu_scheduler_admission_duration_seconds_bucket[5m])))", []),
    ("sum(rate(gpu_scheduler_bind_outcome_total[5m]))", ["unknown metric gpu_scheduler_bind_outcome_total"]),
    ("histogram_quantile(0.5, sum by (le) (rate(gpu_scheduler_admission_seconds_bucket[5m])))",
     ["unknown metric gpu_scheduler_admission_seconds_bucket"]),
    ("gpu_scheduler_pending_pods offset 5m > bool 0 or up", ["unknown metric up"]),
    ('gpu_scheduler_gpus_held{nodename="node1"}', ["gpu_scheduler_gpus_held has no label nodename"]),
    ("sum by (reslt) (gpu_scheduler_schedule_attempts_total)", ["no metric in it has the label reslt"]),
    ("gpu_scheduler_pending_pods_total", ["unknown metric gpu_scheduler_pending_pods_total"]),
])
def test_the_check_reports_what_the_functions_do_not_export(expr, expected, series):
    assert problems(expr, series) == expected


def test_docs_list_every_exported_metric_with_its_labels():
    rows = re.findall(r"^\| `(gpu_scheduler_\w+)` \| (\w+) \| ([^|]*) \|", METRICS_DOC.read_text(), re.M)
    documented = {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}
    assert documented == declared_metrics()
