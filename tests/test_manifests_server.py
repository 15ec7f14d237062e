"""The core objects of the deployment, accepted by a real API server: `kubectl apply
--dry-run=server` against the local control plane (its version: localcp/versions.env;
tests/conftest.py's `controlplane` fixture). Server-side dry run runs defaulting, validation and
admission without persisting anything. Every core object is sent as shipped (the webhook's
matchConditions included); only namespaced objects move into a namespace the test creates.

Custom resources (Knative, cert-manager) are validated against the published CRD schemas by
test_manifests.py, and with the real CRDs installed by test_chart.py (every object the chart renders).
"""
from __future__ import annotations

import copy
import subprocess
import uuid

import pytest
import yaml

from schemas import REPO, load_documents

pytestmark = pytest.mark.controlplane

SOURCES = [*sorted((REPO / "knative").glob("*.yaml")), REPO / "check" / "statefulset.yaml",
           REPO / "kind" / "kourier-nodeport.yaml"]
CORE_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "StatefulSet", "MutatingWebhookConfiguration", "Service"}


def core_objects(namespace: str) -> list[dict]:
    """The objects Kubernetes itself serves, namespaced ones moved into `namespace`."""
    result = []
    for path in SOURCES:
        for doc in load_documents(path):
            if doc["kind"] not in CORE_KINDS or "knative.dev" in doc["apiVersion"]:
                continue
            doc = copy.deepcopy(doc)
            if "namespace" in doc["metadata"]:
                doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            result.append(doc)
    return result


def test_core_objects_pass_server_side_dry_run(controlplane, tmp_path):
    kubectl = [controlplane.kubectl, "--kubeconfig", controlplane.kubeconfig]
    namespace = f"manifests-{uuid.uuid4().hex[:8]}"
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True, timeout=60)
    try:
        docs = core_objects(namespace)
        assert {doc["kind"] for doc in docs} == CORE_KINDS
        path = tmp_path / "objects.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        result = subprocess.run([*kubectl, "apply", "--dry-run=server", "-f", str(path)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"kubectl apply --dry-run=server:\n{result.stdout}\n{result.stderr}"
        for doc in docs:
            assert doc["metadata"]["name"] in result.stdout, result.stdout
        assert result.stdout.count("(server dry run)") == len(docs), result.stdout
    finally:
        subprocess.run([*kubectl, "delete", "namespace", namespace, "--wait=false"], capture_output=True, timeout=60)
