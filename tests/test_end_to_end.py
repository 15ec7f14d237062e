"""The whole system on a real control plane: StatefulSet controller, API server calling the
webhook over TLS, the event source, bind and the Binding API."""
from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from localcp.cloudevents import Sender, cloudevent_headers

REPO = Path(__file__).resolve().parent.parent
SEED = yaml.safe_load((REPO / "check" / "statefulset.yaml").read_text())
EXPECTED = {0: ("node1", "0,1"), 1: ("node2", "2"), 2: ("node3", "0,1,2"), 3: ("node4", "3"), 4: ("node4", "3")}


def statefulset(namespace: str, annotation: str | None = None, replicas: int = 5, name: str = "gpu-scheduler-check"):
    manifest = json.loads(json.dumps(SEED))
    manifest["metadata"].update(namespace=namespace, name=name)
    manifest["spec"]["replicas"] = replicas
    manifest["spec"]["serviceName"] = name
    manifest["spec"]["selector"]["matchLabels"] = {"app": name}
    manifest["spec"]["template"]["metadata"]["labels"] = {"app": name}
    if annotation is not None:
        manifest["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] = annotation
    return manifest


def pod_manifest(namespace: str, name: str, annotation: str | None, scheduler: str = "gpu-scheduler") -> dict:
    metadata = {"name": name, "namespace": namespace}
    if annotation is not None:
        metadata["annotations"] = {"gpu-scheduling-map": annotation}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "busybox"}]}}


def env_of(pod: dict) -> dict[str, str]:
    return {v["name"]: v.get("value") for v in pod["spec"]["containers"][0].get("env", [])}


def test_seed_statefulset_is_placed_with_its_devices(stack, namespace):
    stack.apply(statefulset(namespace))
    pods = stack.wait_bound(namespace, 5, "app=gpu-scheduler-check")
    placed = {int(p["metadata"]["name"].rsplit("-", 1)[1]): (p["spec"]["nodeName"], env_of(p)["CUDA_VISIBLE_DEVICES"])
              for p in pods}
    assert placed == EXPECTED
    for pod in pods:
        assert env_of(pod)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert pod["metadata"]["labels"]["gpu-scheduler/managed"] == "true"
        assert pod["status"]["phase"] == "Pending"  # bound, not run: these nodes have no kubelet (test_nodes.py runs them)


def test_malformed_map_is_denied_with_the_line(stack, namespace):
    bad = "0=node1:0\n1=node2:2,2\n"
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(pod_manifest(namespace, "p-0", bad)), check=False)
    assert result.returncode != 0
    assert 'admission webhook "mutate.gpu-scheduler.local" denied the request' in result.stderr
    assert "line 2 '1=node2:2,2': device 2 is listed more than once" in result.stderr
    # Through a StatefulSet: the controller's FailedCreate event carries the same message.
    stack.apply(statefulset(namespace, bad, replicas=1))

    def failed_create():
        events = stack.api.list_namespaced_event(namespace, field_selector="reason=FailedCreate").items
        return [e.message for e in events]
    messages = stack.wait_for(failed_create, 30, "a FailedCreate event")
    assert "line 2 '1=node2:2,2'" in messages[0]
    assert stack.pods(namespace) == []


def test_a_malformed_gang_is_denied_with_the_fix(stack, namespace):
    pod = pod_manifest(namespace, "g-0", "0=node1:0\n1=node2:2\n")
    pod["metadata"]["annotations"]["gpu-scheduler/gang"] = "3"  # more members than the map has entries
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(pod), check=False)
    assert result.returncode != 0
    assert 'admission webhook "mutate.gpu-scheduler.local" denied the request' in result.stderr
    assert ("gpu-scheduler/gang: '3' must be from 1 to the map's 2 entries: set gpu-scheduler/gang to \"true\""
            in result.stderr)
    pod["metadata"]["annotations"]["gpu-scheduler/gang"] = "2"
    stack.apply(pod)  # a well-formed gang passes
    assert [p["metadata"]["name"] for p in stack.pods(namespace)] == ["g-0"]


def test_index_without_entry_stays_pending_and_unbound(stack, namespace):
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(pod_manifest(namespace, "worker-9", "0=node1:0\n")))
    assert "pod index 9 has no entry" in result.stderr  # kubectl prints the admission warning
    stack.wait_for(lambda: ("add", "worker-9") in stack.source.sent, 20, "the add event delivered")
    stack.ping()
    pod = stack.pods(namespace)[0]
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert "CUDA_VISIBLE_DEVICES" not in env_of(pod)


