"""examples/ (the requests of docs/try-it.md's "Run a function locally") are the real captures and
the shipped PingSource, and the functions answer them as that page says."""
from __future__ import annotations

import base64
import json

import pytest
import yaml

from conftest import REPO
from localcp.cloudevents import ping_headers
from schemas import custom_resource_errors, load_documents, manifest_errors
from tests.fixtures import SAMPLES

EXAMPLES = REPO / "examples"


def headers_file(name: str) -> dict[str, str]:
    """A file of `Name: value` lines, as `curl -H @file` reads it."""
    return dict(line.split(": ", 1) for line in (EXAMPLES / name).read_text().splitlines())


def example(name: str) -> tuple[dict[str, str], bytes]:
    """The headers and body of an example request (headers: the .headers file, if any)."""
    headers = headers_file(f"{name}.headers") if (EXAMPLES / f"{name}.headers").exists() else {}
    return headers, (EXAMPLES / f"{name}.json").read_bytes()


ADAPTER = "knative-v0.50.0"  # the real receive adapter's captures (localcp/capture_events.py)


def captured(name: str) -> dict:
    return json.loads((SAMPLES / (ADAPTER if name.startswith("apiserversource-") else "k8s-1.34") / name).read_text())


def test_the_examples_are_the_captures():
    assert json.loads(example("admissionreview")[1]) == captured("admissionreview-v1-create-gpu-scheduler-check-1.json")["body"]
    add = captured("apiserversource-add-gpu-scheduler-check-0.json")
    headers, body = example("pod-add")
    assert (headers, json.loads(body)) == (add["headers"], add["body"])


def test_the_ping_example_is_the_shipped_pingsource_as_sent():
    [source] = [d for d in yaml.safe_load_all((REPO / "knative" / "sources.yaml").read_text())
                if d and d["kind"] == "PingSource"]
    headers, body = example("ping")
    meta = source["metadata"]
    expected = ping_headers(f"/apis/v1/namespaces/{meta['namespace']}/pingsources/{meta['name']}")
    assert headers.keys() == expected.keys()
    assert ({k: v for k, v in headers.items() if k not in ("Ce-Id", "Ce-Time")} ==
            {k: v for k, v in expected.items() if k not in ("Ce-Id", "Ce-Time")})
    assert (body.decode().strip(), headers["Content-Type"]) == (source["spec"]["data"], source["spec"]["contentType"])


def test_mutate_answers_the_example_review_with_the_pods_devices(mutate_server):
    status, body, _ = mutate_server.post(example("admissionreview")[1])
    response = json.loads(body)["response"]
    patch = json.loads(base64.b64decode(response["patch"]))
    assert (status, response["allowed"]) == (200, True)
    [env] = [op["value"] for op in patch if op["path"] == "/spec/containers/0/env"]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": "2"} in env  # index 1 of the seed map: node2:2


@pytest.mark.parametrize("name", ["pod-add", "ping"])
def test_bind_without_an_api_server_keeps_the_example_event_for_its_queue(bind_server, name):
    """Its queue and its watches retry once the API server answers: no redelivery is asked for."""
    headers, body = example(name)
    status, answer, _ = bind_server.post(body, headers)
    assert (status, json.loads(answer)["result"]) == (200, "Retry")


# -- the workload examples users copy: examples/jobset-torchrun.yaml, examples/lws-vllm.yaml -----
WORKLOAD_EXAMPLES = {"jobset-torchrun.yaml": "JobSet", "lws-vllm.yaml": "LeaderWorkerSet"}
# ... and the pool examples (further down): their pods have no index and take free entries.
POOL_EXAMPLES = {"deployment-vllm.yaml": ("apps/v1", "Deployment"),
                 "knative-service.yaml": ("serving.knative.dev/v1", "Service")}


def workload_example(name: str) -> dict:
    """The example's one JobSet or LeaderWorkerSet (an example may hold a Service besides)."""
    [found] = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d["kind"] == WORKLOAD_EXAMPLES[name]]
    return found


