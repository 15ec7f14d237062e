"""Least privilege, checked by the API server itself: SubjectAccessReviews for each
ServiceAccount of knative/rbac.yaml (the chart's RBAC, rendered; the stack applies it). Each
account can do exactly what gpu_scheduler.permissions lists, where it lists it, and the obviously
dangerous things are refused."""
from __future__ import annotations

import pytest
from kubernetes import client

from gpu_scheduler import permissions

NAMESPACE = "gpu-scheduler"  # the accounts' own namespace
# Granted in every namespace (ClusterRoles), and in the accounts' own namespace only (Roles).
CLUSTER = {"bind": permissions.BIND, "pod-events": permissions.EVENT_SOURCE, "mutate": permissions.MUTATE}
OWN_NAMESPACE = {"bind": permissions.BIND_RECORDS, "pod-events": frozenset(), "mutate": frozenset()}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
FORBIDDEN = [
    ("", "pods", "update"), ("", "pods", "patch"), ("", "pods", "create"), ("", "pods", "delete"),
    ("", "pods/exec", "create"), ("", "secrets", "get"), ("", "secrets", "list"), ("", "configmaps", "get"),
    ("", "nodes", "update"), ("", "nodes", "patch"), ("", "nodes/status", "patch"), ("", "events", "delete"),
    ("", "serviceaccounts/token", "create"), ("apps", "statefulsets", "update"),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate"), ("", "pods/eviction", "create"),
    ("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "update"),
]


def can(stack, account: str, group: str, resource: str, verb: str, namespace: str = "default") -> bool:
    resource, _, subresource = resource.partition("/")
    review = client.AuthorizationV1Api(stack.api_client).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{NAMESPACE}:{account}",
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
                 "resourceAttributes": {"group": group, "resource": resource, "subresource": subresource,
                                        "verb": verb, "namespace": namespace}}})
    return review.status.allowed


@pytest.mark.parametrize("account", sorted(CLUSTER))
def test_each_account_can_do_what_it_needs(stack, account):
    for group, resource, verb in sorted(CLUSTER[account]):
        assert can(stack, account, group, resource, verb), (account, resource, verb)
        assert can(stack, account, group, resource, verb, namespace="another"), "cluster-wide"
    for group, resource, verb in sorted(OWN_NAMESPACE[account]):
        assert can(stack, account, group, resource, verb, namespace=NAMESPACE), (account, resource, verb)
        assert not can(stack, account, group, resource, verb, namespace="another"), "its own namespace only"


@pytest.mark.parametrize("account", sorted(CLUSTER))
def test_each_account_can_do_nothing_else(stack, account):
    for namespace, allowed in (("default", CLUSTER[account]), (NAMESPACE, CLUSTER[account] | OWN_NAMESPACE[account])):
        others = [call for call in FORBIDDEN if call not in allowed]
        # Every verb on the resources it touches that it was not granted, too.
        for group, resource, _ in allowed:
            others += [(group, resource, v) for v in VERBS if (group, resource, v) not in allowed]
        granted = [call for call in others if can(stack, account, *call, namespace=namespace)]
        assert granted == [], namespace
