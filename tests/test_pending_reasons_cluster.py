"""README "My replica is Pending", row by row, on the real control plane: each row's situation
is put in place and a pod of ours meets it; bind refuses the pod with a FailedScheduling Event
that names the refusing plugin (annotation gpu-scheduler/plugin); then `kubectl gpu-scheduler
explain` on the pod and `plan --cluster` on a manifest that creates it, run as a user granted
exactly permissions.PLUGIN, must give the same plugin and message, and say it is not placeable.

Two rows of the table are left out: `binding to <node>: <API message>` (APIError, Retry) is an
Event only, and so is a ResourceClaim refused by the namespace's device-class quota
(DynamicResources, QuotaExceeded; tests/test_quota_cluster.py shows it). Both are the API refusing
bind's own writes, which neither explain nor plan make: they have nothing to agree on. So is
`binding to <node>: writing the record of GPU …: namespace 'gpu-scheduler' does not exist …`
(GPUsHeld, APIError): bind's configuration, not the pod's situation. The Gang rows are
tests/test_gang_plugin_cluster.py's (GangMemberRefused there).

"Priority and preemption" rows: bind's message is the refusing row's (GPUsHeld here: a pod of
ours holds the GPU) with "; preemption: …" added, and explain must give that message and, on its
`Preemption:` line, the same part ("nobody can be preempted: <reason>" where bind says "nobody
preempted: <reason>"). Nobody preempted: a holder of equal priority, the pod's preemptionPolicy
Never, the holder's PodDisruptionBudget allowing no disruption, and a GPU of the entry held by a
pod of equal priority (it would not fit even with every pod of lower priority gone). "would
preempt X" (explain) and bind's `preemption: preempted X …; placed once they are gone` cannot be
compared: bind evicts X at its first attempt, which changes the state, so explain (run after it)
sees X Terminating and says what bind says next. The test waits for bind's "preempted" Event, then
compares that next message (X terminating; the pod is placed once they are gone), and the row
`GPU … is being freed for <preemptor> …` (GPUsHeld) of a pod of lower priority mapped to a GPU
nominated for the preemptor. The pods evicted stay Terminating (no kubelet) until the namespace
goes.

SchedulingGated (plugin SchedulingGates) is a test of its own: bind writes no Event for a gated
pod, only its PodScheduled condition, whose reason and message explain must give.

Each row's situation is in place before its pod is created, so that bind's first answer is the
row's, except "the pod's claim allocated elsewhere": the claim must be owned by the pod, whose UID
is known only once it exists (bind first says the claim belongs to no pod, then, once the owner is
set, the row's message). The test waits for the Event with the row's message either way.

MalformedMap's pod is created in bind's own namespace, which the webhook (as knative/webhook.yaml
ships it) leaves alone: anywhere else mutate refuses the map. The fresh record's row names a pod
of ours that bind keeps pending for its own reason (a selector): bind counts a record whose pod it
sees neither pending nor on a node as gone, and its GPU as free.


Messages are compared as they are: bind's words stay the same while the situation lasts (the
fresh record's row names times, not an age). That row's record frees its GPU GRACE_SECONDS after
it was written, so the row must finish within that.

`plan` refuses a manifest whose map is malformed, or that has no map at all, outright (exit 2,
naming the document and the line: every pod it creates would be refused), rather than listing its
pods: for those two rows plan's error must carry bind's message (MalformedMap) or say the map is
missing (NoAnnotation).

Each situation has a node of its own (a Node object: Ready with heartbeats, or made not Ready or
cordoned by the row), removed afterwards with the records and claims the test wrote.
"""
from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import pytest
import yaml

from conftest import REPO, release_namespace

from gpu_scheduler.fit import DEVICES_ANNOTATION, SHARE_ANNOTATION, workload
from gpu_scheduler.records import GRACE_SECONDS, MAX_HOLDERS, lease_for, workload_key
from test_dra_cluster import NVIDIA, RESOURCE, admin, dra_pod  # noqa: F401 (admin: a fixture)
from test_end_to_end import pod_manifest, statefulset
from test_fit_cluster import ALLOCATABLE, filler, resources
from test_plugin_cluster import reader, run  # noqa: F401 (reader: a fixture)
from test_preemption_cluster import (
    HIGH, HIGH_NEVER, LOW, PRIORITIES, bound_victim, create_priority_classes, evicted, with_class,
)
from test_preemption_cluster import workload as classed_workload
from test_records_cluster import RECORDS, Nodes

sys.path.insert(0, str(REPO / "functions" / "bind"))  # bind's views, for a cold start's decisions
BIND_NAMESPACE = "gpu-scheduler"  # where the stack's bind keeps its records (functions/bind/placer.py)
PLUGIN_ANNOTATION = "gpu-scheduler/plugin"

# The plugin bind's Event names for each row of the README's table (test id -> plugin).
PLUGINS = {
    "NoMapEntry": "MapEntry",
    "MalformedMap": "MapEntry",
    "UnknownIndex": "MapEntry",
    "NoAnnotation": "MapEntry",
    "NodeExists": "NodeExists",
    "NodeUnschedulable": "NodeUnschedulable",
    "NodeReady": "NodeReady",
    "TaintToleration": "TaintToleration",
    "NodeGPUCapacity": "NodeGPUCapacity",
    "NodeAffinity": "NodeAffinity",
    "NodePorts": "NodePorts",
    "NodeResourcesFit-cpu": "NodeResourcesFit",
    "NodeResourcesFit-pods": "NodeResourcesFit",
    "GPUsHeld-running-pod": "GPUsHeld",
    "GPUsHeld-fresh-record": "GPUsHeld",
    "GPUsHeld-sharing-limit": "GPUsHeld",
    "DynamicResources-allocated-in-another-claim": "DynamicResources",
    "DynamicResources-no-matching-device": "DynamicResources",
    "DynamicResources-claim-allocated-elsewhere": "DynamicResources",
    "GPUQuota": "GPUQuota",
    # "Priority and preemption": the refusing row's plugin, with "; preemption: …" added to its message
    "Preemption-equal-priority": "GPUsHeld",
    "Preemption-never": "GPUsHeld",
    "Preemption-pdb": "GPUsHeld",
    "Preemption-would-not-fit": "GPUsHeld",
    "Preemption-victim-terminating": "GPUsHeld",
    "GPUsHeld-being-freed": "GPUsHeld",
    "PoolEntry": "PoolEntry",
}


