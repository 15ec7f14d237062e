"""The core objects of the deployment, accepted by a real API server: `kubectl apply
--dry-run=server` against the local control plane (Kubernetes 1.20, tests/conftest.py's
`controlplane` fixture). Server-side dry run runs defaulting, validation and admission without
persisting anything.

Only kinds that Kubernetes 1.20 serves, and without the fields it lacks:
- MutatingWebhookConfiguration: `matchConditions` is stripped (alpha in 1.27, GA in 1.30; the
  kind cluster runs 1.34, and tests/test_manifests.py validates the full object for 1.34).
Custom resources (Knative, cert-manager) need their CRDs and controllers: test_manifests.py
validates them against the published CRD schemas instead.
"""
from __future__ import annotations

import copy
import subprocess
import uuid

import pytest
import yaml

from schemas import REPO, load_documents

pytestmark = pytest.mark.controlplane

SOURCES = [*sorted((REPO / "knative").glob("*.yaml")), REPO / "check" / "statefulset.yaml"]
KINDS_IN_1_20 = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "StatefulSet",
                 "MutatingWebhookConfiguration"}
# kind -> fields of each list item under the given key that Kubernetes 1.20 does not know.
NEWER_THAN_1_20 = {"MutatingWebhookConfiguration": ("webhooks", ["matchConditions"])}


def for_1_20(namespace: str) -> list[dict]:
    """The 1.20-servable objects, namespaced ones moved into `namespace` (created by the test)."""
    result = []
    for path in SOURCES:
        for doc in load_documents(path):
            if doc["kind"] not in KINDS_IN_1_20:
                continue
            doc = copy.deepcopy(doc)
            if doc["kind"] in NEWER_THAN_1_20:
                key, fields = NEWER_THAN_1_20[doc["kind"]]
                for item in doc[key]:
                    for field in fields:
                        item.pop(field, None)
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
        docs = for_1_20(namespace)
        assert {doc["kind"] for doc in docs} == KINDS_IN_1_20
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