def test_duplicated_events_bind_once(stack, namespace):
    stack.source.paused = True
    try:
        stack.apply(pod_manifest(namespace, "dup-0", "0=node2:1\n"))
    finally:
        stack.source.paused = False
    pod = stack.pods(namespace)[0]
    sender = Sender(stack.bind_url, delays=())
    answers = []
    for _ in range(3):
        response = sender.http.request("POST", stack.bind_url, body=json.dumps(pod).encode(),
                                       headers=cloudevent_headers("add", pod, stack.cp.server))
        answers.append((response.status, json.loads(response.data)["result"]))
    # bind's own watch may bind it before the first event: each answer is then AlreadyBound (or,
    # from a copy read after the binding, ignored); never a second Binding.
    assert [status for status, _ in answers] == [200] * 3
    assert sum(result == "Bound" for _, result in answers) <= 1
    assert {result for _, result in answers} <= {"Bound", "AlreadyBound", "ignored"}
    assert stack.pods(namespace)[0]["spec"]["nodeName"] == "node2"
    from test_faults import scheduled_once
    scheduled_once(stack, namespace, ["dup-0"])


def test_a_pod_the_events_missed_is_placed_without_a_ping(stack, namespace):
    """bind's own watch of pending pods is what must be placed; a ping is only a check."""
    stack.source.paused = True  # the adapter was down, or never saw the pod
    try:
        stack.apply(statefulset(namespace, replicas=2))
        pods = stack.wait_bound(namespace, 2, timeout=15)
    finally:
        stack.source.paused = False
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["node1", "node2"]
    answer = stack.ping()
    assert answer["status"] == 200 and answer["result"] == "resynced"


def test_a_stale_event_for_a_re_created_pod_binds_nothing(stack, namespace):
    """The adapter holds events while it is slow: the add of a pod deleted and re-created under
    the same name, with another map, arrives after the pod is gone. bind sends the UID as the
    Binding's precondition and the API server honours it: the stale event binds nothing (200,
    never retried), and the new pod is placed by its own event, where its own map says."""
    stack.source.hold()
    try:
        stack.apply(pod_manifest(namespace, "same-0", "0=node3:0\n"))
        old = stack.pods(namespace)[0]
        stack.cp.kubectl("delete", "pod", "-n", namespace, "same-0", "--grace-period=0", "--force")
        stack.apply(pod_manifest(namespace, "same-0", "0=node4:1\n"))
        new = stack.pods(namespace)[0]
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
    finally:
        stack.source.release()
    [pod] = stack.wait_bound(namespace, 1)
    assert (pod["metadata"]["uid"], pod["spec"]["nodeName"]) == (new["metadata"]["uid"], "node4")
    stack.wait_for(stack.source.idle, 20, "the held events answered")
    answers = [(status, result) for name, status, result in stack.source.sender.results if name == "same-0"]
    assert answers[0] == (200, "PodReplaced"), answers  # the stale add: refused, not retried
    # The new pod's own add: bound by it, or by bind's watch before it came.
    assert {(200, "Bound"), (200, "AlreadyBound")} & set(answers) and all(status == 200 for status, _ in answers), answers


def test_the_api_server_refuses_a_binding_made_from_an_older_version_of_the_pod(stack, namespace):
    """bind sends the version it decided from as the Binding's resourceVersion precondition
    (gpu_scheduler.binding.binding_for); the API server honours it: a pod changed since is not
    bound (409), the version it has now is."""
    from kubernetes.client.exceptions import ApiException
    stack.source.paused = True
    try:  # a scheduler nobody runs: nobody else binds it meanwhile
        stack.apply(pod_manifest(namespace, "versioned-0", "0=node1:0\n", scheduler="nobody"))
        [before] = stack.pods(namespace)
        stack.cp.kubectl("annotate", "pod", "-n", namespace, "versioned-0", "changed=yes")
        [after] = stack.pods(namespace)
        assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]

        def binding(version):
            return {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "versioned-0", "uid": before["metadata"]["uid"], "resourceVersion": version},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "node1"}}
        try:
            stack.api.create_namespaced_pod_binding("versioned-0", namespace, binding(before["metadata"]["resourceVersion"]),
                                                    _preload_content=False)
            raise AssertionError("a Binding from the older version was accepted")
        except ApiException as refused:
            assert refused.status == 409, refused
        assert not stack.pods(namespace)[0]["spec"].get("nodeName")
        stack.api.create_namespaced_pod_binding("versioned-0", namespace, binding(after["metadata"]["resourceVersion"]),
                                                _preload_content=False)
        assert stack.pods(namespace)[0]["spec"]["nodeName"] == "node1"
    finally:
        stack.source.paused = False