def same(message):
    """A message as compared: bind's words are stable while the situation lasts (a record's
    times, not its age), so nothing is blanked out."""
    return message


# -- the situations ------------------------------------------------------------------------------
@dataclass
class Pending:
    """The pod a situation created, the manifest that creates it (for plan), and bind's message."""

    namespace: str
    name: str
    manifest: dict
    message: str | re.Pattern


@dataclass
class Situation:
    stack: object
    namespace: str
    admin: object  # test_dra_cluster's admin client (kubeapi.client.Kube)
    cleanups: list = field(default_factory=list)
    recorded: float | None = None  # when the test wrote a device record (time.monotonic())

    @property
    def uniq(self) -> str:
        return self.namespace[:40].rstrip("-")

    def node(self, spec: dict | None = None, **allocatable: str) -> str:
        """A Ready node of the test's own (labels zone=a, gen=3; 4 cpu, 8 pods, 4 GPUs unless told)."""
        nodes = Nodes(self.stack, f"pr-{self.uniq}"[:50].rstrip("-"), 1, {"zone": "a", "gen": "3"},
                      {**ALLOCATABLE, **allocatable}, spec)
        self.cleanups.append(nodes.remove)
        self.cleanups.append(lambda: self.delete_records(nodes.names[0]))
        return nodes.names[0]

    def bare_node(self, name: str, **options) -> str:
        """A node outside any heartbeat (cordoned, not Ready), as localcp adds one."""
        self.stack.cp.add_node(name, **options)
        self.cleanups.append(lambda: self.stack.cp.kubectl("delete", "node", name, "--ignore-not-found", check=False))
        return name

    def apply(self, manifest: dict) -> dict:
        self.stack.apply(manifest)
        return manifest

    def live(self, name: str, namespace: str | None = None) -> dict | None:
        try:
            return json.loads(self.stack.cp.get(f"/api/v1/namespaces/{namespace or self.namespace}/pods/{name}"))
        except urllib.error.HTTPError as error:
            if error.code == 404:  # not created yet (a StatefulSet's pod)
                return None
            raise

    def record(self, node: str, device: str, holders: list[str], shares: bool, pod: dict) -> None:
        """bind's device record, written as bind writes it, and seen by the stack's bind."""
        meta = pod["metadata"]
        body = lease_for(node, device, holders, shares, f"{meta['namespace']}/{meta['name']}", meta["uid"], time.time())
        self.stack.cp.request("POST", RECORDS, body)
        self.recorded = time.monotonic()
        self.stack.wait_for(lambda: bind_sees_record(self.stack, node, device), 20, f"bind seeing the record of GPU {device}")

    def delete_records(self, node: str) -> None:
        leases = json.loads(self.stack.cp.get(RECORDS))["items"]
        for lease in leases:
            if (lease["metadata"].get("annotations") or {}).get("gpu-scheduler/node") == node:
                try:
                    self.stack.cp.request("DELETE", f"{RECORDS}/{lease['metadata']['name']}")
                except urllib.error.HTTPError as error:
                    if error.code != 404:  # bind may have swept it
                        raise

    def slice_on(self, node: str) -> None:
        """The node publishes gpu-0..gpu-3 as NVIDIA's DRA driver names them (pool: the node)."""
        name = f"{node}-gpus"
        self.admin._call("POST", f"{RESOURCE}/resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": NVIDIA, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(4)]}})
        self.cleanups.append(lambda: self.admin._call("DELETE", f"{RESOURCE}/resourceslices/{name}"))

    def allocated_claim(self, name: str, node: str, device: str) -> None:
        """A ResourceClaim in the test's namespace, allocated the node's `device` (by anyone)."""
        path = f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims"
        claim = self.admin._call("POST", path, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": NVIDIA}}]}}})
        self.cleanups.append(lambda: self.stack.cp.kubectl("delete", "resourceclaim", "-n", self.namespace, name,
                                                           "--ignore-not-found", "--wait=false", check=False))
        claim["status"] = {"allocation": {"devices": {"results": [
            {"request": "one", "driver": NVIDIA, "pool": node, "device": device}]}}}
        self.admin._call("PUT", f"{path}/{name}/status", claim)


def bind_sees_record(stack, node: str, device: str) -> bool:
    """The stack's bind has the record in its view (its gauge gpu_scheduler_gpus_held)."""
    text = urllib.request.urlopen(f"{stack.bind_url}/metrics", timeout=5).read().decode()
    return any(line.startswith("gpu_scheduler_gpus_held{") and f'node="{node}"' in line
               and f'device="{device}"' in line for line in text.splitlines())


def no_map_entry(s: Situation) -> Pending:
    pod = s.apply(pod_manifest(s.namespace, "w-5", f"0=nowhere-{s.uniq}:0\n1=nowhere-{s.uniq}:1\n"))
    return Pending(s.namespace, "w-5", pod, "pod index 5 has no entry in the gpu-scheduling-map annotation (entries: 0, 1)")


def malformed_map(s: Situation) -> Pending:
    # mutate refuses the map at creation: created where the webhook does not look (bind's own
    # namespace is excluded from it, as knative/webhook.yaml ships it).
    name = f"bad-{s.uniq}-1"
    pod = pod_manifest(BIND_NAMESPACE, name, "0=node1:0\n1=node2:2,2\n")
    s.cleanups.append(lambda: s.stack.cp.kubectl("delete", "pod", "-n", BIND_NAMESPACE, name, "--grace-period=0",
                                                 "--force", "--ignore-not-found", check=False))
    s.apply(pod)
    return Pending(BIND_NAMESPACE, name, pod,
                   "invalid gpu-scheduling-map annotation: line 2 '1=node2:2,2': device 2 is listed more than once")


def unknown_index(s: Situation) -> Pending:
    pod = s.apply(pod_manifest(s.namespace, "loose", f"0=nowhere-{s.uniq}:0\n"))
    return Pending(s.namespace, "loose", pod, "pod name 'loose' does not end in -<index> and the pod has no"
                   " apps.kubernetes.io/pod-index label or batch.kubernetes.io/job-completion-index annotation")


def no_annotation(s: Situation) -> Pending:
    pod = s.apply(pod_manifest(s.namespace, "bare-0", None))
    return Pending(s.namespace, "bare-0", pod, "pod has schedulerName 'gpu-scheduler' but no map annotation")


def node_exists(s: Situation) -> Pending:
    node = f"gone-{s.uniq}"
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:0\n"))
    return Pending(s.namespace, "w-0", pod, f"node {node} does not exist")


def node_unschedulable(s: Situation) -> Pending:
    node = s.bare_node(f"cordoned-{s.uniq}", spec={"unschedulable": True})
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:0\n"))
    return Pending(s.namespace, "w-0", pod, f"node {node} is cordoned (spec.unschedulable)")


def node_ready(s: Situation) -> Pending:
    node = s.bare_node(f"notready-{s.uniq}", ready=False)
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:0\n"))
    return Pending(s.namespace, "w-0", pod, f"node {node} is not Ready: gpu-scheduler local control plane heartbeat")


def taint_toleration(s: Situation) -> Pending:
    node = s.node(spec={"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]})
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:0\n"))
    return Pending(s.namespace, "w-0", pod, f"node {node} has taint {{gpu=true: NoSchedule}} that the pod does not tolerate")


def node_gpu_capacity(s: Situation) -> Pending:
    node = s.node()
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:1,5\n"))
    return Pending(s.namespace, "w-0", pod, f"device 5 is beyond node {node}'s 4 nvidia.com/gpu (indexes 0..3)")


def node_affinity(s: Situation) -> Pending:
    node = s.node()
    pod = pod_manifest(s.namespace, "w-0", f"0={node}:0\n")
    pod["spec"]["nodeSelector"] = {"zone": "b"}
    s.apply(pod)
    return Pending(s.namespace, "w-0", pod,
                   f"node(s) didn't match Pod's node affinity/selector: nodeSelector {{zone=b}} excludes node {node}")


def node_ports(s: Situation) -> Pending:
    node = s.node()
    holder = filler(s.namespace, node, "holder")
    holder["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    s.apply(holder)
    pod = pod_manifest(s.namespace, "w-0", f"0={node}:0\n")
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8000, "hostPort": 8080}]
    s.apply(pod)
    return Pending(s.namespace, "w-0", pod, f"node(s) didn't have free ports for the requested pod ports:"
                   f" hostPort 8080/TCP is held by {s.namespace}/holder")


def insufficient_cpu(s: Situation) -> Pending:
    node = s.node()
    s.apply(filler(s.namespace, node, cpu="3500m"))
    pod = s.apply(resources(pod_manifest(s.namespace, "w-0", f"0={node}:0\n"), {"cpu": "2"}))
    return Pending(s.namespace, "w-0", pod, f"node {node}: Insufficient cpu (the pod requests 2;"
                   " 3500m of 4 allocatable is requested by other pods)")


def too_many_pods(s: Situation) -> Pending:
    node = s.node(pods="1")
    s.apply(filler(s.namespace, node))
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:0\n"))
    return Pending(s.namespace, "w-0", pod, f"node {node}: Too many pods (1 of 1 on the node)")


def held_by_a_running_pod(s: Situation) -> Pending:
    node = s.node()
    s.apply(statefulset(s.namespace, f"0={node}:3\n", replicas=1, name="team-a"))
    [holder] = s.stack.wait_bound(s.namespace, 1, "app=team-a")
    s.stack.cp.request("PATCH", f"/api/v1/namespaces/{s.namespace}/pods/team-a-0/status",
                       {"status": {"phase": "Running"}}, "application/strategic-merge-patch+json")
    assert holder["metadata"]["annotations"][DEVICES_ANNOTATION] == "3"
    team_b = s.apply(statefulset(s.namespace, f"0={node}:2,3\n", replicas=1, name="team-b"))
    return Pending(s.namespace, "team-b-0", team_b,
                   re.compile(re.escape(f"GPU 3 on {node} is held by {s.namespace}/team-a-0 (") + ".*"))


def held_by_a_fresh_record(s: Situation) -> Pending:
    """The record another bind instance wrote for its pod just before binding it (or dying). That
    pod is one of ours and pending: bind counts a record of a pod it does not see pending or on a
    node as gone, and free. Its selector keeps bind from binding it here (the instance that wrote
    the record saw the node otherwise, say)."""
    node = s.node()
    other = pod_manifest(s.namespace, "other-0", f"0={node}:1\n")
    other["spec"]["nodeSelector"] = {"zone": "b"}
    s.apply(other)
    binds_event(s, Pending(s.namespace, "other-0", other, re.compile(r"node\(s\) didn't match .*")))
    s.record(node, "1", [workload_key(workload(other))], False, s.live("other-0"))
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0={node}:1,2\n"))
    return Pending(s.namespace, "w-0", pod, re.compile(
        re.escape(f"GPU 1 on {node} was given to {s.namespace}/other-0 ({workload_key(workload(other))}) at ")
        + r"\d\d:\d\d:\d\d UTC" + re.escape(f"; it is free again {GRACE_SECONDS} s after that (")
        + r"\d\d:\d\d:\d\d UTC" + re.escape(") unless that pod is bound")))


def pool_entry_held(s: Situation) -> Pending:
    """A pool pod (gpu-scheduler/pool: "true", as a Deployment's pods are without it) whose map's one
    entry another live pod of its workload (bare pods of one map) holds."""
    node = s.node()
    holder = pod_manifest(s.namespace, "pool-a", f"0={node}:1\n")
    holder["metadata"]["annotations"]["gpu-scheduler/pool"] = "true"
    s.apply(holder)
    [bound] = s.stack.wait_bound(s.namespace, 1)
    assert bound["metadata"]["annotations"]["gpu-scheduler/entry"] == "0"
    pod = pod_manifest(s.namespace, "pool-b", f"0={node}:1\n")
    pod["metadata"]["annotations"]["gpu-scheduler/pool"] = "true"
    s.apply(pod)
    return Pending(s.namespace, "pool-b", pod, (
        f"no entry of the pool is free (1 refused): entry 0 ({node}:1): held by {s.namespace}/pool-a. Add entries to"
        " gpu-scheduling-map, or set maxSurge: 0 on the Deployment so that an old pod leaves before a new one is"
        " created"))


def held_at_the_sharing_limit(s: Situation) -> Pending:
    """MAX_HOLDERS workloads share GPU 1: one has a pod on the node (it keeps the record held),
    the others are only lines of the record."""
    node = s.node()
    sharer = filler(s.namespace, node, "sharer-0")
    sharer["metadata"]["annotations"] = {"gpu-scheduling-map": f"0={node}:1\n# the sharer\n", SHARE_ANNOTATION: "true",
                                         DEVICES_ANNOTATION: "1"}
    s.apply(sharer)
    holders = [workload_key(workload(sharer))] + [f"StatefulSet elsewhere/sharer-{i}" for i in range(MAX_HOLDERS - 1)]
    s.record(node, "1", holders, True, s.live("sharer-0"))
    pod = pod_manifest(s.namespace, "w-0", f"0={node}:1\n")
    pod["metadata"]["annotations"][SHARE_ANNOTATION] = "true"
    s.apply(pod)
    return Pending(s.namespace, "w-0", pod,
                   f"GPU 1 on {node} is shared by {MAX_HOLDERS} workloads already (at most {MAX_HOLDERS})")


def dra_allocated_in_another_claim(s: Situation) -> Pending:
    node = s.node()
    s.slice_on(node)
    s.allocated_claim("theirs", node, "gpu-3")
    pod = s.apply(dra_pod(s.namespace, "d-0", f"0={node}:3\n"))
    return Pending(s.namespace, "d-0", pod, f"map entry 0={node}:3: device 3 ({NVIDIA}/{node}/gpu-3) is allocated in"
                   f" ResourceClaim {s.namespace}/theirs")


def dra_no_matching_device(s: Situation) -> Pending:
    node = s.node()  # no ResourceSlice: the driver does not run there
    pod = s.apply(dra_pod(s.namespace, "d-1", f"1={node}:1\n"))
    return Pending(s.namespace, "d-1", pod, f"map entry 1={node}:1: device 1 matches no device of driver {NVIDIA} on"
                   f" node {node} (looked for a device named 'gpu-1' among 0 devices)")


def dra_claim_allocated_elsewhere(s: Situation) -> Pending:
    """The pod's own claim (<pod>-gpus, owned by the pod) allocated by someone else, to gpu-0."""
    node = s.node()
    s.slice_on(node)
    s.allocated_claim("d-2-gpus", node, "gpu-0")
    pod = s.apply(dra_pod(s.namespace, "d-2", f"2={node}:1\n"))
    # Refused first for the claim's missing owner: the owner set after that is news to bind.
    binds_event(s, Pending(s.namespace, "d-2", pod, re.compile(r".* exists but belongs to no pod, .*")))
    uid = s.live("d-2")["metadata"]["uid"]
    s.admin._call("PATCH", f"{RESOURCE}/namespaces/{s.namespace}/resourceclaims/d-2-gpus",
                  {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "d-2", "uid": uid,
                                                     "controller": True}]}},
                  "application/merge-patch+json")
    return Pending(s.namespace, "d-2", pod, f"ResourceClaim {s.namespace}/d-2-gpus is allocated to other devices or"
                   f" another node ({NVIDIA}/{node}/gpu-0) than its map entry wants ({NVIDIA}/{node}/gpu-1 on {node});"
                   " delete the claim to place the pod again")


