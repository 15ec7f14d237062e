"""Preemption side by side with kube-scheduler (the stack's default scheduler) on the real
control plane: the same situation built twice, on twin nodes, once for kube-scheduler and once
for bind; both must take the same victims, or evict nothing both.

Each situation, drawn from a seed: 2-4 pods of several lower priorities put on each twin
(spec.nodeName, no scheduler), with the same requests, host ports and status.startTime on both;
then a preemptor pinned to its twin that is refused there for a reason kube-scheduler understands
(NodeResourcesFit: cpu, memory, pods; NodePorts). The preemptor is of a higher priority, or of
the victims' own priority (nobody may be preempted), or has preemptionPolicy Never.

kube-scheduler deletes its victims, bind evicts them through the Eviction API; the twins have no
kubelet, so a victim stays Terminating (its grace period is 30 s) either way. Victims are compared
as the pods that got a deletionTimestamp on each twin, by name without the twin's prefix (the
start times are distinct, so kube-scheduler's choice among pods of equal priority is not left to
chance: it gives back the longest-running first, util.MoreImportantPod). The sets are read once
both preemptors' FailedScheduling Events exist (bind writes its own after its evictions) and
wait until they agree, 20 s at most; kube-scheduler deletes its victims in a goroutine, in
parallel but for the last.

Not compared here, because the two differ on purpose: a victim whose PodDisruptionBudget allows no
disruption. kube-scheduler prefers other victims but deletes it when it must; bind evicts through
the Eviction API, which keeps the budget, and so preempts nobody (docs/usage.md, "Priority and preemption";
test_preemption_cluster.py's PodDisruptionBudget case)."""
from __future__ import annotations

import json
import random
import time
from datetime import datetime, timedelta, timezone

import pytest

from test_preemption_cluster import create_priority_classes, events

CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "4", "nvidia.com/gpu": "4"}
LOWER = {"gs-side-10": 10, "gs-side-20": 20, "gs-side-30": 30}
HIGH, NEVER = "gs-side-1000", "gs-side-1000-never"
CLASSES = {**LOWER, HIGH: 1000, NEVER: 1000}
SCHEDULERS = {"k": "default-scheduler", "b": "gpu-scheduler"}  # twin prefix -> who schedules its preemptor


@pytest.fixture(scope="module", autouse=True)
def priority_classes(stack):
    create_priority_classes(stack, CLASSES, NEVER)


def _container(name: str, cpu: int, memory: int, port: bool) -> dict:
    requests = {"cpu": f"{cpu}m"}
    if memory:
        requests["memory"] = f"{memory}Mi"
    container = {"name": name, "image": "busybox", "resources": {"requests": requests}}
    if port:
        container["ports"] = [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}]
    return container


def situation(rng: random.Random, mode: str) -> tuple[list[dict], dict]:
    """The pods on the node (name, class, cpu m, memory Mi, host port, start offset s) and the
    preemptor (class, cpu, memory, port), which the node refuses as it is."""
    victims, cpu_left, memory_left, port_taken = [], 4000, 8192, False
    for i in range(rng.randint(2, 4)):
        cpu = min(rng.choice([250, 500, 1000, 1500]), cpu_left)
        memory = rng.choice([0, 0, 1024, 2048, 3072])
        memory = memory if memory <= memory_left else 0
        port = not port_taken and rng.random() < 0.35
        if cpu <= 0:
            break
        cpu_left, memory_left, port_taken = cpu_left - cpu, memory_left - memory, port_taken or port
        victim_class = "gs-side-30" if mode == "equal" else rng.choice(sorted(LOWER))
        victims.append({"name": f"on-{i}", "class": victim_class, "cpu": cpu, "memory": memory, "port": port})
    for victim, offset in zip(victims, rng.sample(range(len(victims)), len(victims))):
        victim["started"] = 60 * (offset + 1)  # seconds before now; distinct, not in name order
    reasons = (["cpu"] + (["memory"] if memory_left < 8192 else []) + (["port"] if port_taken else [])
               + (["pods"] if len(victims) == 4 else []))
    reason = rng.choice(reasons)
    preemptor = {"cpu": rng.choice([100, 250]), "memory": 0, "port": reason == "port",
                 "class": {"equal": "gs-side-30", "never": NEVER}.get(mode) or rng.choice([HIGH, HIGH, "gs-side-20"])}
    if reason == "cpu":
        preemptor["cpu"] = min(4000, cpu_left + rng.choice([250, 500, 1000, 2000]))
    if reason == "memory":
        preemptor["memory"] = min(8192, memory_left + rng.choice([512, 1024, 3072]))
    return victims, {**preemptor, "reason": reason}


def _create(stack, body: dict) -> dict:
    result = stack.cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode == 0, (result.stderr, body)
    return json.loads(result.stdout)


def build(stack, namespace: str, node: str, prefix: str, victims: list[dict]) -> None:
    now = datetime.now(timezone.utc)
    for victim in victims:
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{prefix}-{victim['name']}", "namespace": namespace,
                             "labels": {"twin": prefix}},
                "spec": {"nodeName": node, "priorityClassName": victim["class"], "terminationGracePeriodSeconds": 30,
                         "containers": [_container("c", victim["cpu"], victim["memory"], victim["port"])]}}
        _create(stack, body)
        started = (now - timedelta(seconds=victim["started"])).strftime("%Y-%m-%dT%H:%M:%SZ")
        stack.cp.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{prefix}-{victim['name']}/status",
                         {"status": {"startTime": started}}, "application/strategic-merge-patch+json")