def pods_of(workload: dict) -> list[dict]:
    """The metadata of every pod the workload's controllers create, labelled as they label them
    (tests/test_workload_controllers_cluster.py sees these labels on the real controllers' pods),
    with what mutate writes on a JobSet's pods."""
    from gpu_scheduler.workloads import jobset_annotations

    name, pods = workload["metadata"]["name"], []
    if workload["kind"] == "JobSet":
        for job in workload["spec"]["replicatedJobs"]:
            template, written = job["template"]["spec"]["template"], jobset_annotations(workload, job["name"])
            for job_index in range(job["replicas"]):
                for completion in range(job["template"]["spec"]["completions"]):
                    pods.append({
                        "name": f"{name}-{job['name']}-{job_index}-{completion}-abcde",
                        "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                                   "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
                                   "jobset.sigs.k8s.io/job-index": str(job_index),
                                   "batch.kubernetes.io/job-completion-index": str(completion)},
                        "annotations": {**template["metadata"]["annotations"], **written,
                                        "batch.kubernetes.io/job-completion-index": str(completion)}})
        return pods
    lws = workload["spec"]["leaderWorkerTemplate"]
    for group in range(workload["spec"]["replicas"]):
        for worker in range(lws["size"]):
            template = lws["leaderTemplate" if worker == 0 and "leaderTemplate" in lws else "workerTemplate"]
            pods.append({
                "name": f"{name}-{group}" + (f"-{worker}" if worker else ""),
                "labels": {"leaderworkerset.sigs.k8s.io/name": name,
                           "leaderworkerset.sigs.k8s.io/group-index": str(group),
                           "leaderworkerset.sigs.k8s.io/worker-index": str(worker)},
                "annotations": {**template["metadata"]["annotations"],
                                "leaderworkerset.sigs.k8s.io/size": str(lws["size"])}})
    return pods


@pytest.mark.parametrize("name", WORKLOAD_EXAMPLES)
def test_a_workload_examples_pods_each_have_their_own_map_entry(name):
    """Its map parses, and the index gpu-scheduler reads for each pod the workload creates
    (JobSet: replicas × completions; LWS: replicas × size) is an entry of it, each pod its own."""
    from gpu_scheduler.podindex import pod_index
    from gpu_scheduler.schedmap import parse_map
    from localcp import demo

    workload = workload_example(name)
    templates = demo.pod_templates(workload)
    [text] = {t["metadata"]["annotations"]["gpu-scheduling-map"] for t in templates}  # one map for all
    entries = parse_map(text)
    pods = pods_of(workload)
    assert len(pods) == demo.pod_count(workload) == 4
    indexes = [pod_index(pod) for pod in pods]
    assert sorted(indexes) == sorted(entries) == [0, 1, 2, 3]
    assert {entries[i].node for i in indexes} == {"node1", "node2", "node3", "node4"}


@pytest.mark.parametrize("name", [*WORKLOAD_EXAMPLES, *POOL_EXAMPLES])
def test_a_workload_examples_pods_are_gpu_schedulers_and_request_no_gpus(name):
    """schedulerName gpu-scheduler on every template; no nvidia.com/gpu request (the device plugin
    would pick other GPUs); images named without a registry host."""
    from localcp import demo

    workload = workload_example(name) if name in WORKLOAD_EXAMPLES else pool_example(name)
    for template in demo.pod_templates(workload):
        assert template["spec"]["schedulerName"] == "gpu-scheduler"
        for container in template["spec"]["containers"]:
            resources = container.get("resources") or {}
            assert not any("nvidia.com/gpu" in (resources.get(k) or {}) for k in ("requests", "limits"))
            first = container["image"].split("/")[0]
            assert "." not in first and ":" not in first, container["image"]


