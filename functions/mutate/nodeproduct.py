"""The GPU type of a node, for mutate's per-type quota requests (gpu_scheduler/quota.py): its
`nvidia.com/gpu.product` label, read from the API server (`nodes get`, from its watch cache: cheap)
and kept NODE_SECONDS, so a StatefulSet of many replicas created at once on one node costs one read,
while a pod created a second or more after its node was labelled is counted with the label.

The API server waits 5 s for mutate's answer (knative/webhook.yaml); a read takes at most about
READ_SECONDS. A node that does not exist (yet), has no label, or cannot be read now gives None:
the pod then counts in the total (gpu-scheduler.io/gpu) only, and bind's GPUQuota plugin keeps it
Pending with the fix if its node has a GPU type after all (plugins/gpuquota.py).
"""
from __future__ import annotations

import logging
import threading
import time

import urllib3

from gpu_scheduler.quota import PRODUCT_LABEL
from kubeapi.kubeconfig import KubeconfigError
from kubeapi.client import Kube, load_configuration
from kubeapi.errors import APIError

log = logging.getLogger("mutate")
NODE_SECONDS = 1.0  # at most: a label set 2 s before a pod's creation is the one it is counted with
READ_SECONDS = 1.5
MAX_NODES = 10000  # bounded memory: past this, the expired are dropped, or else the cache starts over


class NodeProducts:
    """product_of(node) -> the node's GPU type, or None; safe to call from mutate's threads."""

    def __init__(self, kube: Kube | None, seconds: float = NODE_SECONDS):
        self.kube = kube
        self.seconds = seconds
        self._known: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> "NodeProducts":
        """Over mutate's ServiceAccount (or KUBECONFIG); without either, no GPU types (logged once)."""
        try:
            api = Kube(load_configuration(), urllib3.Timeout(connect=1, read=READ_SECONDS))
        except KubeconfigError as error:
            log.warning("no API server configured (%s): pods are counted for quotas in total only,"
                        " not per GPU type", error)
            return cls(None)
        return cls(api)

    def __call__(self, node: str) -> str | None:
        if self.kube is None:
            return None
        now = time.monotonic()
        with self._lock:
            known = self._known.get(node)
        if known is not None and now - known[0] < self.seconds:
            return known[1]
        try:
            labels = (self.kube.read_node(node, cached=True).get("metadata") or {}).get("labels") or {}
        except APIError as error:
            if error.status != 404:
                log.warning("node %s: its GPU type could not be read (%s); the pod counts in the total only",
                            node, error)
                return None
            labels = {}  # not there yet: no type now, asked again after NODE_SECONDS
        product = labels.get(PRODUCT_LABEL) if isinstance(labels, dict) else None
        product = product if isinstance(product, str) else None
        with self._lock:
            if len(self._known) >= MAX_NODES:
                self._known = {name: kept for name, kept in self._known.items() if now - kept[0] < self.seconds}
                if len(self._known) >= MAX_NODES:
                    self._known.clear()
            self._known[node] = (now, product)
        return product