def preemptor_body(namespace: str, node: str, prefix: str, case: int, preemptor: dict) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{prefix}-pre{case}-0", "namespace": namespace, "labels": {"role": "preemptor"}},
            "spec": {"schedulerName": SCHEDULERS[prefix], "priorityClassName": preemptor["class"],
                     "nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "containers": [_container("c", preemptor["cpu"], preemptor["memory"], preemptor["port"])]}}
    if prefix == "b":  # a device of its own each time: an earlier preemptor's nomination is not in its way
        body["metadata"]["annotations"] = {"gpu-scheduling-map": f"0={node}:{case % 4}\n"}
    return body


def terminating(stack, namespace: str, prefix: str) -> set[str]:
    pods = stack.pods(namespace, f"twin={prefix}")
    return {p["metadata"]["name"][len(prefix) + 1:] for p in pods if p["metadata"].get("deletionTimestamp")}


def refusal(stack, namespace: str, pod: dict, words: tuple[str, ...] = ("",)) -> str | None:
    """The message of the pod's FailedScheduling Event holding one of `words`, once there is one."""
    found = [e["message"] for e in events(stack, namespace, pod["metadata"]["uid"], "FailedScheduling")
             if any(w in e["message"] for w in words)]
    return found[0] if found else None


def run_situation(stack, namespace: str, twins: list[str], case: int, victims: list[dict], preemptor: dict):
    """Both sides' victims (names without the prefix) and what each preemptor was told."""
    for node, prefix in zip(twins, SCHEDULERS):
        build(stack, namespace, node, prefix, victims)
    time.sleep(0.5)  # both schedulers' informers have the pods on the twins (as test_fit_cluster's side-by-side)
    made = {prefix: _create(stack, preemptor_body(namespace, node, prefix, case, preemptor))
            for node, prefix in zip(twins, SCHEDULERS)}
    theirs = stack.wait_for(lambda: refusal(stack, namespace, made["k"]), 30,
                            "kube-scheduler's FailedScheduling (the situation must be a refusal)")
    # bind's refusal names what its DefaultPreemption did: "preempted ..." or "nobody preempted: ..."
    try:
        ours = stack.wait_for(lambda: refusal(stack, namespace, made["b"], ("preempted",)), 30,
                              "bind's FailedScheduling with its preemption")
    except TimeoutError as error:
        said = [e["message"] for e in events(stack, namespace, made["b"]["metadata"]["uid"], "FailedScheduling")]
        raise AssertionError(f"{error}: {said}; the pod: {stack.pods(namespace, 'role=preemptor')}") from None
    # kube-scheduler deletes its victims in a goroutine after its Event; bind's Event comes after
    # its evictions. Wait for the two sets to agree; if they never do, report both.
    try:
        stack.wait_for(lambda: terminating(stack, namespace, "k") == terminating(stack, namespace, "b"), 20,
                       "the same victims", interval=0.3)
    except TimeoutError:
        pass
    return terminating(stack, namespace, "k"), terminating(stack, namespace, "b"), theirs, ours


def _clear(stack, namespace: str) -> None:
    stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    stack.wait_for(lambda: not stack.pods(namespace), 30, "pods gone", interval=0.2)


@pytest.mark.parametrize("seed", range(8))
def test_preemption_agrees_with_kube_scheduler(stack, namespace, seed):
    """4 situations per seed (two with a higher-priority preemptor, one with an equal-priority or
    a Never one, one more of either): kube-scheduler and bind take the same victims, or none."""
    from test_records_cluster import Nodes

    rng = random.Random(300 + seed)
    twins = Nodes(stack, f"pv{seed}-{namespace}"[:30].rstrip("-"), 2, {}, CAPACITY)
    modes = ["preempt", "preempt", rng.choice(["equal", "never"]), rng.choice(["preempt", "equal", "never"])]
    disagreements, seen = [], []
    try:
        for case, mode in enumerate(modes):
            victims, preemptor = situation(rng, mode)
            theirs, ours, their_message, our_message = run_situation(stack, namespace, twins.names, case, victims,
                                                                     preemptor)
            seen.append((mode, preemptor["reason"], preemptor["class"], len(victims), sorted(theirs)))
            print(f"\nseed {seed} case {case}: {seen[-1]}; agree: {theirs == ours}")
            if theirs != ours or (mode in ("equal", "never") and theirs):
                disagreements.append({"case": case, "mode": mode, "victims": victims, "preemptor": preemptor,
                                      "kube-scheduler": sorted(theirs), "bind": sorted(ours),
                                      "kube-scheduler said": their_message, "bind said": our_message})
            _clear(stack, namespace)
    finally:
        twins.remove()
    assert not disagreements, json.dumps(disagreements, indent=1)
    assert any(chosen for *_, chosen in seen), seen  # some situation did preempt
