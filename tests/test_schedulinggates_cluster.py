"""Pod scheduling gates (`spec.schedulingGates`, kube-scheduler's PreEnqueue plugin
SchedulingGates) honoured by bind, on the real control plane:

- a pinned pod created with a gate (a bare pod, and a StatefulSet replica whose template carries
  it) is left alone while gated: no device record, no Binding, no Warning Event, and its
  `PodScheduled` condition stays `False`, reason `SchedulingGated`;
- removing its last gate (the API server allows removing gates, never adding them) gets it bound
  to its map's node, with its map's devices, within 2 s of the patch;
- a gated member of a gang counts as not there yet: the other member waits as for a missing one
  ("1 of 2 members exist"), nothing is bound or held; the gate removed, both are bound;
- `kubectl gpu-scheduler explain` (as a user granted exactly permissions.PLUGIN) says the gated
  pod waits for its scheduling gates, names the gate, and that it is not placeable.

The API server itself writes `PodScheduled=False, reason SchedulingGated` on a pod created with
gates (pkg/registry/core/pod/strategy.go), so the condition is there before bind sees the pod;
what is tested is that bind leaves it so. Absence (no record, no Event) is checked once bind has
had its say: a ping (bind tries every pending pod and answers with the outcomes), then a probe pod
of the same namespace bound, with its `Scheduled` Event written. bind's recorder writes Events and
conditions in order from one thread, so anything bind wrote for the gated pod before is visible
by then.

Each test has a node of its own (test_records_cluster's Node objects, 4 GPUs each, no kubelet),
so that nothing of node1..node4 or of another test touches its pods.
"""
from __future__ import annotations

import itertools
import json
import re
import time
import urllib.error
import urllib.parse

import pytest

from gpu_scheduler.fit import DEVICES_ANNOTATION
from test_end_to_end import env_of, pod_manifest, statefulset
from test_plugin_cluster import reader, run  # noqa: F401 (reader: a fixture)
from gpu_scheduler.records import record_name
from test_records_cluster import RECORDS, own_nodes, record_of  # noqa: F401 (own_nodes: a fixture)

pytestmark = pytest.mark.controlplane

BIND_NAMESPACE = "gpu-scheduler"  # where the stack's bind keeps its records (functions/bind/placer.py)
GATE = "example.com/hold"
GANG = "gpu-scheduler/gang"
DEADLINE_SECONDS = 2.0  # from the patch that removes the last gate to the pod bound (the bound)
_probes = itertools.count()


# -- helpers -------------------------------------------------------------------------------------
def gated(manifest: dict, gates: tuple[str, ...] = (GATE,)) -> dict:
    """The pod (or the workload's pod template) with `gates` as its scheduling gates."""
    spec = manifest["spec"]["template"]["spec"] if manifest["kind"] != "Pod" else manifest["spec"]
    spec["schedulingGates"] = [{"name": gate} for gate in gates]
    return manifest


def live(stack, namespace: str, name: str) -> dict | None:
    try:
        return json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))
    except urllib.error.HTTPError as error:
        if error.code == 404:  # not created yet (a StatefulSet's pod)
            return None
        raise


def created(stack, namespace: str, name: str) -> dict:
    return stack.wait_for(lambda: live(stack, namespace, name), 60, f"the pod {name} created")


def set_gates(stack, namespace: str, name: str, gates: list[str]) -> None:
    """The pod's scheduling gates replaced by `gates` (a JSON merge patch replaces the list)."""
    stack.cp.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                     {"spec": {"schedulingGates": [{"name": gate} for gate in gates]}}, "application/merge-patch+json")


def scheduled_condition(pod: dict) -> dict | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)


def is_gated(pod: dict | None) -> bool:
    condition = scheduled_condition(pod or {"status": {}})
    return bool(condition) and (condition["status"], condition.get("reason")) == ("False", "SchedulingGated")


def events_of(stack, namespace: str, uid: str) -> list[dict]:
    query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.uid={uid}"})
    return json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events?{query}"))["items"]


def binds_warnings(stack, namespace: str, uid: str) -> list[dict]:
    """The Warning Events gpu-scheduler wrote about the pod."""
    return [e for e in events_of(stack, namespace, uid) if e.get("type") == "Warning"
            and "gpu-scheduler" in ((e.get("source") or {}).get("component"), e.get("reportingComponent"))]