def counted_for_less(s: Situation) -> Pending:
    """A pending pod (its node missing) counted for 1 GPU, its map then edited to pin 4, where a
    ResourceQuota of its namespace counts pinned GPUs (without one, the pod is placed)."""
    from test_quota_cluster import quota
    quota(s.stack, s.namespace, {"requests.gpu-scheduler.io/gpu": "100"})
    node = s.node()
    pod = s.apply(pod_manifest(s.namespace, "w-0", f"0=gone-{s.uniq}:0\n"))
    binds_event(s, Pending(s.namespace, "w-0", pod, f"node gone-{s.uniq} does not exist"))
    pod["metadata"]["annotations"]["gpu-scheduling-map"] = f"0={node}:0,1,2,3\n"
    s.stack.api.patch_namespaced_pod("w-0", s.namespace, {"metadata": {"annotations": pod["metadata"]["annotations"]}})
    return Pending(s.namespace, "w-0", pod,
                   f"its map entry pins 4 GPU(s) on node {node}, counted for the namespace's ResourceQuota as"
                   " gpu-scheduler.io/gpu: 4 (it requests 1), which ResourceQuota gpus bounds; the pod was created"
                   " with less (its map annotation changed since, it was created without gpu-scheduler's webhook, or"
                   " the node's GPU type was not known then): re-create it (delete it and create it again:"
                   " gpu-scheduler's webhook counts it when it is created)")


