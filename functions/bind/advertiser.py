"""Quotas: every node advertises the extended resources pinned pods request (gpu_scheduler/quota.py),
so that the kubelet admits them (it refuses a pod whose node lacks a resource it requests, as
OutOf<resource>) and NodeResourcesFit finds them allocatable. The node status PATCH Kubernetes
documents for node-level extended resources, made when a node is seen without them (added, its
GPU type label changed, or its kubelet re-registered it with its extended resources reset).

Several bind instances may patch the same node at once: each writes the same values (a merge
patch), so the last write is as good as the first. A failed patch is logged and made again at the
node's next event (a kubelet updates its node's status at least every few minutes; bind's node
watch also lists again after each of its expiries).
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

from gpu_scheduler.quota import advertisement
from kubeapi.errors import APIError

log = logging.getLogger("bind")


class NodeAdvertiser:
    def __init__(self, api):
        self.api = api
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._wanted: dict[str, dict[str, Any]] = {}  # node -> its latest patch, coalesced
        self._lock = threading.Lock()

    def start(self) -> None:
        """On bind's start, not at import (threads made before functions-framework forks die)."""
        threading.Thread(target=self._run, name="node-advertiser", daemon=True).start()

    def offer(self, node: Mapping[str, Any]) -> None:
        """Called with each node as the watch sees it; cheap when the node has it all."""
        patch = advertisement(node)
        if patch is None:
            return
        name = str((node.get("metadata") or {}).get("name"))
        with self._lock:
            queued = name in self._wanted
            self._wanted[name] = patch
        if not queued:
            self._queue.put(name)

    def _run(self) -> None:
        while True:
            name = self._queue.get()
            with self._lock:
                patch = self._wanted.pop(name, None)
            if patch is None:
                continue
            try:
                self.api.patch_node_status(name, patch)
                log.info("node advertises the quota resources", extra={"node": name, "detail": str(patch)})
            except APIError as error:
                log.warning("node status patch for quotas failed; made again at the node's next event",
                            extra={"node": name, "detail": str(error)})
            except Exception:  # never end the thread
                log.exception("node status patch for quotas failed")
