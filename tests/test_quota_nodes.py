"""Quotas on real kubelets: the check StatefulSet under a ResourceQuota runs on node1..node4, so the
kubelets admit pods that request gpu-scheduler.io/gpu (bind advertises it on each node's status:
without it a kubelet refuses such a pod, OutOfgpu-scheduler.io/gpu), and the replica over the
quota is created, and runs, once the quota is raised.

The StatefulSet controller retries a refused creation with a growing backoff (its work queue's
rate limiter: 5 ms doubling per failure, up to 1000 s), and a change of the quota is no event for
it: after a while of refusals the replica may wait minutes for its next try. Any change of the
StatefulSet starts a try at once; docs/usage.md ("Quotas: who may take which GPUs") tells users
to annotate it, and this test does what it says."""
from __future__ import annotations

import json
import re
import time

import pytest

from conftest import release_namespace
from tests.test_end_to_end import EXPECTED, statefulset
from tests.test_nodes import placement_from_logs, running
from tests.test_quota_cluster import GPU, quota, quota_refusals, used

_names = iter(range(10**6))
SEED_GPUS = 8  # the check map: 2 + 1 + 3 + 1 + 1


@pytest.fixture
def ns(real_stack, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"q{next(_names)}-{request.node.name.lower()}")[:40].strip("-")
    yield real_stack.create_namespace(name)
    release_namespace(real_stack, name)


def test_the_check_workload_runs_under_a_quota_and_the_replica_over_it_waits_for_more(real_stack, ns):
    quota(real_stack, ns, {f"requests.{GPU}": str(SEED_GPUS - 1)})
    real_stack.apply(statefulset(ns))
    refusals = real_stack.wait_for(lambda: quota_refusals(real_stack, ns, "gpu-scheduler-check"), 90,
                                   "the quota's refusal of replica 4")
    assert f"requested: requests.{GPU}=1, used: requests.{GPU}=7, limited: requests.{GPU}=7" in refusals[0], refusals
    # Four replicas run (0..2, and 3 or 4: both pin one GPU, created in parallel): their kubelets
    # admitted pods requesting gpu-scheduler.io/gpu.
    pods = real_stack.wait_for(lambda: running(real_stack, ns, 4), 120, "4 replicas Running")
    placed = placement_from_logs(real_stack, ns, pods)
    assert {0, 1, 2} < set(placed) and placed == {i: EXPECTED[i] for i in placed}

    # The admin raises the quota; once the quota's status has it, the user nudges the StatefulSet.
    real_stack.cp.kubectl("patch", "resourcequota", "gpus", "-n", ns, "--type=merge",
                          "-p", json.dumps({"spec": {"hard": {f"requests.{GPU}": str(SEED_GPUS)}}}))
    real_stack.wait_for(lambda: json.loads(real_stack.cp.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpus"))
                        ["status"]["hard"][f"requests.{GPU}"] == str(SEED_GPUS), 30, "the quota's status raised")
    raised = time.monotonic()
    real_stack.cp.kubectl("annotate", "statefulset", "gpu-scheduler-check", "-n", ns, "--overwrite",
                          f"gpu-scheduler/retry={int(time.time())}")
    pods = real_stack.wait_for(lambda: running(real_stack, ns, 5), 120, "all 5 replicas Running")
    print(f"the fifth replica Running {time.monotonic() - raised:.1f} s after the quota was raised and the StatefulSet nudged")
    assert placement_from_logs(real_stack, ns, pods) == EXPECTED
    assert used(real_stack, ns)[f"requests.{GPU}"] == str(SEED_GPUS)