# -- "Priority and preemption": a pod refused on its node, and nobody preempted (or preempted already)
def holder(s: Situation, name: str, entry: str, priority_class: str) -> dict:
    """StatefulSet `name`'s one pod, of `priority_class`, bound by bind with `entry` (node:devices)."""
    create_priority_classes(s.stack, PRIORITIES, HIGH_NEVER)
    s.apply(classed_workload(s.namespace, name, entry, priority_class))
    return bound_victim(s.stack, s.namespace, name)


def preemptor(s: Situation, entry: str, priority_class: str) -> dict:
    return s.apply(with_class(pod_manifest(s.namespace, "urgent-0", f"0={entry}\n"), priority_class))


def held_by(s: Situation, node: str, device: str, pod: str) -> str:
    """The start of GPUsHeld's refusal for a GPU another workload's pod holds (the rest names the
    workload, in words of the pod's or of the record's)."""
    return re.escape(f"GPU {device} on {node} is held by {s.namespace}/{pod}") + r"[ ,].*"


def preemption_equal_priority(s: Situation) -> Pending:
    node = s.node()
    holder(s, "batch", f"{node}:1", HIGH)
    pod = preemptor(s, f"{node}:1", HIGH)
    return Pending(s.namespace, "urgent-0", pod, re.compile(held_by(s, node, "1", "batch-0") + re.escape(
        f"; preemption: nobody preempted: no pod on {node} has a priority lower than this pod's 1000"
        f" ({s.namespace}/batch-0: 1000)")))


