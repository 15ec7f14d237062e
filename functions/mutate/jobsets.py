"""The JobSet of a JobSet's pod, for what mutate writes on the pod (gpu_scheduler/workloads.py):
read from the API server (`jobsets get`), and kept by UID, since a JobSet's replicated jobs do not
change once it exists; a JobSet of many pods costs one read.

A read that fails is a refusal of the pod's creation that its Job controller retries (503); a
JobSet that is gone refuses it for good (404). Without an API server, mutate cannot read any
JobSet: it says so once, and a JobSet's pods then go without (bind's Event names what is missing).
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Mapping

import urllib3

from gpu_scheduler.workloads import WorkloadUnreadable
from kubeapi.kubeconfig import KubeconfigError
from kubeapi.client import Kube, load_configuration
from kubeapi.errors import APIError

log = logging.getLogger("mutate")
READ_SECONDS = 1.5  # inside the API server's 5 s for mutate's answer
MAX_JOBSETS = 1024  # bounded memory: the least recently used are forgotten


class JobSets:
    """jobset_of(namespace, name) -> the JobSet, or WorkloadUnreadable; safe from mutate's threads."""

    def __init__(self, kube: Kube | None):
        self.kube = kube
        self._known: OrderedDict[tuple[str, str, str], Mapping[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> "JobSets | None":
        try:
            api = Kube(load_configuration(), urllib3.Timeout(connect=1, read=READ_SECONDS))
        except KubeconfigError as error:
            log.warning("no API server configured (%s): a JobSet's pods get no completions or gang size", error)
            return None
        return cls(api)

    def __call__(self, namespace: str, name: str, uid: str = "") -> Mapping[str, Any]:
        if uid:
            with self._lock:
                known = self._known.get((namespace, name, uid))
                if known is not None:
                    self._known.move_to_end((namespace, name, uid))
                    return known
        try:
            jobset = self.kube.read_jobset(namespace, name)
        except APIError as error:
            if error.status == 404:
                raise WorkloadUnreadable("not found (deleted, or its API jobset.x-k8s.io/v1alpha2 is not"
                                         " served): its pods cannot be created", retry=False) from None
            if error.status == 403:
                raise WorkloadUnreadable("mutate may not read it (its ServiceAccount needs get on"
                                         " jobsets.jobset.x-k8s.io: reinstall the chart)", retry=True) from None
            raise WorkloadUnreadable(f"could not be read ({error.status} {error.message[:200]}); the Job"
                                     " controller retries creating the pod", retry=True) from None
        key = (namespace, name, str((jobset.get("metadata") or {}).get("uid") or ""))
        with self._lock:
            self._known[key] = jobset
            while len(self._known) > MAX_JOBSETS:
                self._known.popitem(last=False)
        return jobset
