"""Kubernetes Events and pod conditions as kube-scheduler writes them, built without I/O.

One failure reason for one pod object maps to one Event name, so a repeated failure counts up
that Event instead of adding a new one per retry.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from . import SCHEDULER_NAME

NORMAL, WARNING = "Normal", "Warning"
SCHEDULED = "Scheduled"
FAILED_SCHEDULING = "FailedScheduling"
UNSCHEDULABLE = "Unschedulable"      # the pod cannot go where its map says, for now
SCHEDULER_ERROR = "SchedulerError"  # the API refused or failed
SHARED_DEVICES = "SharedDevices"
DEVICE_PLUGIN_REQUEST = "GPUResourceRequested"
# On a FailedScheduling Event: the framework plugin that refused the pod (explain shows it).
PLUGIN_ANNOTATION = "gpu-scheduler/plugin"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> "PodRef":
        meta = pod.get("metadata") or {}
        return cls(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def event_name(pod: PodRef, reason: str, message: str) -> str:
    digest = hashlib.sha256(f"{pod.uid}\0{reason}\0{message}".encode()).hexdigest()[:16]
    return f"{pod.name[:200]}.{digest}"


def event_for(pod: PodRef, kind: str, reason: str, message: str, now: str, instance: str,
              action: str = "Scheduling", annotations: Mapping[str, str] | None = None, key: str = "") -> dict[str, Any]:
    """The Event, named for its pod, reason and message (or `key`: one Event whose message changes)."""
    meta: dict[str, Any] = {"name": event_name(pod, reason, key or message), "namespace": pod.namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": meta,
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                           "uid": pod.uid},
        "type": kind, "reason": reason, "message": message[:1024],
        "source": {"component": SCHEDULER_NAME},
        "reportingComponent": SCHEDULER_NAME, "reportingInstance": instance, "action": action,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def recount(count: int, now: str) -> dict[str, Any]:
    """The merge patch for one more occurrence of an existing Event."""
    return {"count": count, "lastTimestamp": now}


def scheduled_message(pod: PodRef, node: str) -> str:
    return f"Successfully assigned {pod} to {node}"


def unscheduled_condition(reason: str, message: str, now: str) -> dict[str, Any]:
    """The pods/status strategic-merge patch kube-scheduler writes when it cannot place a pod."""
    return {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason,
                                       "message": message[:1024], "lastProbeTime": None,
                                       "lastTransitionTime": now}]}}
