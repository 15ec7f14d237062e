"""Re-takes the receive adapter's captures in tests/fixtures/sample-events/ from the real adapter.

    python -m localcp.capture_events [--into DIR]

On the local stack (the control plane at localcp/versions.env's Kubernetes, mutate as its webhook,
bind as the sink), Knative Eventing's real ApiServerSource receive adapter (localcp/adapter.py;
the version of localcp/versions.env) watches what knative/sources.yaml names and sends to bind
through the tap, which keeps each request as it came. Then, as a user's workloads would:
- the seed StatefulSet (check/statefulset.yaml's map, 5 replicas, Parallel) is created in
  namespace `capture`: `add` of gpu-scheduler-check-0;
- bind binds its pods: the `update` of gpu-scheduler-check-2 that carries spec.nodeName;
- gpu-scheduler-check-2 is force-deleted: its `delete`;
- a pinned Indexed Job (1 completion, map 0=node2:0, a GPU the seed leaves free) is created: the `add`
  of its pod, and the
  `update` once bound.
Each is written as {"headers", "body"} (less Host and Content-Length) to DIR (default: the fixtures' knative-<version>/), under
the file names the tests read. Without real nodes: the pods are bound and stay Pending.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import knative
from .cluster import REPO
from .stack import LocalStack

FIXTURES = REPO / "tests" / "fixtures" / "sample-events"
NAMESPACE = "capture"
ADD, UPDATE, DELETE = (f"dev.knative.apiserver.resource.{t}" for t in ("add", "update", "delete"))


def seed() -> dict:
    from tests.test_end_to_end import statefulset  # the seed as the tests create it
    manifest = statefulset(NAMESPACE)
    manifest["spec"]["podManagementPolicy"] = "Parallel"
    return manifest


def indexed_job() -> dict:
    template = seed()["spec"]["template"]
    template["metadata"] = {"labels": {"app": "indexed"}, "annotations": {"gpu-scheduling-map": "0=node2:0\n"}}
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "indexed", "namespace": NAMESPACE},
            "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1, "template": template}}


def captured(stack: LocalStack, kind: str, matches, what: str, timeout: float = 60) -> dict:
    def found():
        for request in list(stack.source.received):
            body = json.loads(request["body"])
            if request["headers"].get("Ce-Type") == kind and matches(body):
                # As the adapter sent them, less what any HTTP client adds (its connection's).
                headers = {k: v for k, v in request["headers"].items() if k not in ("Host", "Content-Length")}
                return {"headers": headers, "body": body}
        return None
    return stack.wait_for(found, timeout, what)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcp.capture_events", description=__doc__.splitlines()[0])
    version = knative.projects()[0].version
    parser.add_argument("--into", type=Path, default=FIXTURES / f"knative-{version}")
    args = parser.parse_args(argv)
    knative.ensure_built()
    files = {}
    with LocalStack() as stack:
        stack.create_namespace(NAMESPACE)
        stack.apply(seed())
        files["apiserversource-add-gpu-scheduler-check-0.json"] = captured(
            stack, ADD, lambda p: p["metadata"]["name"] == "gpu-scheduler-check-0", "the add of pod 0")
        files["apiserversource-update-gpu-scheduler-check-2-bound.json"] = captured(
            stack, UPDATE, lambda p: p["metadata"]["name"] == "gpu-scheduler-check-2" and p["spec"].get("nodeName"),
            "the update of pod 2 once bound")
        stack.cp.kubectl("delete", "pod", "-n", NAMESPACE, "gpu-scheduler-check-2", "--grace-period=0", "--force")
        files["apiserversource-delete-gpu-scheduler-check-2-bound.json"] = captured(
            stack, DELETE, lambda p: p["metadata"]["name"] == "gpu-scheduler-check-2", "the delete of pod 2")
        stack.apply(indexed_job())
        is_job_pod = lambda p: p["metadata"].get("generateName") == "indexed-0-"  # noqa: E731
        files["apiserversource-add-indexed-job-0.json"] = captured(stack, ADD, is_job_pod, "the add of the Job's pod")
        files["apiserversource-update-indexed-job-bound.json"] = captured(
            stack, UPDATE, lambda p: is_job_pod(p) and p["spec"].get("nodeName"), "the update of the Job's pod once bound")
    args.into.mkdir(parents=True, exist_ok=True)
    for name, request in files.items():
        (args.into / name).write_text(json.dumps(request, indent=2, sort_keys=True) + "\n")
        print(f"{args.into / name}: {request['headers']['Ce-Type']} {request['headers']['Ce-Name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
