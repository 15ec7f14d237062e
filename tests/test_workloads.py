"""JobSet and LeaderWorkerSet pods: their index (gpu_scheduler/podindex.py), their workload and gang
(fit.workload, fit.gang_key, plugins/gang.py), what mutate writes on a JobSet's pods
(gpu_scheduler/workloads.py, admission.decide), and mutate's JobSet reader's failures
(functions/mutate/jobsets.py). The pods are labelled as the real controllers label them (the
cluster tests, tests/test_workloads_cluster.py, run those controllers)."""
from __future__ import annotations

import base64
import json
import sys

import pytest

from gpu_scheduler.admission import Review, decide
from gpu_scheduler.fit import gang_key, workload
from gpu_scheduler.gangask import GangError, gang_size
from gpu_scheduler.plugins.gang import gang_name
from gpu_scheduler.podindex import IndexUnknown, index_source, pod_index
from gpu_scheduler.workloads import WorkloadUnreadable, jobset_annotations, jobset_pod
from kubeapi.errors import APIError
from tests.conftest import REPO

MAP = "0=node1:0\n1=node1:1\n2=node2:0\n3=node2:1\n"


def jobset_pod_meta(job: int, completion: int, completions: int | None = 2, **annotations: str) -> dict:
    extra = {"gpu-scheduler/job-completions": str(completions)} if completions is not None else {}
    return {"name": f"train-node-{job}-{completion}-abcde", "namespace": "team",
            "labels": {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/jobset-uid": "u1",
                       "jobset.sigs.k8s.io/replicatedjob-name": "node", "jobset.sigs.k8s.io/job-index": str(job),
                       "jobset.sigs.k8s.io/replicatedjob-replicas": "2", "batch.kubernetes.io/job-completion-index":
                       str(completion), "job-name": f"train-node-{job}"},
            "annotations": {"gpu-scheduling-map": MAP, "batch.kubernetes.io/job-completion-index": str(completion),
                            **extra, **annotations},
            "ownerReferences": [{"kind": "Job", "name": f"train-node-{job}", "controller": True}]}


def lws_pod_meta(group: int, worker: int, size: int = 3, **annotations: str) -> dict:
    name = f"serve-{group}" if worker == 0 else f"serve-{group}-{worker}"
    owner = "serve" if worker == 0 else f"serve-{group}"
    return {"name": name, "namespace": "team",
            "labels": {"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": str(group),
                       "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
                       "apps.kubernetes.io/pod-index": str(group if worker == 0 else worker)},
            "annotations": {"gpu-scheduling-map": MAP, "leaderworkerset.sigs.k8s.io/size": str(size), **annotations},
            "ownerReferences": [{"kind": "StatefulSet", "name": owner, "controller": True}]}


@pytest.mark.parametrize("job, completion, index", [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)])
def test_a_jobset_pod_index_is_job_index_times_completions_plus_completion_index(job, completion, index):
    meta = jobset_pod_meta(job, completion)
    assert pod_index(meta) == index and index_source(meta).name == "JobSet"


def test_job_0_of_a_jobset_needs_no_completions_and_job_1_is_told_what_is_missing():
    assert pod_index(jobset_pod_meta(0, 1, completions=None)) == 1
    with pytest.raises(IndexUnknown) as why:
        pod_index(jobset_pod_meta(1, 0, completions=None))
    assert "annotation gpu-scheduler/job-completions" in str(why.value)
    assert "the webhook did not admit this pod" in str(why.value) and "delete the pod" in str(why.value)


def test_a_completion_index_past_the_completions_is_refused():
    with pytest.raises(IndexUnknown, match="not below the Job's completions 2"):
        pod_index(jobset_pod_meta(1, 2))


@pytest.mark.parametrize("group, worker, index", [(0, 0, 0), (0, 2, 2), (1, 0, 3), (1, 1, 4), (1, 2, 5)])
def test_a_leader_worker_set_pod_index_is_group_times_size_plus_worker(group, worker, index):
    meta = lws_pod_meta(group, worker)
    assert pod_index(meta) == index and index_source(meta).name == "LeaderWorkerSet"


def test_a_leader_worker_set_pod_without_its_labels_is_told_what_is_missing():
    meta = lws_pod_meta(1, 1)
    del meta["labels"]["leaderworkerset.sigs.k8s.io/worker-index"]
    with pytest.raises(IndexUnknown, match="label leaderworkerset.sigs.k8s.io/worker-index is missing.*webhook"):
        pod_index(meta)
    meta = lws_pod_meta(0, 3, size=3)
    with pytest.raises(IndexUnknown, match="worker-index 3 is not below its size 3"):
        pod_index(meta)


def test_the_index_label_annotation_names_the_label_that_holds_the_index():
    meta = {"name": "x-abcde", "labels": {"example.com/rank": "7", "apps.kubernetes.io/pod-index": "1"},
            "annotations": {"gpu-scheduler/index-label": "example.com/rank"}}
    assert pod_index(meta) == 7 and index_source(meta).name == "IndexLabel"
    meta["annotations"]["gpu-scheduler/index-label"] = "example.com/other"
    with pytest.raises(IndexUnknown, match="names label 'example.com/other', which the pod does not carry"):
        pod_index(meta)


