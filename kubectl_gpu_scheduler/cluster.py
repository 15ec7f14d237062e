"""What the plugin reads from the cluster, with bind's client (kubeapi), each thing once."""
from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from kubeapi.client import Kube


def _or_none(read, *args) -> dict | None:
    """What `read` returns, or None where the API server says it does not exist (404)."""
    try:
        return read(*args)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


class Cluster:
    def __init__(self, api: Kube):
        self.api = api
        self._nodes: dict[str, dict | None] = {}
        self._pods_on: dict[str, list[dict]] = {}
        self._slices: list[dict] | None = None
        self._claims: list[dict] | None = None

    def node(self, name: str) -> dict | None:
        """The node, or None when it does not exist (as bind sees it)."""
        if name not in self._nodes:
            self._nodes[name] = _or_none(self.api.read_node, name)
        return self._nodes[name]

    def pods_on(self, node: str) -> list[dict]:
        """The pods bound to `node`, in all namespaces (what the fit and GPU checks count)."""
        if node not in self._pods_on:
            self._pods_on[node] = self.api.list_pods(f"spec.nodeName={node}")
        return self._pods_on[node]

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _or_none(self.api.read_pod, namespace, name)

    def events(self, pod: dict[str, Any]) -> list[dict]:
        meta = pod.get("metadata") or {}
        return self.api.list_events(meta.get("namespace", ""), f"involvedObject.uid={meta.get('uid', '')}")

    # -- DRA mode ----------------------------------------------------------------------------------
    def resource_slices(self) -> list[dict]:
        """Every ResourceSlice (what each node publishes), read once."""
        if self._slices is None:
            self._slices = [item for page, _ in self.api.list_resource_slices() for item in page]
        return self._slices

    def resource_claims(self) -> list[dict]:
        """Every ResourceClaim of the cluster (a device allocated in any of them is held), read once."""
        if self._claims is None:
            self._claims = [item for page, _ in self.api.list_resource_claims() for item in page]
        return self._claims

    def resource_claim(self, namespace: str, name: str) -> dict | None:
        return _or_none(self.api.read_resource_claim, namespace, name)
