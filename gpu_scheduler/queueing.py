"""Which cluster events can undo a refusal, and how long a pod waits before it is tried again:
kube-scheduler's EventsToRegister and queueing hints (noderesources/fit.go and the other
filters), and its pod backoff, for bind's filters. Pure: bind's scheduling queue asks these.

A pod refused by a filter waits as unschedulable until an event that filter registered happens on
the pod's node (its holder leaves, the node becomes Ready or gains the label, a filler is
deleted), or UNSCHEDULABLE_FLUSH_SECONDS pass; then it is tried again after its backoff. A pod
that failed for a transient reason (the API server down or not yet ready) is tried again after its
backoff alone."""
from __future__ import annotations

from dataclasses import dataclass

from .framework.events import (  # noqa: F401 (bind's cache names the events it reports from here)
    ANY_NODE, CLAIM_DELETE, CLAIM_UPDATE, NODE_ADD, NODE_UPDATE, POD_LEAVES, POD_UPDATE, QUOTA_ADD, QUOTA_DELETE,
    QUOTA_UPDATE, RECORD_FREED, RECORD_UPDATE, SLICE_ADD, SLICE_DELETE, SLICE_UPDATE,
)
from .framework.events import DESCRIBED
from .plugins.registry import EVENTS_TO_REGISTER  # each plugin's name -> the events that can undo its refusal

INITIAL_BACKOFF_SECONDS = 0.5
# kube-scheduler's podMaxBackoffSeconds is 10; bind's is lower so that a replica refused while
# the API server was not yet ready is bound within seconds of its return.
MAX_BACKOFF_SECONDS = 4.0
# An unschedulable pod is tried again after this long even if no registered event came: a
# safety net for events lost with a broken watch (kube-scheduler: 5 minutes).
UNSCHEDULABLE_FLUSH_SECONDS = 60.0


@dataclass(frozen=True)
class Refused:
    """Why a pod waits: the plugin that refused it and the node it is pinned to; for a pod of
    several candidates (a pool's entries), each other candidate's (plugin, node) in `also`."""

    filter: str
    node: str
    also: tuple[tuple[str, str], ...] = ()


def requeues(refused: Refused, event: tuple[str, str], node: str) -> bool:
    """The queueing hint: may `event` on `node` let the refused pod fit now? Only events its
    filter registered, and only on its own node (a pinned pod has one candidate; a pool pod, one
    per entry), or on ANY_NODE."""
    return any(node in (on, ANY_NODE) and event in EVENTS_TO_REGISTER.get(plugin, frozenset())
               for plugin, on in ((refused.filter, refused.node), *refused.also))


def backoff_seconds(attempts: int) -> float:
    """The wait before attempt `attempts + 1` of a pod: doubling from INITIAL_BACKOFF_SECONDS,
    at most MAX_BACKOFF_SECONDS."""
    return min(MAX_BACKOFF_SECONDS, INITIAL_BACKOFF_SECONDS * 2 ** max(0, attempts - 1))


def jittered(seconds: float, fraction: float) -> float:
    """A backoff of `seconds` with its random part (`fraction` in [0, 1)): from half of it to
    one and a half times it, so that two gangs that lost a race to each other try again apart."""
    return seconds * (0.5 + fraction)


def retried_on(plugin: str) -> list[str]:
    """What a pod refused by `plugin` waits for, in words (explain), besides a change of itself."""
    return sorted(DESCRIBED[event] for event in EVENTS_TO_REGISTER.get(plugin, frozenset()))