def test_the_jobset_example_ranks_torchrun_by_the_pods_index():
    """NODE_RANK = job-index × completions + completion index, as the map's index; --nnodes is the
    number of pods; the master is the JobSet's first pod through its headless Service."""
    workload = workload_example("jobset-torchrun.yaml")
    [job] = workload["spec"]["replicatedJobs"]
    spec = job["template"]["spec"]
    assert (job["replicas"], spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (2, 2, 2, 0)
    [container] = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env["JOB_INDEX"] == "metadata.labels['jobset.sigs.k8s.io/job-index']"
    assert env["COMPLETION_INDEX"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["COMPLETIONS"] == str(spec["completions"])
    name = workload["metadata"]["name"]
    assert env["MASTER_ADDR"] == f"{name}-{job['name']}-0-0.{name}"
    script = container["command"][-1]
    assert "NODE_RANK=$((JOB_INDEX * COMPLETIONS + COMPLETION_INDEX))" in script
    assert "--nnodes=4" in script and "--node_rank=$NODE_RANK" in script


def test_the_lws_example_is_two_groups_of_two_with_the_same_map():
    workload = workload_example("lws-vllm.yaml")
    lws = workload["spec"]["leaderWorkerTemplate"]
    assert (workload["spec"]["replicas"], lws["size"]) == (2, 2)
    assert (lws["leaderTemplate"]["metadata"]["annotations"]["gpu-scheduling-map"]
            == lws["workerTemplate"]["metadata"]["annotations"]["gpu-scheduling-map"])


@pytest.mark.parametrize("name", WORKLOAD_EXAMPLES)
def test_plan_places_a_workload_examples_pods(name):
    """`kubectl gpu-scheduler plan -f` on the example: a row per pod, each placeable. Skipped while
    plan does not know the kind."""
    from gpu_scheduler import plan

    work = plan.workload(workload_example(name))
    if work is None:
        pytest.skip(f"plan does not know {WORKLOAD_EXAMPLES[name]} yet")
    result = plan.plan(work)
    assert sorted(row.index for row in result.rows) == [0, 1, 2, 3]
    assert all(row.placeable for row in result.rows), [row.problems for row in result.rows]


@pytest.mark.parametrize("workload", ["jobset", "lws", "deployment"])
def test_the_demo_runs_the_example_with_the_check_container(workload):
    """make demo WORKLOAD=...: the example with each template's containers the seed's; its map,
    annotations, labels and schedulerName kept (a Deployment's replicas and strategy too); a
    JobSet's pods restartPolicy Never."""
    from localcp import demo

    example, ran = demo.example_workload(workload), demo.demo_workload(workload)
    [seed_container] = yaml.safe_load(demo.SEED.read_text())["spec"]["template"]["spec"]["containers"]
    assert ran["metadata"] == example["metadata"]
    for shipped, changed in zip(demo.pod_templates(example), demo.pod_templates(ran), strict=True):
        assert changed["metadata"] == shipped["metadata"]
        assert changed["spec"]["containers"] == [seed_container]
        assert changed["spec"]["schedulerName"] == shipped["spec"]["schedulerName"]
        assert changed["spec"].get("restartPolicy") == ("Never" if workload == "jobset" else None)
    assert demo.pod_count(ran) == 4
    if workload == "deployment":
        assert {k: v for k, v in ran["spec"].items() if k != "template"} == {
            k: v for k, v in example["spec"].items() if k != "template"}


# -- the pool examples users copy: examples/deployment-vllm.yaml, examples/knative-service.yaml --
TENSOR_PARALLEL = "--tensor-parallel-size"


def pool_example(name: str) -> dict:
    """The example's Deployment or Knative Service (the Deployment's file holds a Service besides)."""
    [found] = [d for d in load_documents(EXAMPLES / name) if (d["apiVersion"], d["kind"]) == POOL_EXAMPLES[name]]
    return found


def pool_pod(workload: dict) -> dict:
    """A pod of the workload as its ReplicaSet creates it: generateName and a name whose suffix is
    all digits (a pool pod never reads an index from it), the template's labels and annotations,
    the ReplicaSet as its controller; a Knative revision's pod with the labels Knative sets."""
    template, name = workload["spec"]["template"], workload["metadata"]["name"]
    labels = {**(template["metadata"].get("labels") or {}), "pod-template-hash": "7d4b9c6f58"}
    replica_set = f"{name}-7d4b9c6f58"
    if workload["kind"] == "Service":  # Knative: revision <service>-00001, its Deployment <revision>-deployment
        labels.update({"serving.knative.dev/service": name, "serving.knative.dev/configuration": name,
                       "serving.knative.dev/revision": f"{name}-00001"})
        replica_set = f"{name}-00001-deployment-7d4b9c6f58"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{replica_set}-12345", "generateName": f"{replica_set}-", "namespace": "default",
                         "labels": labels, "annotations": dict(template["metadata"]["annotations"]),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set,
                                              "uid": "0e0b7b1a-0000-4000-8000-000000000001", "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": template["spec"]}


@pytest.mark.parametrize("name", POOL_EXAMPLES)
def test_a_pool_example_validates_against_its_schema(name):
    """Every document: a core kind with kubernetes-validate (strict, at the kind node's Kubernetes
    version); the Knative Service against Knative Serving's CRD (tests/fixtures/k8s-schemas),
    unknown fields refused even where the CRD preserves them."""
    for doc in load_documents(EXAMPLES / name):
        errors = manifest_errors(doc)
        if doc["apiVersion"].startswith("serving.knative.dev/"):
            errors += custom_resource_errors(doc, strict_preserved=True)
        assert not errors, f"examples/{name}: {doc['kind']} {doc['metadata']['name']}:\n" + "\n".join(errors)


@pytest.mark.parametrize("name", POOL_EXAMPLES)
def test_a_pool_examples_pods_take_entries_of_its_map(name):
    """Its pods are pool pods (no index; gpu-scheduler gives each a free entry) with the map as
    their pool, the Deployment's or the Knative Service's (every ReplicaSet, every revision). Entries are of the local nodes (node1..node4, GPUs below GPUS_PER_NODE), no two
    name one GPU, and all are as large as --tensor-parallel-size: every pod runs the same command."""
    from gpu_scheduler.fit import workload as workload_of
    from gpu_scheduler.placement import pool_of
    from gpu_scheduler.podindex import is_pool
    from gpu_scheduler.schedmap import parse_map
    from localcp.cluster import GPUS_PER_NODE

    workload = pool_example(name)
    pod = pool_pod(workload)
    assert is_pool(pod["metadata"])
    assert workload_of(pod) == ("owner", "default", workload["kind"], workload["metadata"]["name"])
    entries = parse_map(workload["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"])
    assert dict(pool_of(pod).entries) == dict(entries)
    gpus = [(entry.node, device) for entry in entries.values() for device in entry.device_indexes()]
    assert len(gpus) == len(set(gpus)), "two entries name one GPU"
    assert {node for node, _ in gpus} == {"node1", "node2", "node3", "node4"}
    assert all(device < int(GPUS_PER_NODE) for _, device in gpus)
    [container] = workload["spec"]["template"]["spec"]["containers"]
    arguments = container["args"]
    tensor_parallel = int(arguments[arguments.index(TENSOR_PARALLEL) + 1])
    assert {len(entry.devices) for entry in entries.values()} == {tensor_parallel}


def test_the_deployment_example_rolls_within_its_pool():
    """4 replicas, 4 entries: no spare entry, so maxSurge 0 (a surge pod would find every entry
    held) and maxUnavailable 1 (else the rollout could not start)."""
    from gpu_scheduler.schedmap import parse_map

    workload = pool_example("deployment-vllm.yaml")
    entries = parse_map(workload["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"])
    strategy = workload["spec"]["strategy"]
    assert (workload["spec"]["replicas"], len(entries)) == (4, 4)
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert strategy["rollingUpdate"]["maxSurge"] <= len(entries) - workload["spec"]["replicas"]
    [service] = [d for d in load_documents(EXAMPLES / "deployment-vllm.yaml") if d["kind"] == "Service"]
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]


