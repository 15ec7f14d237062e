"""A gang's refusal as `kubectl gpu-scheduler explain` and `plan --cluster` give it, on the real
control plane, run as a user granted exactly permissions.PLUGIN: the seed map as a gang, blocked by
another workload that holds node4's GPU 3. bind binds none of the gang and gives each member one
FailedScheduling Event (gpu-scheduler/plugin: Gang, docs/gangs.md); explain of a member and plan
of the gang's manifest must say the same plugin and message, and that the gang is not placeable."""
from __future__ import annotations

import json

import yaml

from test_end_to_end import statefulset
from test_pending_reasons_cluster import PLUGIN_ANNOTATION, failed_scheduling
from test_plugin_cluster import reader, run  # noqa: F401 (reader: a fixture)

BIND_NAMESPACE = "gpu-scheduler"  # where the stack's bind keeps its records


def gang(namespace: str) -> dict:
    """The seed StatefulSet (node1..node4, index 3 and 4 on node4's GPU 3) as a gang of all 5."""
    obj = statefulset(namespace)
    obj["spec"]["podManagementPolicy"] = "Parallel"
    obj["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/gang"] = "true"
    return obj


def test_explain_and_plan_give_binds_refusal_of_a_blocked_gang(stack, namespace, reader, tmp_path):
    stack.apply(statefulset(namespace, "0=node4:3\n", replicas=1, name="team-a"))
    stack.wait_bound(namespace, 1, "app=team-a")
    manifest = gang(namespace)
    stack.apply(manifest)
    members = stack.wait_for(lambda: (lambda pods: pods if len(pods) == 5 else None)(
        stack.pods(namespace, "app=gpu-scheduler-check")), 60, "the gang's five members")
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in members}
    prefix = f"gang {namespace}/gpu-scheduler-check: 3 of 5 members placeable; member gpu-scheduler-check-3:"

    def events():
        found = {}
        for name, pod_uid in uid.items():
            event = next((e for e in failed_scheduling(stack, namespace, pod_uid)
                          if e["message"].startswith(prefix)), None)
            if event is None:
                return None
            found[name] = event
        return found
    events = stack.wait_for(events, 75, "bind's FailedScheduling Event for each member of the gang")
    messages = {e["message"] for e in events.values()}
    assert len(messages) == 1, messages
    [message] = messages
    assert f"GPU 3 on node4 is held by {namespace}/team-a-0 (" in message
    assert {(e["metadata"].get("annotations") or {}).get(PLUGIN_ANNOTATION) for e in events.values()} == {"Gang"}
    assert not any(p["spec"].get("nodeName") for p in stack.pods(namespace, "app=gpu-scheduler-check"))

    # explain of a member that is placeable on its own, and of the member the gang waits on
    for name in ("gpu-scheduler-check-0", "gpu-scheduler-check-3"):
        code, out, err = run("explain", f"pod/{name}", "-n", namespace, "--kubeconfig", reader,
                             "--scheduler-namespace", BIND_NAMESPACE, "-o", "json")
        assert (code, err) == (1, ""), out
        answer = json.loads(out)
        assert (answer["scheduling"]["action"], answer["scheduling"]["plugin"], answer["scheduling"]["message"],
                answer["placeable"]) == ("wait", "Gang", events[name]["message"], False)
        assert answer["gang"]["name"] == f"{namespace}/gpu-scheduler-check" and answer["gang"]["size"] == 5
        assert answer["gang"]["verdict"] == {"plugin": "Gang", "reason": "GangMemberRefused", "message": message}
        assert answer["gang"]["bound"] == [] and answer["gang"]["missing"] == 0
        assert [(m["name"], m["state"], m["node"], m["plugin"]) for m in answer["gang"]["members"]] == [
            (f"{namespace}/gpu-scheduler-check-{i}", state, node, plugin) for i, state, node, plugin in (
                (0, "placeable", "node1", None), (1, "placeable", "node2", None), (2, "placeable", "node3", None),
                (3, "refused", "node4", "GPUsHeld"), (4, "refused", "node4", "GPUsHeld"))]
    code, out, _ = run("explain", "pod/gpu-scheduler-check-0", "-n", namespace, "--kubeconfig", reader,
                       "--scheduler-namespace", BIND_NAMESPACE)
    assert code == 1 and f"Scheduling:     waits in bind's queue, refused by Gang: {message}\n" in out
    assert f"Gang:           {namespace}/gpu-scheduler-check (5 members bound together or none; 0 bound)" in out

    # plan --cluster of the gang's manifest: every member waits with the gang's refusal
    path = tmp_path / "gang.yaml"
    path.write_text(yaml.safe_dump(manifest))
    code, out, err = run("plan", "-f", str(path), "--cluster", "--kubeconfig", reader,
                         "--scheduler-namespace", BIND_NAMESPACE, "-o", "json")
    assert (code, err) == (1, "")
    [work] = json.loads(out)["workloads"]
    assert work["placeable"] is False
    assert work["gang"]["verdict"] == {"plugin": "Gang", "reason": "GangMemberRefused", "message": message}
    assert [(p["cluster"]["decision"], p["cluster"]["plugin"], p["cluster"]["message"], p["placeable"])
            for p in work["pods"]] == [("wait", "Gang", message, False)] * 5
    code, out, _ = run("plan", "-f", str(path), "--cluster", "--kubeconfig", reader,
                       "--scheduler-namespace", BIND_NAMESPACE)
    assert code == 1 and f"  gang not placeable now: {message}\n" in out
