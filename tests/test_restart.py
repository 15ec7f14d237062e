"""mutate restarted while pods are being created (real: the local control plane, the shipped
webhook registration with failurePolicy Fail). As a rollout does it: a new mutate process is
started and ready on the webhook's port (reuse_port), then the old one gets SIGTERM, drains
(readiness 503, every request still answered, with Connection: close) and stops. Not one
creation may fail, and every pod must carry mutate's patch.
"""
from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes.client.exceptions import ApiException

from localcp.stack import LocalStack

RATE = 20  # pod creations per second, one creator, steady
pytestmark = pytest.mark.controlplane


@pytest.fixture(scope="module")
def rolling_stack():
    with LocalStack(event_source=False, mutate_drain_seconds=3) as stack:
        yield stack


class Creator:
    """Creates pods with a map at a steady rate until stopped; counts what failed."""

    def __init__(self, stack: LocalStack, namespace: str):
        self.stack, self.namespace = stack, namespace
        self.created: list[dict] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        i, next_at = 0, time.monotonic()
        while not self._stop.is_set():
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"r-{i}", "annotations": {"gpu-scheduling-map": f"{i}=node1:0"}},
                   "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "busybox"}]}}
            try:
                answer = self.stack.api.create_namespaced_pod(self.namespace, pod, _preload_content=False)
                self.created.append(json.loads(answer.data))
            except ApiException as error:
                self.failed.append(f"r-{i}: {error.status} {str(error.body)[:300]}")
            except Exception as error:  # the client's own: connection errors, timeouts
                self.failed.append(f"r-{i}: {type(error).__name__}: {error}")
            i += 1
            next_at += 1 / RATE
            self._stop.wait(max(0.0, next_at - time.monotonic()))  # the pace, not a wait for state

    def __enter__(self) -> "Creator":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def wait_for(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.created) + len(self.failed) < count:
            assert time.monotonic() < deadline, f"{count} creations not attempted within {timeout} s"
            time.sleep(0.05)


def test_pods_created_at_a_steady_rate_while_mutate_restarts_twice_are_all_admitted(rolling_stack):
    stack = rolling_stack
    namespace = stack.create_namespace("restart")
    with Creator(stack, namespace) as creator:
        creator.wait_for(20)
        for _ in range(2):
            stack.restart_mutate()  # returns once the old process has drained and exited
            creator.wait_for(len(creator.created) + len(creator.failed) + 20)  # and on, through the new one
    assert creator.failed == [], f"{len(creator.failed)} of {len(creator.created) + len(creator.failed)} creations failed"
    unpatched = [p["metadata"]["name"] for p in creator.created
                 if p["metadata"].get("labels", {}).get("gpu-scheduler/managed") != "true"]
    assert unpatched == [], "admitted without mutate's patch"
    assert len(creator.created) >= 60
