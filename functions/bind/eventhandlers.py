"""The informers' callbacks, as kube-scheduler's eventhandlers.go: each listing or watch event goes
into the cache (cache.py), and what the cache says it changed goes on, once the cache's lock is
released: to the scheduling queue (a cluster event that may undo a refusal; a pending pod of ours
found new or changed, queued if the framework's PreEnqueue admits it; one no longer pending,
forgotten), to quotas' node advertiser (on_node) and to the GPUS_HELD gauge. The cache never calls
the queue; these handlers are the one place watch data turns into queue moves."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from cache import Cache, Changes
from metrics import GPUS_HELD
from schedqueue import SchedulingQueue


class EventHandlers:
    def __init__(self, cache: Cache, queue: SchedulingQueue,
                 admits: Callable[[Mapping[str, Any]], bool] = lambda pod: True):
        self.cache, self.queue = cache, queue
        self.admits = admits  # the framework's PreEnqueue: whether a pending pod is queued at all
        self.on_node: Callable[[Mapping[str, Any]], None] | None = None  # each node added or changed (quotas)

    def replace_pods(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_pods(pages))

    def merge_pods(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.merge_pods(pages))

    def apply_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_pod(kind, pod))

    def replace_nodes(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_nodes(pages))

    def apply_node(self, kind: str, node: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_node(kind, node))

    def replace_records(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_records(pages))

    def apply_record(self, kind: str, lease: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_record(kind, lease))

    def replace_pdbs(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_pdbs(pages))

    def apply_pdb(self, kind: str, pdb: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_pdb(kind, pdb))

    def replace_quotas(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_quotas(pages))

    def apply_quota(self, kind: str, quota: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_quota(kind, quota))

    def replace_slices(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_slices(pages))

    def apply_slice(self, kind: str, item: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_slice(kind, item))

    def replace_claims(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_claims(pages))

    def apply_claim(self, kind: str, claim: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_claim(kind, claim))

    def _report(self, changes: Changes) -> None:
        """Called with the cache's lock released: the queue has a lock of its own, and the two are
        never held together."""
        for view in changes.nodes:
            if self.on_node:
                self.on_node(view)
        for key in changes.freed:
            _ungauge(key)
        for key in changes.held:
            _gauge(key)
        for event, node in changes.events:
            self.queue.cluster_event(event, node)
        for uid in changes.forget:
            self.queue.forget(uid)
        for uid, pod in changes.pending:
            # a pod that PreEnqueue holds back (its gates) is kept in the cache, not queued; the
            # update that removes its last gate changes its fingerprint, and queues it
            if pod is None or self.admits(pod):
                self.queue.add(uid)


_gauged: set[tuple[str, str]] = set()  # the (node, device) label pairs GPUS_HELD has


def _gauge(key: tuple[str, str]) -> None:
    GPUS_HELD.labels(*key).set(1)
    _gauged.add(key)


def _ungauge(key: tuple[str, str]) -> None:
    if key in _gauged:
        GPUS_HELD.remove(*key)
        _gauged.discard(key)