def preemption_never(s: Situation) -> Pending:
    node = s.node()
    holder(s, "batch", f"{node}:1", LOW)
    pod = preemptor(s, f"{node}:1", HIGH_NEVER)
    return Pending(s.namespace, "urgent-0", pod, re.compile(held_by(s, node, "1", "batch-0") + re.escape(
        "; preemption: nobody preempted: the pod's preemptionPolicy is Never")))


def preemption_pdb(s: Situation) -> Pending:
    """The holder's budget (minAvailable 1 of its 1 replica) allows no disruption: seen by the
    budget's controller (its status) before the preemptor is created."""
    node = s.node()
    holder(s, "batch", f"{node}:1", LOW)
    s.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "batch", "namespace": s.namespace},
             "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "batch"}}}})
    s.stack.wait_for(lambda: (json.loads(s.stack.cp.get(
        f"/apis/policy/v1/namespaces/{s.namespace}/poddisruptionbudgets/batch")).get("status") or {})
        .get("currentHealthy") is not None, 30, "the budget's status")
    pod = preemptor(s, f"{node}:1", HIGH)
    return Pending(s.namespace, "urgent-0", pod, re.compile(held_by(s, node, "1", "batch-0") + re.escape(
        f"; preemption: nobody preempted: evicting {s.namespace}/batch-0 would violate its PodDisruptionBudget"
        f" {s.namespace}/batch allows 0 disruptions now")))


def preemption_would_not_fit(s: Situation) -> Pending:
    """GPU 1 held by a pod of lower priority, GPU 2 by one of equal priority: evicting the first
    would not be enough, so nobody is."""
    node = s.node()
    holder(s, "low", f"{node}:1", LOW)
    holder(s, "peer", f"{node}:2", HIGH)
    pod = preemptor(s, f"{node}:1,2", HIGH)
    return Pending(s.namespace, "urgent-0", pod, re.compile(held_by(s, node, "1", "low-0") + re.escape(
        f"; preemption: nobody preempted: even with every pod of lower priority than 1000 gone from {node}, the pod"
        " would not fit: ") + held_by(s, node, "2", "peer-0")))


def preempted(s: Situation, entry: str) -> tuple[str, dict]:
    """bind preempts the holder of GPU 1 (a pod of lower priority) for urgent-0, mapped to `entry`:
    its first Event says so (the README's row "preemption: preempted …"); the victim stays
    Terminating (no kubelet), and the devices of urgent-0's entry are nominated for it. The node and
    urgent-0's manifest."""
    node = s.node()
    victim = holder(s, "batch", f"{node}:1", LOW)
    pod = preemptor(s, entry.format(node=node), HIGH)
    binds_event(s, Pending(s.namespace, "urgent-0", pod, re.compile(held_by(s, node, "1", "batch-0") + re.escape(
        f"; preemption: preempted {s.namespace}/batch-0 (priority 10) on {node}; placed once they are gone"))))
    evicted(s.stack, s.namespace, victim)
    return node, pod


def preemption_victim_terminating(s: Situation) -> Pending:
    """After the eviction, what bind says to the preemptor while the victim terminates (it says
    "preempted …" once: explain, run after it, sees the victim Terminating, and says this)."""
    node, pod = preempted(s, "{node}:1")
    s.stack.ping()  # tried again now, rather than on the victim's leaving
    return Pending(s.namespace, "urgent-0", pod, re.compile(held_by(s, node, "1", "batch-0") + re.escape(
        f"; preemption: {s.namespace}/batch-0 terminating on {node}; the pod is placed once they are gone")))


