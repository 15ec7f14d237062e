"""Every name one benchmark module reads from another exists. `make bench` runs for 45 minutes
before it reaches some sections, and CI's smoke run of it is skipped when time is short: a name
removed from one module (bench/scale.py's BEFORE_ISSUE_39, in issue 62) broke `make bench` 37
minutes in, and nothing had run that line. Read from the source (ast), nothing started."""
from __future__ import annotations

import ast
import importlib

import pytest

from conftest import REPO

BENCH = sorted(p for p in (REPO / "bench").glob("*.py") if p.name != "__init__.py")


def bench_modules_imported(tree: ast.Module) -> dict[str, str]:
    """local name -> bench module, for `from bench import x`, `from . import x` and `import bench.x as x`."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module == "bench" or (node.level == 1 and node.module is None)):
            for alias in node.names:
                names[alias.asname or alias.name] = f"bench.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("bench.") and alias.asname:
                    names[alias.asname] = alias.name
    return names


def module_reads(tree: ast.Module, modules: dict[str, str]) -> list[ast.Attribute]:
    """Each `x.name` read where `x` is an imported bench module: not where a function binds `x`
    itself (run.py's `with ThreadPoolExecutor() as pool`)."""
    shadowed: dict[int, set[str]] = {}  # id of an Attribute node -> names its function binds
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            bound = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
            bound |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for node in ast.walk(function):
                shadowed.setdefault(id(node), set()).update(bound)
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load)
            and node.value.id in modules and node.value.id not in shadowed.get(id(node), ())]


@pytest.mark.parametrize("path", BENCH, ids=lambda p: p.name)
def test_every_name_read_from_another_bench_module_exists(path):
    tree = ast.parse(path.read_text())
    modules = bench_modules_imported(tree)
    missing = sorted({f"{modules[node.value.id]}.{node.attr} (line {node.lineno})" for node in module_reads(tree, modules)
                      if not hasattr(importlib.import_module(modules[node.value.id]), node.attr)})
    assert not missing, f"{path.name} reads names its bench modules do not have: {missing}"


def test_the_null_webhooks_patch_is_mutates_for_the_bench_pod():
    """bench/nullwebhook.py answers at /patch with mutate's patch, fixed: it must stay mutate's
    for the pods the admission bench creates, or the comparison is of two different pods."""
    import base64
    import json
    import uuid

    from bench import nullwebhook, run
    from gpu_scheduler.admission import admission_response

    pod = run.pod("bench", 0, run.map_for(300))
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                          "namespace": "bench", "object": pod}}
    response, _ = admission_response(review)
    assert json.loads(base64.b64decode(response["response"]["patch"])) == nullwebhook.MUTATES_PATCH_OPS
