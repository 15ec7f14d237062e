"""What the plugin reads from the cluster, with bind's client (kubeapi), each thing once."""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from gpu_scheduler.plugins.dynamicresources import allocator as dra
from gpu_scheduler.fit import NodeInfo, is_terminal
from gpu_scheduler.framework.snapshot import DraSupport, NodeSnapshot
from gpu_scheduler.plugins.dynamicresources.plugin import claim_key
from gpu_scheduler.quota import gpu_quotas, quota_view
from gpu_scheduler.records import RECORD_SELECTOR, EntryRecord, Record

from kubeapi.errors import APIError

from kubeapi.client import Kube


def or_none(read, *args, **kwargs) -> dict | None:
    """What `read` returns, or None where the API server says it does not exist (404)."""
    try:
        return read(*args, **kwargs)
    except APIError as error:
        if error.not_found and error.kind != "namespaces":
            return None
        raise


class Cluster:
    def __init__(self, api: Kube):
        self.api = api
        self._nodes: dict[str, dict | None] = {}
        self._pods_on: dict[str, list[dict]] = {}
        self._pods_in: dict[str, list[dict]] = {}
        self._slices: list[dict] | None = None
        self._claims: list[dict] | None = None
        self._records: dict[str, list[Record]] = {}
        self._entry_records: dict[str, list[EntryRecord]] = {}
        self._gone_pods: dict[tuple[str, str, str], bool] = {}
        self._dra: DraSupport | None = None
        self._quotas: dict[str, list[dict] | None] = {}
        self._listed: dict[tuple[str, str], dict] | None = None  # every pod by (namespace, name), once kept
        # By node, worked out once: `gpus` asks for hundreds of nodes' snapshots from one read.
        self._node_infos: dict[str, NodeInfo] = {}
        self._records_on: dict[str, dict[str, tuple[dict[str, Record], dict[tuple[str, int], EntryRecord]]]] = {}

    def keep(self, nodes: Sequence[dict], pods: Sequence[dict], records_namespace: str, records: list[Record],
             entries: list[EntryRecord], slices: Sequence[dict] | None,
             pods_on: Mapping[str, list[dict]] | None = None) -> None:
        """What `gpus` listed, kept as if read here: every node, gpu-scheduler's pods (by name, for
        "is a record's pod gone": records name bind's own pods; by namespace, for a gang's members:
        they are ours too), bind's records, the slices where served, and every pod of the nodes in
        `pods_on`. explain's verdicts for its pending pods read none of it again; a node not in
        `pods_on` has its pods read when asked, as ever."""
        namespaced: dict[str, list[dict]] = {}
        self._listed = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            namespace = str(meta.get("namespace") or "")
            namespaced.setdefault(namespace, []).append(pod)
            self._listed[(namespace, str(meta.get("name") or ""))] = pod
        for node in nodes:
            name = (node.get("metadata") or {}).get("name")
            if isinstance(name, str) and name:
                self._nodes[name] = node
        self._pods_on.update(pods_on or {})
        self._pods_in.update(namespaced)
        self._records[records_namespace], self._entry_records[records_namespace] = records, entries
        self._records_on.pop(records_namespace, None)
        self._node_infos.clear()
        if slices is not None:
            self._slices = list(slices)

    def forget(self) -> None:
        """Read everything anew from now on (`gpus --watch` draws the cluster as it is at each change)."""
        self.__init__(self.api)

    def node(self, name: str) -> dict | None:
        """The node, or None when it does not exist (as bind sees it)."""
        if name not in self._nodes:
            self._nodes[name] = or_none(self.api.read_node, name)
        return self._nodes[name]

    def nodes(self) -> list[str]:
        """Every node's name, sorted (suggest's candidates), each node kept for node()."""
        for page, _ in self.api.list_nodes():
            for item in page:
                name = (item.get("metadata") or {}).get("name")
                if isinstance(name, str) and name:
                    self._nodes[name] = item
        return sorted(name for name, node in self._nodes.items() if node is not None)

    def pods_on(self, node: str) -> list[dict]:
        """The pods bound to `node`, in all namespaces (what the fit and GPU checks count)."""
        if node not in self._pods_on:
            self._pods_on[node] = self.api.list_pods(f"spec.nodeName={node}")
        return self._pods_on[node]

    def pods_in(self, namespace: str) -> list[dict]:
        """The pods of a namespace (a gang's members are among them), read once."""
        if namespace not in self._pods_in:
            self._pods_in[namespace] = [item for page, _ in self.api.list_namespaced_pods(namespace) for item in page]
        return self._pods_in[namespace]

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return or_none(self.api.read_pod, namespace, name)

    def gpu_quotas(self, namespace: str) -> list[dict[str, str]]:
        """The namespace's ResourceQuotas on GPUs and their use (quota.gpu_quotas), read once."""
        quotas = self.resource_quotas(namespace)
        if quotas is None:
            quotas = self.api.list_resource_quotas(namespace)  # its error, as before
        return gpu_quotas(quotas)

    def resource_quotas(self, namespace: str) -> list[dict] | None:
        """The namespace's ResourceQuotas, read once; None where the user may not list them (GPUQuota
        then takes any to count the pod's GPUs: the refusal bind makes where one does)."""
        if namespace not in self._quotas:
            try:
                self._quotas[namespace] = self.api.list_resource_quotas(namespace)
            except APIError as error:
                if error.status not in (403, 404):
                    raise
                self._quotas[namespace] = None
        return self._quotas[namespace]

    def quota_views(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, tuple[dict, ...]] | None:
        """The ResourceQuotas of the pods' namespaces, as bind's snapshots carry them (GPUQuota)."""
        views = {}
        for pod in pods:
            if not (pod.get("metadata") or {}).get("uid"):
                continue  # not created yet: GPUQuota does not check it (mutate will count it)
            namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
            quotas = self.resource_quotas(namespace)
            if quotas is None:
                return None
            views[namespace] = tuple(quota_view(q) for q in quotas)
        return views

    def events(self, pod: dict[str, Any]) -> list[dict]:
        meta = pod.get("metadata") or {}
        return self.api.list_events(meta.get("namespace", ""), f"involvedObject.uid={meta.get('uid', '')}")

    # -- DRA mode ----------------------------------------------------------------------------------
    def pdbs(self) -> list[dict]:
        """The cluster's PodDisruptionBudgets, as preemption weighs them; none when the user may not
        list them (explain's preemption line then counts no budget, where bind does)."""
        try:
            return [pdb for items, _ in self.api.list_pdbs() for pdb in items]
        except APIError as error:
            if error.status in (403, 404):
                return []
            raise

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
        return or_none(self.api.read_resource_claim, namespace, name)

    # -- bind's device records ---------------------------------------------------------------------
    def records(self, namespace: str) -> list[Record]:
        """bind's device records (Leases in its namespace), read once."""
        self._read_records(namespace)
        return self._records[namespace]

    def entry_records(self, namespace: str) -> list[EntryRecord]:
        """bind's pool entry records (Leases in its namespace, read with the device records)."""
        self._read_records(namespace)
        return self._entry_records[namespace]

    def _records_of(self, node: str, namespace: str) -> tuple[dict[str, Record], dict[tuple[str, int], EntryRecord]]:
        """bind's device and entry records of one node, by device and by (pool, entry)."""
        if namespace not in self._records_on:
            on: dict[str, tuple[dict[str, Record], dict[tuple[str, int], EntryRecord]]] = {}
            for record in self.records(namespace):
                on.setdefault(record.node, ({}, {}))[0][record.device] = record
            for entry in self.entry_records(namespace):
                on.setdefault(entry.node, ({}, {}))[1][(entry.pool, entry.entry)] = entry
            self._records_on[namespace] = on
        return self._records_on[namespace].get(node, ({}, {}))

    def _read_records(self, namespace: str) -> None:
        if namespace in self._records:
            return
        leases = [lease for page, _ in self.api.list_leases(namespace, RECORD_SELECTOR) for lease in page]
        self._records[namespace] = [record for record in map(Record.of, leases) if record is not None]
        self._entry_records[namespace] = [entry for entry in map(EntryRecord.of, leases) if entry is not None]

    def _gone(self, record: Record | EntryRecord) -> bool:
        """The pod a record was last written for no longer exists (or is another pod now); asked
        once per pod (a pool's replicas are decided on the same nodes one after another)."""
        namespace, _, name = record.last_pod.partition("/")
        if not namespace or not name:
            return False
        key = (namespace, name, record.last_uid)
        if key not in self._gone_pods:
            pod = self._listed.get((namespace, name)) if self._listed is not None else self.pod(namespace, name)
            meta = (pod or {}).get("metadata") or {}
            # bind's rule (its cache's gone_of): a pod that finished holds nothing, nor one deleted before it was bound
            self._gone_pods[key] = (pod is None or meta.get("uid") != record.last_uid or is_terminal(pod)
                                    or (bool(meta.get("deletionTimestamp")) and not (pod.get("spec") or {}).get("nodeName")))
        return self._gone_pods[key]

    def dra_support(self) -> DraSupport:
        if self._dra is None:
            try:
                self.resource_slices()
                self._dra = DraSupport.SERVED
            except APIError as error:
                if not error.not_found:
                    raise
                self._dra = DraSupport.NOT_SERVED
        return self._dra

    def gang_snapshot(self, node: str, pods: Sequence[Mapping[str, Any]], records_namespace: str) -> NodeSnapshot:
        """The node as a gang's members are decided on it: snapshot() with every member's own
        claim (in DRA mode each member is decided with its claim, as bind's views hold them all)."""
        snapshots = [self.snapshot(node, pod, records_namespace) for pod in pods if dra.uses_dra(pod)]
        if not snapshots:
            return self.snapshot(node, pods[0] if pods else {}, records_namespace)
        claims = {key: claim for snapshot in snapshots for key, claim in snapshot.claims.items()}
        return NodeSnapshot(**{**snapshots[0].__dict__, "claims": claims, "quotas": self.quota_views(pods)})

    def snapshot(self, node: str, pod: Mapping[str, Any], records_namespace: str) -> NodeSnapshot:
        """The pod's node as bind's framework decides on it: the node, its pods, bind's records of
        its devices, and in DRA mode its slices and the claims (read now, as bind's views hold them)."""
        obj = self.node(node)
        records, entries = self._records_of(node, records_namespace)
        gone = frozenset(r.last_uid for r in (*records.values(), *entries.values()) if r.last_uid and self._gone(r))
        if node not in self._node_infos:
            self._node_infos[node] = NodeInfo.of(self.pods_on(node) if obj else ())
        base = NodeSnapshot(name=node, node=obj, info=self._node_infos[node],
                            records=records, gone=gone, now=time.time(), quotas=self.quota_views([pod] if pod else []),
                            entries=entries)
        if not dra.uses_dra(pod) or self.dra_support() is DraSupport.NOT_SERVED:
            return NodeSnapshot(**{**base.__dict__, "dra": self.dra_support() if dra.uses_dra(pod) else DraSupport.SERVED})
        namespace, name = claim_key(pod)
        claim = self.resource_claim(namespace, name)
        slices = tuple(s for s in self.resource_slices() if (s.get("spec") or {}).get("nodeName") == node)
        return NodeSnapshot(**{**base.__dict__, "slices": slices, "held": dra.allocated(self.resource_claims()),
                               "claims": {(namespace, name): claim} if claim is not None else {}})