def held_for_a_preemptor(s: Situation) -> Pending:
    """urgent-0 maps GPUs 1 and 2 and preempts GPU 1's holder: both are nominated for it; a pod of
    the default priority mapped to GPU 2 (free, but nominated) waits."""
    node, _ = preempted(s, "{node}:1,2")
    pod = s.apply(pod_manifest(s.namespace, "other-0", f"0={node}:2\n"))
    return Pending(s.namespace, "other-0", pod, re.compile(re.escape(
        f"GPU 2 on {node} is being freed for {s.namespace}/urgent-0 (priority 1000), which preempted its holder,"
        " until ") + r"\d\d:\d\d:\d\d UTC"))


SITUATIONS = {
    "NoMapEntry": no_map_entry,
    "MalformedMap": malformed_map,
    "UnknownIndex": unknown_index,
    "NoAnnotation": no_annotation,
    "NodeExists": node_exists,
    "NodeUnschedulable": node_unschedulable,
    "NodeReady": node_ready,
    "TaintToleration": taint_toleration,
    "NodeGPUCapacity": node_gpu_capacity,
    "NodeAffinity": node_affinity,
    "NodePorts": node_ports,
    "NodeResourcesFit-cpu": insufficient_cpu,
    "NodeResourcesFit-pods": too_many_pods,
    "GPUsHeld-running-pod": held_by_a_running_pod,
    "GPUsHeld-fresh-record": held_by_a_fresh_record,
    "GPUsHeld-sharing-limit": held_at_the_sharing_limit,
    "DynamicResources-allocated-in-another-claim": dra_allocated_in_another_claim,
    "DynamicResources-no-matching-device": dra_no_matching_device,
    "DynamicResources-claim-allocated-elsewhere": dra_claim_allocated_elsewhere,
    "GPUQuota": counted_for_less,
    "Preemption-equal-priority": preemption_equal_priority,
    "Preemption-never": preemption_never,
    "Preemption-pdb": preemption_pdb,
    "Preemption-would-not-fit": preemption_would_not_fit,
    "Preemption-victim-terminating": preemption_victim_terminating,
    "GPUsHeld-being-freed": held_for_a_preemptor,
    "PoolEntry": pool_entry_held,
}
assert SITUATIONS.keys() == PLUGINS.keys()


@pytest.fixture
def situation(stack, namespace, admin):
    made = Situation(stack, namespace, admin)
    yield made
    for cleanup in reversed(made.cleanups):
        cleanup()


# -- what each says ------------------------------------------------------------------------------
def failed_scheduling(stack, namespace: str, uid: str) -> list[dict]:
    query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.uid={uid}"})
    events = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events?{query}"))["items"]
    return [e for e in events if e.get("reason") == "FailedScheduling"]


def matches(expected: str | re.Pattern, message: str) -> bool:
    return bool(expected.fullmatch(message)) if isinstance(expected, re.Pattern) else message == expected


def binds_event(s: Situation, pending: Pending) -> dict:
    """bind's FailedScheduling Event with the row's message (others may come first: see the module)."""
    uid = s.stack.wait_for(lambda: (s.live(pending.name, pending.namespace) or {}).get("metadata", {}).get("uid"),
                           30, f"the pod {pending.name}")

    def found():
        return next((e for e in failed_scheduling(s.stack, pending.namespace, uid)
                     if matches(pending.message, e["message"])), None)
    try:
        # bind's first answer may be another (its view behind the API server): its queue tries the pod
        # again on the change, and within 60 s in any case.
        return s.stack.wait_for(found, 75, f"bind's FailedScheduling Event for {pending.name}")
    except TimeoutError as timeout:
        seen = [e["message"] for e in failed_scheduling(s.stack, pending.namespace, uid)]
        pod = s.live(pending.name, pending.namespace) or {}
        raise AssertionError(f"{timeout}: expected {pending.message!r}, bind said {seen}; the pod's node:"
                             f" {pod.get('spec', {}).get('nodeName')}, conditions:"
                             f" {pod.get('status', {}).get('conditions')}") from None


def explained(pending: Pending, kubeconfig: str) -> dict:
    code, out, err = run("explain", f"pod/{pending.name}", "-n", pending.namespace, "--kubeconfig", kubeconfig,
                         "--scheduler-namespace", BIND_NAMESPACE, "-o", "json")
    try:
        answer = json.loads(out)
        scheduling = answer["scheduling"]
        return {"action": scheduling.get("action"), "plugin": scheduling.get("plugin"),
                "message": same(scheduling.get("message")), "placeable": answer.get("placeable"),
                "preemption": scheduling.get("preemption")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"exit": code, "stderr": err.strip(), "stdout": out[:300]}


def planned(pending: Pending, kubeconfig: str, path) -> dict:
    path.write_text(yaml.safe_dump(pending.manifest))
    code, out, err = run("plan", "-f", str(path), "--cluster", "--kubeconfig", kubeconfig,
                         "--scheduler-namespace", BIND_NAMESPACE, "-o", "json")
    try:
        [row] = [p for w in json.loads(out)["workloads"] for p in w["pods"] if p["pod"] == pending.name]
        cluster = row["cluster"]
        return {"decision": cluster.get("decision"), "plugin": cluster.get("plugin"),
                "message": same(cluster.get("message")), "placeable": row.get("placeable")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"exit": code, "stderr": err.strip(), "stdout": out[:300]}