def test_the_knative_example_leaves_a_new_revision_room_in_the_pool():
    """A fixed scale (min-scale = max-scale); every revision shares the Service's pool, and Knative
    keeps the old revision (up to max-scale pods) until the new one has its initial scale (the
    larger of initial-scale, default 1, and min-scale): the map has room for both. The file says
    which Knative feature flags it needs, with the command that turns them on."""
    from gpu_scheduler.schedmap import parse_map

    workload = pool_example("knative-service.yaml")
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    low, high = int(annotations["autoscaling.knative.dev/min-scale"]), int(annotations["autoscaling.knative.dev/max-scale"])
    initial = max(int(annotations.get("autoscaling.knative.dev/initial-scale", "1")), low)
    entries = parse_map(annotations["gpu-scheduling-map"])
    assert low == high == 4
    assert len(entries) >= high + initial
    assert workload["spec"]["template"]["spec"]["schedulerName"] == "gpu-scheduler"
    text = (EXAMPLES / "knative-service.yaml").read_text()
    assert ("kubectl -n knative-serving patch configmap config-features" in text
            and '"kubernetes.podspec-schedulername": "enabled"' in text
            and '"kubernetes.podspec-volumes-emptydir": "enabled"' in text)


def test_the_deployment_demos_checks():
    """make demo WORKLOAD=deployment's checks, offline: two pods on one entry fail it (a pod being
    deleted holds its entry until it is gone, one that has ended none); a log line whose CUDA_VISIBLE_DEVICES is not the pod's
    gpu-scheduler/devices, or a pod not where its entry says, is reported."""
    from types import SimpleNamespace

    from localcp import demo

    text = pool_example("deployment-vllm.yaml")["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"]

    def pod(name, entry, node, devices, deleting=False):
        meta = {"name": name, "annotations": {demo.MAP_ANNOTATION: text, demo.ENTRY_ANNOTATION: entry,
                                              demo.DEVICES_ANNOTATION: devices}}
        if deleting:
            meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": "Running"}}

    good = [pod("vllm-a", "0", "node1", "0,1"), pod("vllm-b", "1", "node2", "0,1")]
    ended = pod("vllm-done", "1", "node2", "0,1")
    ended["status"]["phase"] = "Succeeded"
    demo.check_entries(good + [ended])
    with pytest.raises(demo.SharedEntry, match=r"entry 1 held by vllm-b and vllm-c$"):
        demo.check_entries(good + [pod("vllm-c", "1", "node2", "0,1")])
    with pytest.raises(demo.SharedEntry, match=r"entry 1 held by vllm-b and vllm-old \(terminating\)"):
        demo.check_entries(good + [pod("vllm-old", "1", "node2", "0,1", deleting=True)])

    logs = {"vllm-a": "node=node1 CUDA_VISIBLE_DEVICES=0,1", "vllm-b": "node=node2 CUDA_VISIBLE_DEVICES=2,3",
            "vllm-c": "node=node3 CUDA_VISIBLE_DEVICES=0,1"}
    stack = SimpleNamespace(wait_for=lambda condition, *_: condition(),
                            cp=SimpleNamespace(kubectl=lambda *args: SimpleNamespace(stdout=logs[args[1]] + "\n")))
    assert demo.pool_table(stack, good[:1]) == []
    [wrong] = demo.pool_table(stack, good[1:])
    assert "vllm-b" in wrong and "CUDA_VISIBLE_DEVICES=2,3" in wrong and "annotation 0,1" in wrong
    [wrong] = demo.pool_table(stack, [pod("vllm-c", "3", "node3", "0,1")])
    assert wrong == "vllm-c: entry 3 of its map is node4:0,1; the pod is on node3 with devices 0,1"


