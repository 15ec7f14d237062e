"""Every API call of kubeapi/client.py stays inside the resource it names, whatever the names:
'/', '..', '?', '#', '%' and the rest cannot add, remove or climb path segments (issue 15: a pod
named '../x' once moved the Binding POST to /api/v1/nodes/node1/x-0/binding).

The URL is checked as urllib3 sends it (`parse_url(...).request_uri`: it resolves dot segments),
against a fake connection pool; no network."""
from __future__ import annotations

import inspect
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from urllib3.util import parse_url

from kubeapi.client import CALLS, Kube
from kubeapi.kubeconfig import ClusterConfig

HOSTILE = ["../x", "..", ".", "../../nodes/node1", "a/b", "x?y=1", "x#y", "%2e%2e", "%2F", "a b", "x\u0000",
           "\u00e9", "/", "//", "?", "#", "%", "ns/../kube-system", "a;b", "a\\b", "~1"]

# Each call: its arguments by name, and the path segments it must address.
RESOURCE = {
    "bind": lambda ns, name: ["api", "v1", "namespaces", ns, "pods", name, "binding"],
    "read_pod": lambda ns, name: ["api", "v1", "namespaces", ns, "pods", name],
    "patch_pod_status": lambda ns, name: ["api", "v1", "namespaces", ns, "pods", name, "status"],
    "read_node": lambda ns, name: ["api", "v1", "nodes", name],
    "read_jobset": lambda ns, name: ["apis", "jobset.x-k8s.io", "v1alpha2", "namespaces", ns, "jobsets", name],
    "patch_node_status": lambda ns, name: ["api", "v1", "nodes", name, "status"],
    "list_resource_quotas": lambda ns, name: ["api", "v1", "namespaces", ns, "resourcequotas"],
    "create_event": lambda ns, name: ["api", "v1", "namespaces", ns, "events"],
    "read_event": lambda ns, name: ["api", "v1", "namespaces", ns, "events", name],
    "patch_event": lambda ns, name: ["api", "v1", "namespaces", ns, "events", name],
    "list_events": lambda ns, name: ["api", "v1", "namespaces", ns, "events"],
    "list_pods": lambda ns, name: ["api", "v1", "pods"],
    "list_all_pods": lambda ns, name: ["api", "v1", "pods"],
    "list_all_pod_metadata": lambda ns, name: ["api", "v1", "pods"],
    "list_namespaced_pods": lambda ns, name: ["api", "v1", "namespaces", ns, "pods"],
    "watch_all_pods": lambda ns, name: ["api", "v1", "pods"],
    "list_nodes": lambda ns, name: ["api", "v1", "nodes"],
    "watch_nodes": lambda ns, name: ["api", "v1", "nodes"],
    "list_leases": lambda ns, name: ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases"],
    "watch_leases": lambda ns, name: ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases"],
    "create_lease": lambda ns, name: ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases"],
    "read_lease": lambda ns, name: ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", name],
    "update_lease": lambda ns, name: ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", name],
    "delete_lease": lambda ns, name: ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", name],
    "create_token_review": lambda ns, name: ["apis", "authentication.k8s.io", "v1", "tokenreviews"],
    "list_resource_slices": lambda ns, name: ["apis", "resource.k8s.io", "v1", "resourceslices"],
    "watch_resource_slices": lambda ns, name: ["apis", "resource.k8s.io", "v1", "resourceslices"],
    "list_resource_claims": lambda ns, name: ["apis", "resource.k8s.io", "v1", "resourceclaims"],
    "watch_resource_claims": lambda ns, name: ["apis", "resource.k8s.io", "v1", "resourceclaims"],
    "create_resource_claim": lambda ns, name: ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims"],
    "read_resource_claim": lambda ns, name: ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name],
    "update_resource_claim": lambda ns, name: ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name],
    "update_resource_claim_status": lambda ns, name: ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims",
                                                      name, "status"],
    "evict": lambda ns, name: ["api", "v1", "namespaces", ns, "pods", name, "eviction"],
    "list_resource_quotas_all": lambda ns, name: ["api", "v1", "resourcequotas"],
    "watch_resource_quotas": lambda ns, name: ["api", "v1", "resourcequotas"],
    "list_pdbs": lambda ns, name: ["apis", "policy", "v1", "poddisruptionbudgets"],
    "watch_pdbs": lambda ns, name: ["apis", "policy", "v1", "poddisruptionbudgets"],
    "delete_cluster_role_binding": lambda ns, name: ["apis", "rbac.authorization.k8s.io", "v1", "clusterrolebindings", name],
    "delete_role_binding": lambda ns, name: ["apis", "rbac.authorization.k8s.io", "v1", "namespaces", ns, "rolebindings",
                                             name],
}


class Response:
    status, reason, data = 200, "OK", b'{"items": []}'

    def stream(self, amount):  # a watch that ends with nothing
        return iter(())

    def release_conn(self):
        pass


class RecordingPool:
    def __init__(self):
        self.urls: list[str] = []

    def request(self, method, url, **kwargs):
        self.urls.append(url)
        return Response()


def kube() -> tuple[Kube, RecordingPool]:
    client = Kube(ClusterConfig(host="https://api.example:6443"))
    # Through urllib3, which resolves dot segments: the stricter of bind's two paths (its own
    # transport, kubeapi/transport.py, writes the path as given).
    client.transport = None
    client.http = RecordingPool()
    return client, client.http


def test_every_call_is_covered():
    assert set(RESOURCE) == set(CALLS)


def call(client: Kube, method: str, namespace: str, name: str) -> None:
    arguments = {"namespace": namespace, "name": name, "binding": {}, "patch": {}, "event": {},
                 "field_selector": "x=y", "label_selector": "x=y", "lease": {}, "review": {}, "claim": {}, "cached": True, "dry_run": True, "resource_version": "1", "seconds": 1, "limit": 1, "uid": "u",
                 "projection": None, "paged": True}
    parameters = inspect.signature(getattr(client, method)).parameters
    answer = getattr(client, method)(**{p: arguments[p] for p in parameters})
    if inspect.isgenerator(answer):  # a watch: its request is made when it is read
        list(answer)


def segments(url: str) -> list[str]:
    uri = parse_url(url).request_uri  # what urllib3 puts on the wire
    path = uri.split("?", 1)[0]
    assert "#" not in uri
    return [unquote(s) for s in path.split("/")[1:]]


@pytest.mark.parametrize("method", sorted(CALLS))
@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_name_stays_in_its_segment(method, hostile):
    for namespace, name in ((hostile, "w-0"), ("default", hostile), (hostile, hostile)):
        client, pool = kube()
        call(client, method, namespace, name)
        (url,) = pool.urls
        assert segments(url) == RESOURCE[method](namespace, name), url


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(CALLS)), st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12))
def test_any_name_stays_in_its_segment(method, namespace, name):
    client, pool = kube()
    call(client, method, namespace, name)
    (url,) = pool.urls
    assert segments(url) == RESOURCE[method](namespace, name), url


@pytest.mark.parametrize("method", ["bind", "read_pod", "read_node", "read_event", "patch_node_status"])
def test_an_empty_name_is_refused_not_turned_into_a_list(method):
    client, pool = kube()
    with pytest.raises(ValueError):
        call(client, method, "default", "")
    assert not pool.urls