def preemption_line(message: str) -> str | None:
    """explain's `Preemption:` line for bind's message: the part after "; preemption: ", in
    explain's words ("nobody can be preempted: <reason>" where bind says "nobody preempted: <reason>";
    the rest the same); None where bind's message has no such part."""
    if "; preemption: " not in message:
        return None
    said = message.split("; preemption: ", 1)[1]
    if said.startswith("nobody preempted: "):
        return "nobody can be preempted: " + said.removeprefix("nobody preempted: ")
    return said


# The rows whose manifest plan refuses outright, and what its error must say, given bind's message.
MANIFEST_ERRORS = {
    "MalformedMap": lambda message: message,
    "NoAnnotation": lambda message: "metadata.annotations has no gpu-scheduling-map",
}


@pytest.mark.parametrize("row", list(PLUGINS))
def test_pending_row(stack, reader, situation, row, tmp_path):
    pending = SITUATIONS[row](situation)
    event = binds_event(situation, pending)
    assert (event["type"], event["source"].get("component")) == ("Warning", "gpu-scheduler")

    def refused():
        pod = situation.live(pending.name, pending.namespace)
        assert not pod["spec"].get("nodeName"), f"{pending.name} was bound to {pod['spec']['nodeName']}"
        return next((c for c in pod["status"].get("conditions") or []
                     if c["type"] == "PodScheduled" and c["status"] == "False"), None)
    stack.wait_for(refused, 10, "PodScheduled False")

    verdicts = {"bind": {"plugin": (event["metadata"].get("annotations") or {}).get(PLUGIN_ANNOTATION),
                         "message": same(event["message"])},
                "explain": explained(pending, reader),
                "plan": planned(pending, reader, tmp_path / "manifest.yaml")}
    if situation.recorded is not None and row == "GPUsHeld-fresh-record":
        # Past its grace the record is free, and what explain and plan said compared nothing.
        assert time.monotonic() - situation.recorded < GRACE_SECONDS, "too slow for the record's grace"
    message = same(event["message"])
    said = {"bind": {"plugin": PLUGINS[row], "message": message},
            "explain": {"action": "wait", "plugin": PLUGINS[row], "message": message, "placeable": False,
                        "preemption": preemption_line(message)}}
    if row in MANIFEST_ERRORS:  # plan refuses the manifest itself: see the module's docstring
        refused_manifest = verdicts.pop("plan")
        assert refused_manifest["exit"] == 2 and MANIFEST_ERRORS[row](message) in refused_manifest["stderr"]
        assert verdicts == said
        assert_scoped_decides_as_whole(situation, pending, message)
        return
    # bind and explain first (a preemption row's Preemption: line among them), then plan
    assert {who: verdicts[who] for who in said} == said
    assert verdicts == {**said, "plan": {"decision": "wait", "plugin": PLUGINS[row], "message": message,
                                         "placeable": False}}
    assert_scoped_decides_as_whole(situation, pending, message)


# -- a cold start's scoped reads (issue 62) ---------------------------------------------------------
def decided(admin, pod: dict, scoped: bool) -> dict:
    """What a fresh bind decides for `pod` (the framework's decide: PreFilter and Filter, what
    bind's cycle and explain both start from), on views listed as a starting bind lists them:
    every view but the pods' whole; the pods' whole too, or (`scoped`) only bind's pending pods,
    then the pod's namespace's and its node's, read for it (functions/bind/scope.py)."""
    from handle import AttemptHandle
    from gpu_scheduler.plugins.config import SchedulerConfig
    from gpu_scheduler.plugins.registry import new_framework
    from schedqueue import SchedulingQueue
    from views import Views

    views = Views(admin, BIND_NAMESPACE, SchedulingQueue(), dra=True, quotas=True)
    for informer in views.informers:  # each listing once, in this thread: no watches are left behind
        if informer.name != "pods" or not scoped:
            informer._list_once()
    if scoped:
        views.scope._list_pending()
        assert views.can_place() and not views.pods_listed()
        views.cover((pod["metadata"]["namespace"],))
    else:
        assert views.pods_listed()
    handle = AttemptHandle(admin, views, BIND_NAMESPACE, (pod,))
    handle.group_formed((pod,))
    decision = new_framework(SchedulerConfig(quota=True)).decide(pod, handle.snapshot)
    return {"code": decision.status.code.name, "plugin": decision.status.plugin,
            "message": decision.status.message, "node": decision.node_name, "devices": decision.devices}


def assert_scoped_decides_as_whole(s: Situation, pending: Pending, message: str) -> None:
    """A cold start decides the row's pod from scoped reads as the whole view does: the same
    refusal, plugin and words (bind's own, less what preemption adds), so that a placement is never
    made from a scoped view where the whole one refuses; bind holds a scoped refusal until its whole
    view is in, and says the whole view's."""
    pod = s.live(pending.name, pending.namespace)
    whole, scoped = decided(s.admin, pod, scoped=False), decided(s.admin, pod, scoped=True)
    assert scoped == whole
    assert whole["code"] != "SUCCESS" and whole["message"] == message.split("; preemption: ", 1)[0]


def test_scoped_reads_place_a_pod_as_the_whole_view_does(stack, situation):
    """The placement side of the rows above: on a node with another pod's cpu and a GPU held by a
    running pod of ours, a pod that fits is placed from scoped reads on the node and devices the
    whole view places it on."""
    held_by_a_running_pod(situation)
    node = situation.live("team-a-0")["spec"]["nodeName"]
    situation.apply(filler(situation.namespace, node, cpu="2"))
    pod = resources(pod_manifest(situation.namespace, "fits-0", f"0={node}:2\n"), {"cpu": "1"})
    pod["metadata"]["uid"] = "3f1c0de4-0000-4000-8000-000000000062"  # never created: only decided
    whole, scoped = decided(situation.admin, pod, scoped=False), decided(situation.admin, pod, scoped=True)
    assert whole == scoped == {"code": "SUCCESS", "plugin": "", "message": "", "node": node, "devices": ("2",)}


