"""Cluster events, as (resource, action): what a plugin registers as able to undo its refusal
(kube-scheduler's ClusterEvent), and what bind's views report to its scheduling queue. An assigned
pod "leaves" a node when it is deleted, finishes (Succeeded/Failed) or is replaced by another
object of the same name."""
from __future__ import annotations

ClusterEvent = tuple[str, str]

NODE_ADD: ClusterEvent = ("Node", "Add")
NODE_UPDATE: ClusterEvent = ("Node", "Update")
POD_LEAVES: ClusterEvent = ("AssignedPod", "Delete")
RECORD_FREED: ClusterEvent = ("Record", "Delete")  # a device record deleted, or taken over, or shared further
RECORD_UPDATE: ClusterEvent = ("Record", "Update")
POD_UPDATE: ClusterEvent = ("Pod", "Update")  # the refused pod itself changed (its map, its selector)
# DRA mode: a node's ResourceSlices (its devices as published) and any ResourceClaim. Claims are
# keyed on no one node (ANY_NODE): the claim that holds a device, or the pod's own claim of a
# former pod of its name, may have been allocated on another node or none.
SLICE_ADD: ClusterEvent = ("ResourceSlice", "Add")
SLICE_UPDATE: ClusterEvent = ("ResourceSlice", "Update")
SLICE_DELETE: ClusterEvent = ("ResourceSlice", "Delete")  # a second pool publishing the same device withdrawn
CLAIM_UPDATE: ClusterEvent = ("ResourceClaim", "Update")  # deallocated, its reservation or owner changed
CLAIM_DELETE: ClusterEvent = ("ResourceClaim", "Delete")
# A namespace's ResourceQuota (its spec: what it counts, for which pods), keyed on no one node:
# GPUQuota refuses a pod only where one counts the GPUs its entry pins, so one deleted, or changed
# to count them no more, undoes a refusal; one added makes it count a pod it did not.
QUOTA_ADD: ClusterEvent = ("ResourceQuota", "Add")
QUOTA_UPDATE: ClusterEvent = ("ResourceQuota", "Update")
QUOTA_DELETE: ClusterEvent = ("ResourceQuota", "Delete")
ANY_NODE = "*"

# How explain words each event: what a waiting pod waits for.
DESCRIBED = {
    NODE_ADD: "the node added",
    NODE_UPDATE: "the node updated",
    POD_LEAVES: "a pod leaving the node",
    RECORD_FREED: "a device record of the node freed",
    RECORD_UPDATE: "a device record of the node updated",
    POD_UPDATE: "a change of the pod",
    SLICE_ADD: "a ResourceSlice of the node added",
    SLICE_UPDATE: "a ResourceSlice of the node updated",
    SLICE_DELETE: "a ResourceSlice of the node deleted",
    CLAIM_UPDATE: "a ResourceClaim updated",
    CLAIM_DELETE: "a ResourceClaim deleted",
    QUOTA_ADD: "a ResourceQuota of the namespace added",
    QUOTA_UPDATE: "a ResourceQuota of the namespace updated",
    QUOTA_DELETE: "a ResourceQuota of the namespace deleted",
}