def records_on(stack, node: str, devices: list[str]) -> dict[str, dict]:
    """The device records (Leases in bind's namespace) of `devices` on `node` that exist."""
    found = {device: record_of(stack, node, device) for device in devices}
    return {device: record for device, record in found.items() if record is not None}


def records_version(stack) -> str:
    """The resourceVersion of bind's records now: where records_written_since starts."""
    return json.loads(stack.cp.get(RECORDS))["metadata"]["resourceVersion"]


def records_written_since(stack, version: str, node: str, devices: list[str]) -> list[str]:
    """Every write of a record of `devices` on `node` since `version`, deleted since or not (a
    watch from that version replays them): `ADDED <name>`, `MODIFIED <name>`, `DELETED <name>`.
    The watch ends after a second, once what happened is replayed."""
    names = {record_name(node, device) for device in devices}
    query = urllib.parse.urlencode({"watch": "1", "resourceVersion": version, "timeoutSeconds": "1"})
    stream = stack.cp.get(f"{RECORDS}?{query}").decode()
    events = [json.loads(line) for line in stream.splitlines() if line.strip()]
    return [f"{e['type']} {e['object']['metadata']['name']}" for e in events
            if e.get("type") in ("ADDED", "MODIFIED", "DELETED") and e["object"]["metadata"]["name"] in names]


def describe(stack, namespace: str, *names: str) -> str:
    """What a failure should show: each pod's node, PodScheduled condition, gates and Events, and
    the end of bind's log."""
    lines = []
    for name in names:
        pod = live(stack, namespace, name)
        if pod is None:
            lines.append(f"  {name}: not there")
            continue
        events = [f"{e.get('type')} {e.get('reason')}: {e.get('message')} (x{e.get('count')})"
                  for e in events_of(stack, namespace, pod["metadata"]["uid"])]
        lines.append(f"  {name}: node {pod['spec'].get('nodeName')!r}; gates {pod['spec'].get('schedulingGates')};"
                     f" PodScheduled {scheduled_condition(pod)}; Events {events}")
    lines.append("  bind's log:")
    lines += [f"    {line[:300]}" for line in stack.cp.log_tail("bind", 15).splitlines()]
    return "\n".join(lines)


def bind_has_had_its_say(stack, namespace: str, node: str, device: str) -> None:
    """Returns once bind has tried every pending pod (a ping of its own answered) and has written
    whatever that made it write: a probe pod, created after the ping, is bound and its Scheduled
    Event is in the API server (bind's recorder writes in order, from one thread)."""
    stack.wait_for(lambda: stack.ping().get("result") == "resynced", 60, "a resync of bind's own", interval=0.5)
    name = f"probe{next(_probes)}-0"
    stack.apply(pod_manifest(namespace, name, f"0={node}:{device}\n# the probe {name}\n"))

    def scheduled():
        pod = live(stack, namespace, name)
        if not pod or not pod["spec"].get("nodeName"):
            return False
        return any(e.get("reason") == "Scheduled" for e in events_of(stack, namespace, pod["metadata"]["uid"]))
    try:
        stack.wait_for(scheduled, 30, f"the probe {name} bound, its Scheduled Event written", interval=0.1)
    except TimeoutError as timeout:
        raise AssertionError(f"{timeout}\n{describe(stack, namespace, name)}") from None