def test_scoped_reads_free_the_gpu_of_a_deleted_pods_record(stack, situation):
    """A woken bind's commonest case: the pod a fresh record names was deleted while bind slept.
    The whole view knows it gone (absent from a listing newer than the record) and places on its
    GPU; scoped reads read that pod by name and place the same."""
    node = situation.node()
    situation.apply(pod_manifest(situation.namespace, "gone-0", None, scheduler="nobody"))  # nobody places it
    holder = stack.wait_for(lambda: situation.live("gone-0"), 30, "the pod gone-0")
    situation.record(node, "1", [workload_key(workload(holder))], False, holder)
    stack.cp.kubectl("delete", "pod", "-n", situation.namespace, "gone-0", "--grace-period=0", "--force")
    stack.wait_for(lambda: situation.live("gone-0") is None, 30, "gone-0 deleted")
    pod = pod_manifest(situation.namespace, "w-0", f"0={node}:1\n")
    pod["metadata"]["uid"] = "3f1c0de4-0000-4000-8000-000000000064"  # never created: only decided
    whole, scoped = decided(situation.admin, pod, scoped=False), decided(situation.admin, pod, scoped=True)
    assert whole == scoped == {"code": "SUCCESS", "plugin": "", "message": "", "node": node, "devices": ("1",)}


@pytest.mark.parametrize("requested, fits", [("1", True), ("2", False)])
def test_scoped_reads_count_the_pods_of_every_namespace_on_the_node(stack, situation, requested, fits):
    """The node's pods come from its own reading (spec.nodeName), not from the pod's namespace:
    another namespace's pod using 2.5 of the node's 4 cpu leaves room for 1, not for 2, from
    scoped reads as from the whole view."""
    node = situation.node()
    other = f"{situation.uniq[:40]}-other"
    stack.create_namespace(other)
    try:
        situation.apply(filler(other, node, cpu="2500m"))
        pod = resources(pod_manifest(situation.namespace, "w-0", f"0={node}:0\n"), {"cpu": requested})
        pod["metadata"]["uid"] = "3f1c0de4-0000-4000-8000-000000000063"  # never created: only decided
        whole, scoped = decided(situation.admin, pod, scoped=False), decided(situation.admin, pod, scoped=True)
        assert scoped == whole
        assert (whole["code"] == "SUCCESS") is fits and (whole["plugin"] == "NodeResourcesFit") is not fits
    finally:
        release_namespace(stack, other)


# -- SchedulingGated (plugin SchedulingGates, PreEnqueue) -------------------------------------------
# EXPECTED TO FAIL until bind's PreEnqueue change (the SchedulingGates plugin) lands: without it bind
# tries the gated pod as any other, and the API server refuses its Binding (a FailedScheduling Event
# "binding to …"), while explain does not name the gates. A test of its own, to be seen apart.
GATES = ("example.com/kueue", "example.com/admission-check")


def test_pending_row_scheduling_gated(stack, reader, situation):
    """A pod held by spec.schedulingGates: bind leaves it alone (no Event, not bound); its
    PodScheduled condition (False, SchedulingGated, written by the API server at creation) is all it
    says, and explain gives the same reason, plugin SchedulingGates, in kube-scheduler's words for
    it ("waiting for scheduling gates: [...]"), naming each gate.
    The gates removed (by the controller that set them), bind places it."""
    node = situation.node()
    pod = pod_manifest(situation.namespace, "w-0", f"0={node}:0\n")
    pod["spec"]["schedulingGates"] = [{"name": gate} for gate in GATES]
    situation.apply(pod)
    uid = stack.wait_for(lambda: (situation.live("w-0") or {}).get("metadata", {}).get("uid"), 30, "the pod w-0")
    # a resync tries every pending pod of ours now and answers once their outcomes are in: a gated
    # one too, were bind to try it (tests/test_schedulinggates_cluster.py checks the absence of
    # records and Events more closely)
    stack.wait_for(lambda: stack.ping().get("result") == "resynced", 60, "a resync of bind's")

    live = situation.live("w-0")
    assert not live["spec"].get("nodeName"), f"w-0 bound to {live['spec']['nodeName']}"
    assert [e["message"] for e in failed_scheduling(stack, situation.namespace, uid)] == []
    condition = next((c for c in live["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "SchedulingGated"), (
        live["status"])

    code, out, err = run("explain", "pod/w-0", "-n", situation.namespace, "--kubeconfig", reader,
                         "--scheduler-namespace", BIND_NAMESPACE, "-o", "json")
    try:
        scheduling = json.loads(out)["scheduling"]
        explain = {"action": scheduling.get("action"), "plugin": scheduling.get("plugin"),
                   "reason": scheduling.get("reason"), "message": scheduling.get("message"),
                   "placeable": json.loads(out).get("placeable")}
    except (ValueError, KeyError, TypeError):
        explain = {"exit": code, "stderr": err.strip(), "stdout": out[:300]}
    assert explain == {"action": "wait", "plugin": "SchedulingGates", "reason": condition["reason"],
                       "message": f"waiting for scheduling gates: [{' '.join(GATES)}]", "placeable": False}
    assert all(gate in explain["message"] for gate in GATES), explain["message"]

    # the gates removed: a change of the pod, tried again at once
    stack.cp.request("PATCH", f"/api/v1/namespaces/{situation.namespace}/pods/w-0", {"spec": {"schedulingGates": None}},
                     "application/merge-patch+json")
    stack.wait_for(lambda: (situation.live("w-0") or {}).get("spec", {}).get("nodeName") == node, 30,
                   "w-0 bound once its gates are gone")
