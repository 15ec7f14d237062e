"""What `helm uninstall` runs before it deletes the release (the chart's pre-delete hook, a Job in
bind's image): it leaves no trace of bind on the cluster's nodes and no record of it.

    python functions/bind/uninstall.py --namespace NS --cluster-role-binding NAME --role-binding NAME

1. Revoke bind: delete its ClusterRoleBinding and its records' RoleBinding. bind is still running
   while pre-delete hooks run, and its node watch would advertise again, within milliseconds, the
   resources step 2 removes (functions/bind/advertiser.py offers every changed node); without its
   bindings it can neither patch a node nor write a record. (Nothing is lost for good if the
   uninstall stops here: `helm upgrade` recreates both bindings.)
2. Remove from every node's status capacity and allocatable the resources bind advertised for
   quotas (gpu-scheduler.io/gpu, product.gpu-scheduler.io/<type>: gpu_scheduler/quota.py), with
   the merge patch that deletes a key (null). Nothing else of the node is touched.
3. Delete bind's device records, the Leases of RECORD_SELECTOR in its namespace.

Steps 2 and 3 are repeated until a pass finds nothing left, SETTLE_SECONDS after the previous
one: a request bind had in flight when its bindings went was authorized before, and may land
after the first pass. Exit 0 once clean; 1 if something was still found after MAX_PASSES (the
Job fails, and so does `helm uninstall`: run it again), or on an API error it cannot get past.

Its account may do exactly this (gpu_scheduler.permissions.UNINSTALL and UNINSTALL_RECORDS;
the chart's uninstall.yaml grants it, the bindings by name only).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from gpu_scheduler.quota import is_quota_resource
from gpu_scheduler.records import RECORD_SELECTOR
from kubeapi.client import Kube, load_configuration
from kubeapi.errors import APIError
from kubeapi.kubeconfig import KubeconfigError

SETTLE_SECONDS = 2.0
MAX_PASSES = 10
ATTEMPTS = 5  # per API call, for transient errors (the API server restarting, overloaded)


def say(message: str, **fields: Any) -> None:
    print(json.dumps({"message": message, **fields}), flush=True)


def call(action: Callable[[], Any], sleep: Callable[[float], None] = time.sleep) -> Any:
    """`action`, again after a transient error; None when what it addressed is gone (404)."""
    for attempt in range(ATTEMPTS):
        try:
            return action()
        except APIError as error:
            if error.not_found:
                return None
            if not error.transient or attempt == ATTEMPTS - 1:
                raise
            sleep(1.0 + attempt)
    return None


def revoke(api, namespace: str, cluster_role_binding: str, role_binding: str) -> None:
    for what, delete in ((f"ClusterRoleBinding {cluster_role_binding}", lambda: api.delete_cluster_role_binding(cluster_role_binding)),
                         (f"RoleBinding {namespace}/{role_binding}", lambda: api.delete_role_binding(namespace, role_binding))):
        gone = call(delete) is None
        say(f"bind's {what} {'was already gone' if gone else 'deleted'}")


def advertised(node: dict) -> dict[str, list[str]]:
    """The quota resources in the node's status, by field (capacity, allocatable)."""
    status = node.get("status") or {}
    found = {field: sorted(name for name in (status.get(field) or {}) if is_quota_resource(name))
             for field in ("capacity", "allocatable")}
    return {field: names for field, names in found.items() if names}


def strip_nodes(api) -> list[str]:
    """Every node's advertised quota resources removed; the names of the nodes that had some."""
    stripped = []
    for page, _ in call(lambda: list(api.list_nodes())) or []:
        for node in page:
            name = node["metadata"]["name"]
            found = advertised(node)
            if not found:
                continue
            patch = {"status": {field: dict.fromkeys(names) for field, names in found.items()}}
            if call(lambda: api.patch_node_status(name, patch)) is not None:
                say("node no longer advertises gpu-scheduler's quota resources", node=name, removed=found)
                stripped.append(name)
    return stripped


def delete_records(api, namespace: str) -> list[str]:
    """bind's records in `namespace` deleted (each as it was read; one changed since is found
    again by the next pass); their names."""
    deleted = []
    for page, _ in call(lambda: list(api.list_leases(namespace, RECORD_SELECTOR))) or []:
        for lease in page:
            meta = lease["metadata"]
            try:
                if call(lambda: api.delete_lease(namespace, meta["name"], meta["resourceVersion"])) is not None:
                    deleted.append(meta["name"])
            except APIError as error:
                if not error.conflict:
                    raise
    if deleted:
        say("bind's device records deleted", namespace=namespace, records=len(deleted))
    return deleted


def clean(api, namespace: str, cluster_role_binding: str, role_binding: str,
          sleep: Callable[[float], None] = time.sleep) -> bool:
    """All three steps; True once a pass found nothing left."""
    revoke(api, namespace, cluster_role_binding, role_binding)
    for n in range(MAX_PASSES):
        found = strip_nodes(api) + delete_records(api, namespace)
        if not found and n > 0:
            say("nothing of gpu-scheduler is left on the nodes or in the records", passes=n + 1)
            return True
        sleep(SETTLE_SECONDS)
    say(f"still finding advertised resources or records after {MAX_PASSES} passes")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True, help="bind's namespace (its records)")
    parser.add_argument("--cluster-role-binding", required=True, help="bind's ClusterRoleBinding")
    parser.add_argument("--role-binding", required=True, help="the RoleBinding of bind's records")
    args = parser.parse_args(argv)
    try:
        api = Kube(load_configuration())
        return 0 if clean(api, args.namespace, args.cluster_role_binding, args.role_binding) else 1
    except KubeconfigError as error:
        say("no usable API configuration", error=str(error))
        return 1
    except APIError as error:
        say("the API refused or did not answer", status=error.status, error=error.message)
        return 1


if __name__ == "__main__":
    sys.exit(main())