def test_the_controllers_pod_index_label_places_statefulset_replicas_from_ordinals_start(stack, namespace):
    """The StatefulSet controller labels each pod apps.kubernetes.io/pod-index;
    with spec.ordinals.start 3 its replicas are 3, 4, 5 and take those entries of the map."""
    manifest = statefulset(namespace, "3=node2:1\n4=node3:2\n5=node4:0,3\n", replicas=3)
    manifest["spec"]["ordinals"] = {"start": 3}
    stack.apply(manifest)
    pods = stack.wait_bound(namespace, 3, "app=gpu-scheduler-check")
    placed = {p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]: (p["spec"]["nodeName"], env_of(p)["CUDA_VISIBLE_DEVICES"])
              for p in pods}
    assert placed == {"3": ("node2", "1"), "4": ("node3", "2"), "5": ("node4", "0,3")}
    assert sorted(p["metadata"]["name"] for p in pods) == [f"gpu-scheduler-check-{i}" for i in (3, 4, 5)]


def test_an_indexed_jobs_pods_are_placed_by_their_completion_index(stack, namespace):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": namespace},
           "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3,
                    "template": {"metadata": {"annotations": {"gpu-scheduling-map": "0=node1:0\n1=node2:1\n2=node4:2,3\n"}},
                                 "spec": {"schedulerName": "gpu-scheduler", "restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}}}
    stack.apply(job)
    pods = stack.wait_bound(namespace, 3, "job-name=train")
    placed = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]:
              (p["spec"]["nodeName"], env_of(p)["CUDA_VISIBLE_DEVICES"]) for p in pods}
    assert placed == {"0": ("node1", "0"), "1": ("node2", "1"), "2": ("node4", "2,3")}


def test_logs_are_json_lines_with_pod_decision_and_latency(stack, namespace):
    stack.apply(pod_manifest(namespace, "log-0", "0=node1:0\n"))
    stack.wait_bound(namespace, 1)
    pod = f"{namespace}/log-0"

    def entries(name):
        lines = (stack.cp.workdir / f"{name}.log").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]
    placement = stack.wait_for(lambda: [e for e in entries("bind") if e.get("pod") == pod], 10, "bind's log")
    assert placement[0]["decision"] == "Bound" and placement[0]["node"] == "node1"
    assert placement[0]["uid"] and placement[0]["latency_ms"] >= 0 and placement[0]["level"] == "info"
    admission = [e for e in entries("mutate") if e.get("pod") == pod]
    assert admission[0]["decision"] == "Placed" and admission[0]["allowed"] is True
    assert admission[0]["latency_ms"] >= 0


def test_a_pod_bind_does_not_place_sends_bind_no_event(stack, namespace):
    """mutate labels only the pods bind places (spec.schedulerName gpu-scheduler), so the
    ApiServerSource sends bind nothing about a pod with a map that another scheduler places: each
    of its events (created, bound, every status change) cost bind an answer (issue 62)."""
    stack.apply(pod_manifest(namespace, "no-events-theirs-0", "0=node1:0\n", scheduler="nobody"))
    stack.apply(pod_manifest(namespace, "no-events-ours-0", "0=node1:0\n"))
    stack.wait_for(lambda: ("add", "no-events-ours-0") in stack.source.sent, 30, "the add event of ours")
    # The adapter sends in its watch's order: an event of theirs, created first, would be here by now.
    assert [sent for sent in stack.source.sent if sent[1] == "no-events-theirs-0"] == []
    [theirs] = [p for p in stack.pods(namespace) if p["metadata"]["name"] == "no-events-theirs-0"]
    assert "gpu-scheduler/managed" not in (theirs["metadata"].get("labels") or {})
