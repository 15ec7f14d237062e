"""What a pod's decision reads, read for it, while the pod watch's first listing is not in yet
(issue 62): a cold start that does not grow with the cluster. The pod watch lists every pod, which
takes seconds at 20,000; a pinned pod's decision needs the pods of the nodes its PreFilter names
(fit, ports, GPUs held), bind's pending pods (they are queued, and a gang's pending members
counted) and the pods of its namespace (a gang's bound members). So, until that listing is in:

- at start, bind's pending pods are listed (spec.schedulerName, no spec.nodeName) and queued;
- before a pod's cycle, its namespace's pods are listed, and before a node's snapshot, that node's;
  each once, as the API server's watch cache answers a selective listing (unpaged: in pages it
  reads through etcd until a page is full);
- then the pods that the node's device records name and the view does not hold, by name: whether
  each is gone is what frees a record's GPU (cache.py: gone_of).

Every other view (nodes, records, budgets, quotas, slices, claims) is listed whole as before:
they are small. What a scoped view may get wrong, and why that is safe, is in placer.py (place):
a placement is made from it only where the whole view would make the same one; a refusal waits
for the whole view. The I/O side of bind."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from gpu_scheduler.binding import PENDING_SELECTOR
from gpu_scheduler.fit import is_terminal
from informers import FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS
from kubeapi import projection
from kubeapi.errors import APIError

log = logging.getLogger("bind")


class ScopedReads:
    """`listed()`: True once the pod watch's first listing is in (then nothing here reads); `merge`
    takes a scoped listing's pages into the cache (EventHandlers.merge_pods)."""

    def __init__(self, api, merge: Callable[[Iterable[list[dict]]], None], listed: Callable[[], bool],
                 not_terminal: str, others_listed: Callable[[], None] = lambda: None,
                 unknown_holders: Callable[[str], list[tuple[str, str]]] = lambda node: [],
                 gone: Callable[[str, str], None] = lambda uid, node: None):
        self.api, self._merge, self._listed, self._not_terminal = api, merge, listed, not_terminal
        self._others_listed = others_listed  # returns once every other view is listed
        self._unknown_holders, self._gone = unknown_holders, gone  # the cache's (cover_node)
        self.pending_listed = threading.Event()
        self._covered: set[tuple[str, str]] = set()  # ("node" | "namespace", name) listed and merged
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._list_pending, name="scope-pending", daemon=True).start()

    def _list_pending(self) -> None:
        """bind's pending pods, queued: what it has to place, before the whole pod listing is in."""
        delay = FIRST_RETRY_SECONDS
        while not self._listed():
            try:
                started = time.monotonic()
                pending = self.api.list_pods(PENDING_SELECTOR, projection.PODS)
                # Queued once bind can decide: a pod tried before the nodes are listed would wait
                # out a backoff (0.5 s) for nothing. So would one a worker takes from the queue
                # before this listing counts as in (Views.can_place): it is marked in first.
                self._others_listed()
                self.pending_listed.set()
                self._merge([pending])
                log.info("listed", extra={"view": "pending pods (scoped)",
                                          "took_ms": round((time.monotonic() - started) * 1000, 1)})
                break
            except Exception as error:  # as an informer's: an outage, a 403 not yet ready; tried again
                log.info("scoped listing failed", extra={"view": "pending pods", "detail": str(error)[:200],
                                                         "retry_in_s": delay})
                time.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)
        self.pending_listed.set()

    def cover_node(self, node: str) -> None:
        """The pods on `node`, read unless the whole listing is in or they were read before; then
        the pods the node's records name that are neither there nor pending. Raises APIError."""
        self._cover(("node", node), lambda: [self.api.list_pods(f"spec.nodeName={node},{self._not_terminal}",
                                                                projection.PODS)])
        self._cover(("holders", node), lambda: self._holders(node))

    def _holders(self, node: str) -> list[list[dict]]:
        """Each pod a record on `node` names that this view does not hold, read by name: gone (not
        found, another UID, ended) is said to the cache as the whole view would know it (a pod
        absent from a listing newer than its record); one that exists is merged where it is. So a
        record of a deleted pod frees its GPU from scoped reads too (a woken bind's commonest case:
        the pod that held it was deleted while bind slept)."""
        found = []
        for name, uid in self._unknown_holders(node):
            namespace, _, pod_name = name.partition("/")
            try:
                pod = self.api.read_pod(namespace, pod_name, projection=projection.PODS)
            except APIError as error:
                if not error.not_found:  # a 404 of its namespace is the pod gone too
                    raise
                pod = None
            if pod is None or str((pod.get("metadata") or {}).get("uid") or "") != uid or is_terminal(pod):
                self._gone(uid, node)
            else:
                found.append(pod)
        return [found]

    def cover_namespace(self, namespace: str) -> None:
        """The pods of `namespace` (a gang's bound members). Raises APIError."""
        self._cover(("namespace", namespace), lambda: [items for items, _ in self.api.list_namespaced_pods(
            namespace, projection.PODS, self._not_terminal, paged=False)])

    def _cover(self, key: tuple[str, str], read: Callable[[], list[list[dict]]]) -> None:
        if self._listed() or key in self._covered:
            return
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one listing of a node at a time: a gang's members share their nodes
            if self._listed() or key in self._covered:
                return
            # Unpaged: the API server's watch cache answers a selective listing at once, where in
            # pages it reads through etcd until a page is full. Read whole before merging: a
            # listing that fails half-way merges nothing.
            self._merge(read())
            self._covered.add(key)
