"""DefaultBinder (Bind): the Binding, with the pod's UID and version as preconditions and the
devices given written onto the pod (binding.binding_for). A 409 is judged by the pod as it is
now: bound meanwhile (to this node: done; elsewhere), gone, re-created, or changed since the
version decided from (then the shell places it again from the pod as it is)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol

from kubeapi.errors import APIError

from ..binding import ALREADY_BOUND, GONE, RETRY, Bind, binding_for, conflict_outcome, placement_inputs
from ..framework.interface import SUCCESS, BindPlugin, Code, CycleState, Status, api_failure
from ..placement import metadata
from .mapentry import resolved

NAME = "DefaultBinder"
CHANGED = "the pod changed since the version it was placed from"
POD_CHANGED = "PodChanged"  # the reason of that ERROR: the shell reads the pod and places it again, once


class Binder(Protocol):
    """What DefaultBinder writes and reads through the handle."""

    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...
    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...
# Bindings of one pod in one attempt: again at the pod's new version when only its status changed
# since the decision (bind's own PodScheduled=False writes, which land after it decided).
BIND_TRIES = 3


def bind_of(pod, state: CycleState) -> Bind:
    meta, found = metadata(pod), resolved(state)
    return Bind(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")), found.placement.node,
                found.placement.devices, resource_version=str(meta.get("resourceVersion") or ""),
                entry=found.index if found.pooled else None)


class DefaultBinder(BindPlugin):
    name = NAME

    def bind(self, state: CycleState, pod, node, cluster: Binder) -> Status:
        bind = bind_of(pod, state)
        for _ in range(BIND_TRIES):
            try:
                cluster.bind(bind.namespace, bind.name, binding_for(bind))
                return SUCCESS
            except APIError as failure:
                if failure.not_found and failure.kind in ("pods", ""):
                    return Status(Code.ERROR, NAME, "", GONE)
                if not failure.conflict:
                    return api_failure(NAME, "", failure)
            try:
                current = cluster.read_pod(bind.namespace, bind.name)
            except APIError as failure:
                return api_failure(NAME, "reading the pod after a conflict", failure)
            outcome = conflict_outcome(bind, current)
            if outcome == ALREADY_BOUND:
                return Status(Code.SUCCESS, NAME, f"bound to {bind.node} already", already_bound=True)
            if outcome != RETRY:
                break
            version = str(metadata(current).get("resourceVersion") or "")
            if version == bind.resource_version or placement_inputs(current) != placement_inputs(pod):
                break
            # Only its status (or version) changed: what was decided holds; bind at the version now.
            bind = dataclasses.replace(bind, resource_version=version)
        if outcome == RETRY:
            return Status(Code.ERROR, NAME, CHANGED, POD_CHANGED)
        return Status(Code.ERROR, NAME, "", outcome)