def kueue_example(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / "kueue" / name).read_text()) if d]


def test_the_kueue_example_queues_the_job_by_the_gpus_it_pins():
    """examples/kueue/: the job's map has an entry for each completion index, each on its own node;
    its LocalQueue leads to a ClusterQueue covering gpu-scheduler.io/gpu and every resource the
    job's container requests (else Kueue refuses the workload), and the GPUs mutate writes on the
    template × the job's pods are the ClusterQueue's 8: one such job at a time."""
    from gpu_scheduler.quota import GPU_RESOURCE
    from gpu_scheduler.schedmap import parse_map
    from gpu_scheduler.templatecount import template_counts

    kinds = {d["kind"]: d for d in kueue_example("queues.yaml")}
    assert sorted(kinds) == ["ClusterQueue", "LocalQueue", "ResourceFlavor"]
    [job] = kueue_example("job.yaml")
    spec, template = job["spec"], job["spec"]["template"]
    assert (job["kind"], spec["completionMode"]) == ("Job", "Indexed")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == kinds["LocalQueue"]["metadata"]["name"]
    assert kinds["LocalQueue"]["spec"]["clusterQueue"] == kinds["ClusterQueue"]["metadata"]["name"]
    text = template["metadata"]["annotations"]["gpu-scheduling-map"]
    entries = parse_map(text)
    assert sorted(entries) == list(range(spec["completions"])) and spec["parallelism"] == spec["completions"]
    assert len({entries[i].node for i in entries}) == len(entries)
    assert template["spec"]["schedulerName"] == "gpu-scheduler"
    [group] = kinds["ClusterQueue"]["spec"]["resourceGroups"]
    [flavor] = group["flavors"]
    assert flavor["name"] == kinds["ResourceFlavor"]["metadata"]["name"]
    assert "nodeLabels" not in kinds["ResourceFlavor"].get("spec", {})  # the map chooses the nodes
    quota = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    assert set(quota) == set(group["coveredResources"])
    requested = {name for c in template["spec"]["containers"] for name in (c.get("resources") or {}).get("requests", {})}
    assert requested | {GPU_RESOURCE} <= set(group["coveredResources"])
    counts = template_counts(text, None)
    assert int(counts[GPU_RESOURCE]) * spec["parallelism"] == int(quota[GPU_RESOURCE]) == 8


def test_the_kueue_demo_runs_two_of_the_example_job_on_other_gpus():
    """make demo WORKLOAD=kueue: the example job twice, the check container, GPUs 0,1 and 2,3 of the
    same nodes (only the queue separates them), the queue label and counts kept."""
    from gpu_scheduler.schedmap import parse_map
    from localcp import demo

    [example] = kueue_example("job.yaml")
    first, second = demo.kueue_job(demo.FIRST, "0,1"), demo.kueue_job(demo.SECOND, "2,3")
    [seed_container] = yaml.safe_load(demo.SEED.read_text())["spec"]["template"]["spec"]["containers"]
    maps = [parse_map(j["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"]) for j in (first, second)]
    assert maps[0] == parse_map(example["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"])
    assert [e.node for e in maps[0].values()] == [e.node for e in maps[1].values()]
    assert {e.visible_devices for e in maps[0].values()} == {"0,1"}
    assert {e.visible_devices for e in maps[1].values()} == {"2,3"}
    for job in (first, second):
        assert job["metadata"]["labels"] == example["metadata"]["labels"]
        assert job["spec"]["template"]["spec"]["containers"] == [seed_container]
        assert job["spec"]["parallelism"] == example["spec"]["parallelism"]
