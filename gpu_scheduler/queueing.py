"""Which cluster events can undo a refusal, and how long a pod waits before it is tried again:
kube-scheduler's EventsToRegister and queueing hints (noderesources/fit.go and the other
filters), and its pod backoff, for bind's filters. Pure: bind's scheduling queue asks these.

A pod refused by a filter waits as unschedulable until an event that filter registered happens on
the pod's node (its holder leaves, the node becomes Ready or gains the label, a filler is
deleted), or UNSCHEDULABLE_FLUSH_SECONDS pass; then it is tried again after its backoff. A pod
that failed for a transient reason (the API server down or not yet ready) is tried again after its
backoff alone."""
from __future__ import annotations

import hashlib
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


# Pods that became active within one such window are taken in an order of the instance's own.
ACTIVE_ORDER_WINDOW_SECONDS = 1.0


def active_order(seed: bytes, uid: str, activated: float) -> tuple[int, bytes]:
    """Where a pod stands in an instance's active queue: by the window it became active in (first
    come, first tried, to within ACTIVE_ORDER_WINDOW_SECONDS), then in an order drawn from the
    instance's own `seed` (at most 64 bytes). Why not first in, first out: every instance watches
    every pod, so instances taking a backlog in one order all try the same pod at once, and all but
    one lose the pod's records and its Binding to a conflict. Orders of their own part them until
    the backlog's end; the records still decide any pod two instances meet on."""
    return int(activated // ACTIVE_ORDER_WINDOW_SECONDS), hashlib.blake2b(uid.encode(), digest_size=8, key=seed).digest()