def left_alone(stack, namespace: str, name: str, node: str, devices: list[str], since: str) -> list[str]:
    """What bind did to the gated pod that it should not have, since the records' version `since`:
    [] when nothing."""
    pod = live(stack, namespace, name)
    problems = []
    if pod["spec"].get("nodeName"):
        problems.append(f"bound to {pod['spec']['nodeName']} (a Binding)")
    condition = scheduled_condition(pod)
    if not is_gated(pod):
        problems.append(f"PodScheduled is {condition}, not False/SchedulingGated")
    elif "scheduling gates" not in (condition.get("message") or "").lower():
        problems.append(f"PodScheduled's message does not speak of scheduling gates: {condition.get('message')!r}")
    held = records_on(stack, node, devices)
    if held:
        problems.append("device records held: " + ", ".join(
            f"{r['metadata']['name']} (holders {r['metadata']['annotations'].get('gpu-scheduler/holders')})"
            for r in held.values()))
    written = records_written_since(stack, since, node, devices)
    if written:
        problems.append(f"device records written (and released or not) while gated: {written}")
    warnings = binds_warnings(stack, namespace, pod["metadata"]["uid"])
    if warnings:
        problems.append("Warning Events from gpu-scheduler: "
                        + "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in warnings))
    return problems


def gated_pod(stack, namespace: str, kind: str, node: str, devices: str, gates: tuple[str, ...] = (GATE,)) -> str:
    """A pinned pod (`bare`: a bare pod; `statefulset`: the replica of a one-replica StatefulSet
    whose template carries the gates) to `node`'s `devices`, created gated: its name, once it
    exists with its gates and the API server's SchedulingGated condition."""
    name = "held-0"
    if kind == "bare":
        stack.apply(gated(pod_manifest(namespace, name, f"0={node}:{devices}\n"), gates))
    else:
        stack.apply(gated(statefulset(namespace, f"0={node}:{devices}\n", replicas=1, name="held"), gates))
    pod = created(stack, namespace, name)
    assert [g["name"] for g in pod["spec"].get("schedulingGates") or []] == list(gates), (
        f"the pod was admitted without its gates: {pod['spec'].get('schedulingGates')}")
    try:
        stack.wait_for(lambda: is_gated(live(stack, namespace, name)), 20, f"{name} PodScheduled=False SchedulingGated")
    except TimeoutError as timeout:
        raise AssertionError(f"{timeout}\n{describe(stack, namespace, name)}") from None
    return name


# -- 1. a gated pod: nothing written, nothing bound ------------------------------------------------
@pytest.mark.parametrize("kind", ["bare", "statefulset"])
def test_a_gated_pod_gets_no_record_no_binding_and_no_warning(stack, namespace, own_nodes, kind):
    [node] = own_nodes(1)
    since = records_version(stack)
    name = gated_pod(stack, namespace, kind, node, "1,2")
    bind_has_had_its_say(stack, namespace, node, "0")
    problems = left_alone(stack, namespace, name, node, ["1", "2"], since)
    assert not problems, (f"bind acted on the gated pod {name}:\n  - " + "\n  - ".join(problems)
                          + "\n" + describe(stack, namespace, name))


# -- 2. the last gate removed: bound within 2 s, as the map says ------------------------------------
@pytest.mark.parametrize("kind", ["bare", "statefulset"])
def test_removing_the_last_gate_binds_the_pod_within_two_seconds(stack, namespace, own_nodes, kind):
    [node] = own_nodes(1)
    since = records_version(stack)
    name = gated_pod(stack, namespace, kind, node, "1,2")
    # bind has seen the pod gated, and held it (test 1's checks), before the gate goes: what is
    # timed is the pod leaving bind's gated pods, not a retry that was coming anyway.
    bind_has_had_its_say(stack, namespace, node, "0")
    problems = left_alone(stack, namespace, name, node, ["1", "2"], since)
    assert not problems, (f"bind did not hold the gated pod {name} before its gate was removed:\n  - "
                          + "\n  - ".join(problems) + "\n" + describe(stack, namespace, name))

    set_gates(stack, namespace, name, [])
    removed = time.monotonic()
    try:
        pod = stack.wait_for(lambda: (p := live(stack, namespace, name)) and p["spec"].get("nodeName") and p,
                             30, f"{name} bound", interval=0.02)
    except TimeoutError as timeout:
        raise AssertionError(f"{timeout} after its last gate was removed\n{describe(stack, namespace, name)}") from None
    elapsed = time.monotonic() - removed
    print(f"{name} bound {elapsed:.3f} s after its last gate was removed")
    assert pod["spec"]["nodeName"] == node
    assert elapsed <= DEADLINE_SECONDS, (f"{name} bound {elapsed:.2f} s after its last gate was removed"
                                         f" (at most {DEADLINE_SECONDS} s)\n{describe(stack, namespace, name)}")
    assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == "1,2"
    assert env_of(pod)["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert sorted(records_on(stack, node, ["1", "2"])) == ["1", "2"]  # the GPUs recorded, as for any pod


# -- 3. a gang with a gated member: the member is not there yet --------------------------------------
def test_a_gated_gang_member_counts_as_missing_until_its_gate_is_removed(stack, namespace, own_nodes):
    """Both members are created gated (the template's gate); pair-0's gate is removed at once, so
    one member is gated from then on: pair-0 waits as for a missing member, pair-1 is left alone,
    nothing is held. pair-1's gate removed: both bound."""
    [node] = own_nodes(1)
    since = records_version(stack)
    manifest = gated(statefulset(namespace, f"0={node}:0\n1={node}:1\n", replicas=2, name="pair"))
    manifest["spec"]["podManagementPolicy"] = "Parallel"
    manifest["spec"]["template"]["metadata"]["annotations"][GANG] = "true"
    stack.apply(manifest)
    for name in ("pair-0", "pair-1"):
        created(stack, namespace, name)
    set_gates(stack, namespace, "pair-0", [])

    prefix = f"gang {namespace}/pair: 1 of 2 members exist"

    def waits_as_for_a_missing_member():
        pods = {n: live(stack, namespace, n) for n in ("pair-0", "pair-1")}
        bound = {n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")}
        assert not bound, (f"members bound while pair-1 is gated: {bound}\n"
                           + describe(stack, namespace, "pair-0", "pair-1"))
        condition = scheduled_condition(pods["pair-0"])
        if not condition or (condition["status"], condition.get("reason")) != ("False", "Unschedulable"):
            return None
        return [e for e in binds_warnings(stack, namespace, pods["pair-0"]["metadata"]["uid"])
                if e.get("reason") == "FailedScheduling" and e["message"].startswith(prefix)]
    try:
        stack.wait_for(waits_as_for_a_missing_member, 30, f"pair-0 waiting with {prefix!r}", interval=0.3)
    except TimeoutError as timeout:
        raise AssertionError(f"{timeout}\n" + describe(stack, namespace, "pair-0", "pair-1")) from None
    problems = left_alone(stack, namespace, "pair-1", node, ["0", "1"], since)
    assert not problems, ("bind acted on the gated member pair-1, or held its gang's GPUs:\n  - "
                          + "\n  - ".join(problems) + "\n" + describe(stack, namespace, "pair-0", "pair-1"))

    set_gates(stack, namespace, "pair-1", [])

    def both_bound():
        pods = {n: live(stack, namespace, n) for n in ("pair-0", "pair-1")}
        return pods if all(p["spec"].get("nodeName") for p in pods.values()) else None
    try:
        pods = stack.wait_for(both_bound, 30, "pair-0 and pair-1 bound", interval=0.1)
    except TimeoutError as timeout:
        raise AssertionError(f"{timeout}\n" + describe(stack, namespace, "pair-0", "pair-1")) from None
    placed = {n: (p["spec"]["nodeName"], p["metadata"]["annotations"][DEVICES_ANNOTATION]) for n, p in pods.items()}
    assert placed == {"pair-0": (node, "0"), "pair-1": (node, "1")}


# -- 4. explain: waiting for its scheduling gates ----------------------------------------------------
def test_explain_says_a_gated_pod_waits_for_its_scheduling_gates(stack, namespace, own_nodes, reader):
    [node] = own_nodes(1)
    name = gated_pod(stack, namespace, "bare", node, "1,2")
    code, out, err = run("explain", f"pod/{name}", "-n", namespace, "--kubeconfig", reader,
                         "--scheduler-namespace", BIND_NAMESPACE, "-o", "json")
    answer = json.loads(out)
    decided = answer["scheduling"]
    shown = f"exit {code}, stderr {err!r}, scheduling {decided}, placeable {answer.get('placeable')}"
    assert answer["podScheduled"]["reason"] == "SchedulingGated", shown
    assert answer["placeable"] is False, shown
    assert code == 1, shown  # not placeable
    assert decided["action"] == "wait", shown
    assert decided["plugin"] == "SchedulingGates", shown
    assert re.search(r"waiting for (its )?scheduling gates", decided["message"] or "", re.IGNORECASE), shown
    assert GATE in decided["message"], shown

    code, out, _ = run("explain", f"pod/{name}", "-n", namespace, "--kubeconfig", reader,
                       "--scheduler-namespace", BIND_NAMESPACE)
    [line] = [line for line in out.splitlines() if line.startswith("Scheduling:")]
    assert code == 1 and "scheduling gates" in line.lower() and GATE in line and "bind to" not in line, out