def test_the_workload_is_the_jobset_or_the_leader_worker_set_and_each_lws_group_its_own_gang():
    job0, job1 = {"metadata": jobset_pod_meta(0, 0)}, {"metadata": jobset_pod_meta(1, 1)}
    assert workload(job0) == workload(job1) == ("owner", "team", "JobSet", "train")
    assert gang_key(job0) == gang_key(job1)
    leader, worker, other = ({"metadata": lws_pod_meta(0, 0)}, {"metadata": lws_pod_meta(0, 2)},
                             {"metadata": lws_pod_meta(1, 1)})
    assert workload(leader) == workload(worker) == workload(other) == ("owner", "team", "LeaderWorkerSet", "serve")
    assert gang_key(leader) == gang_key(worker) != gang_key(other)
    assert gang_name(other) == "team/serve group 1"


def test_a_gang_is_the_jobsets_pods_that_ask_for_it_and_an_lws_groups_size():
    assert gang_size({"metadata": jobset_pod_meta(1, 0, **{"gpu-scheduler/gang": "true",
                                                            "gpu-scheduler/gang-size": "5"})}) == 5
    with pytest.raises(GangError, match="without annotation gpu-scheduler/gang-size"):
        gang_size({"metadata": jobset_pod_meta(1, 0, **{"gpu-scheduler/gang": "true"})})
    assert gang_size({"metadata": lws_pod_meta(1, 0, size=3, **{"gpu-scheduler/gang": "true"})}) == 3
    with pytest.raises(GangError, match="must be from 1 to the group's size, 3"):
        gang_size({"metadata": lws_pod_meta(1, 0, size=3, **{"gpu-scheduler/gang": "4"})})


def a_jobset(gang_on_driver: bool = True) -> dict:
    def job(name, replicas, parallelism, completions, gang):
        annotations = {"gpu-scheduling-map": MAP, **({"gpu-scheduler/gang": "true"} if gang else {})}
        return {"name": name, "replicas": replicas, "template": {"spec": {
            "parallelism": parallelism, "completions": completions,
            "template": {"metadata": {"annotations": annotations}, "spec": {}}}}}
    return {"metadata": {"name": "train", "namespace": "team", "uid": "u1"},
            "spec": {"replicatedJobs": [job("node", 2, 2, 2, True), job("driver", 1, 1, 1, gang_on_driver),
                                        job("other", 3, 1, 1, False)]}}


def test_mutate_writes_the_jobs_completions_and_the_gangs_size_summed_over_the_replicated_jobs_that_ask():
    assert jobset_annotations(a_jobset(), "node") == {"gpu-scheduler/job-completions": "2", "gpu-scheduler/gang-size": "5"}
    assert jobset_annotations(a_jobset(gang_on_driver=False), "node")["gpu-scheduler/gang-size"] == "4"
    assert jobset_annotations(a_jobset(), "other") == {"gpu-scheduler/job-completions": "1"}
    assert jobset_annotations(a_jobset(), "absent") is None


def review_of(meta: dict) -> Review:
    pod = {"metadata": meta, "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c"}]}}
    return Review("admission.k8s.io/v1", "uid", "CREATE", "pods", pod, False)


def test_decide_writes_what_the_jobset_gives_and_places_the_pod_by_it():
    meta = jobset_pod_meta(1, 1, completions=None, **{"gpu-scheduler/gang": "true"})
    read = []
    decision = decide(review_of(meta), quota=False, jobset_of=lambda *key: read.append(key) or a_jobset())
    assert read == [("team", "train", "u1")] and decision.allowed and decision.reason == "Placed"
    ops = {op["path"]: op["value"] for op in decision.patch}
    assert ops["/metadata/annotations/gpu-scheduler~1job-completions"] == "2"
    assert ops["/metadata/annotations/gpu-scheduler~1gang-size"] == "5"
    env = ops["/spec/containers/0/env"]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": "1"} in env  # index 3: node2's GPU 1
    assert jobset_pod({"metadata": {**meta, "annotations": {**meta["annotations"], **{
        "gpu-scheduler/job-completions": "2", "gpu-scheduler/gang-size": "5"}}}}) is None  # nothing more to read


@pytest.mark.parametrize("retry, code", [(True, 503), (False, 404)])
def test_a_jobset_that_cannot_be_read_refuses_the_pod_with_a_status_that_says_whether_to_retry(retry, code):
    def unreadable(*key):
        raise WorkloadUnreadable("could not be read", retry=retry)
    decision = decide(review_of(jobset_pod_meta(1, 0, completions=None)), quota=False, jobset_of=unreadable)
    assert not decision.allowed and decision.code == code and decision.message == "JobSet team/train: could not be read"


# -- mutate's reader: its error paths (the cluster tests read real JobSets) --------------------------------
@pytest.fixture
def jobsets_module(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "functions" / "mutate"))
    sys.modules.pop("jobsets", None)
    import jobsets
    return jobsets


class FakeKube:
    def __init__(self, answers):
        self.answers, self.reads = list(answers), 0

    def read_jobset(self, namespace, name):
        self.reads += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.mark.parametrize("error, retry, words", [
    (APIError(404, "not found"), False, "not found"),
    (APIError(403, "forbidden"), True, "needs get on jobsets.jobset.x-k8s.io"),
    (APIError(500, "etcd timeout"), True, "500 etcd timeout"),
])
def test_the_reader_says_what_failed_and_whether_a_retry_can_help(jobsets_module, error, retry, words):
    reader = jobsets_module.JobSets(FakeKube([error]))
    with pytest.raises(WorkloadUnreadable) as caught:
        reader("team", "train", "u1")
    assert caught.value.retry is retry and words in caught.value.message


def test_the_reader_keeps_a_jobset_by_uid(jobsets_module):
    kube = FakeKube([a_jobset()])
    reader = jobsets_module.JobSets(kube)
    assert reader("team", "train", "u1") is reader("team", "train", "u1")
    assert kube.reads == 1
