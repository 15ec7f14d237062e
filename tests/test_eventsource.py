"""The ApiServerSource stand-in is held to Knative's adapter: its configuration comes from
knative/sources.yaml as the adapter's K_SOURCE_CONFIG; what it sends for the same pod operations
is compared with the adapter's captures (tests/fixtures/sample-events/k8s-1.34/) header by header and
body field by field, ids and times aside; its delivery follows the policy measured there."""
from __future__ import annotations

import copy
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from conftest import REPO, release_namespace, sample
from gpu_scheduler.fit import DEVICES_ANNOTATION
from gpu_scheduler.quota import is_quota_resource
from gpu_scheduler.templatecount import TEMPLATE_COUNTS
from localcp.eventsource import (
    RETRY_DELAYS, ApiServerSource, Sender, SourceConfigError, apiserversource_manifest, cloudevent_headers,
    label_selector_string, ping_headers, pod_watches, rfc3339_nano, source_config,
)

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
RFC3339_NANO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z")
CAPTURES = {
    "add-sts-0": sample("k8s-1.34/apiserversource-add-gpu-scheduler-check-0.json"),
    "update-sts-2-bound": sample("k8s-1.34/apiserversource-update-gpu-scheduler-check-2-bound.json"),
    "delete-sts-2-bound": sample("k8s-1.34/apiserversource-delete-gpu-scheduler-check-2-bound.json"),
    "add-job-0": sample("k8s-1.34/apiserversource-add-indexed-job-0.json"),
    "update-job-0-bound": sample("k8s-1.34/apiserversource-update-indexed-job-bound.json"),
}
VOLATILE_HEADERS = {"Ce-Id", "Ce-Time", "Ce-Source", "Ce-Namespace", "Ce-Subject", "Kn-Namespace", "Ce-Name"}


# -- configuration ---------------------------------------------------------------------------
def test_the_shipped_source_becomes_the_adapters_config():
    config = source_config(apiserversource_manifest(), ["default", "team-a"])
    assert config == {
        "namespaces": ["default", "team-a"], "allNamespaces": True, "mode": "Resource",
        "resources": [{"gvr": {"Group": "", "Version": "v1", "Resource": "pods"},
                       "selector": "gpu-scheduler/managed=true"}],
    }
    assert pod_watches(config) == [(None, "gpu-scheduler/managed=true")]


def test_a_changed_manifest_changes_what_is_watched():
    manifest = copy.deepcopy(apiserversource_manifest())
    manifest["spec"]["namespaceSelector"] = {"matchLabels": {"team": "a"}}
    manifest["spec"]["resources"][0]["selector"] = {
        "matchLabels": {"gpu-scheduler/managed": "true"},
        "matchExpressions": [{"key": "app", "operator": "In", "values": ["b", "a"]},
                             {"key": "canary", "operator": "DoesNotExist"}]}
    config = source_config(manifest, ["team-a-1", "team-a-0"])
    assert config["allNamespaces"] is False
    selector = "app in (a,b),!canary,gpu-scheduler/managed=true"
    assert pod_watches(config) == [("team-a-0", selector), ("team-a-1", selector)]
    del manifest["spec"]["namespaceSelector"]  # no selector: the source's own namespace only
    assert pod_watches(source_config(manifest, ["x"])) == [("gpu-scheduler", selector)]


@pytest.mark.parametrize("selector, expected", [
    ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
    ({"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["y", "x"]}]}, "k notin (x,y)"),
    ({"matchExpressions": [{"key": "k", "operator": "Exists"}]}, "k"),
    ({}, ""),
    (None, ""),
])
def test_label_selectors_are_written_as_the_adapter_writes_them(selector, expected):
    assert label_selector_string(selector) == expected


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(mode="Reference"), "mode 'Reference'"),
    (lambda s: s.update(owner={"apiVersion": "apps/v1", "kind": "StatefulSet"}), "owner filters"),
    (lambda s: s["resources"].append({"apiVersion": "v1", "kind": "Event"}), "only v1 pods"),
    (lambda s: s.update(resources=[]), "no resources"),
])
def test_a_source_the_stand_in_cannot_honour_is_refused_at_start(change, message):
    manifest = copy.deepcopy(apiserversource_manifest())
    change(manifest["spec"])
    with pytest.raises(SourceConfigError, match=message):
        ApiServerSource.from_manifest(None, "http://127.0.0.1:1/", "https://127.0.0.1:2", [], manifest)


def test_the_manifest_read_is_the_one_deployed():
    documents = list(yaml.safe_load_all((REPO / "knative" / "sources.yaml").read_text()))
    assert apiserversource_manifest() in documents


# -- headers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_headers_for_a_captured_object_are_the_captured_headers(name):
    captured = CAPTURES[name]
    kind = captured["headers"]["Ce-Type"].rsplit(".", 1)[1]
    headers = cloudevent_headers(kind, captured["body"], captured["headers"]["Ce-Source"],
                                 captured["headers"]["Kn-Namespace"])
    assert set(headers) == set(captured["headers"])
    for header in set(headers) - {"Ce-Id", "Ce-Time"}:
        assert headers[header] == captured["headers"][header], header
    for stamp in (headers["Ce-Time"], captured["headers"]["Ce-Time"]):
        assert RFC3339_NANO.fullmatch(stamp)
    assert UUID.fullmatch(headers["Ce-Id"]) and UUID.fullmatch(captured["headers"]["Ce-Id"])


@pytest.mark.parametrize("ns, expected", [
    (1_700_000_000_252_126_900, "2023-11-14T22:13:20.2521269Z"),
    (1_700_000_000_000_000_000, "2023-11-14T22:13:20Z"),
    (1_700_000_000_000_000_001, "2023-11-14T22:13:20.000000001Z"),
])
def test_times_are_go_rfc3339_nano(ns, expected):
    assert rfc3339_nano(ns) == expected


def test_a_ping_is_a_binary_cloudevent_of_the_pingsource_type():
    headers = ping_headers()
    assert headers["Ce-Type"] == "dev.knative.sources.ping" and headers["Ce-Specversion"] == "1.0"


# -- delivery --------------------------------------------------------------------------------
class Recorder(BaseHTTPRequestHandler):
    """A sink that answers every request with `status` and records what it received, when."""
    status = 202
    received: list

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((time.monotonic(), dict(self.headers), json.loads(body)))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def sink():
    handler = type("Sink", (Recorder,), {"received": [], "status": 202})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{server.server_port}/"
    yield handler
    server.shutdown()


@pytest.mark.parametrize("status", [404, 413, 429, 502, 503, 504])
def test_retried_statuses_are_delivered_six_times_on_the_measured_schedule(sink, status):
    sink.status = status
    assert Sender(sink.url).send({"Ce-Id": "1", "Ce-Name": "p"}, b"{}") == status
    times = [t for t, _, _ in sink.received]
    assert len(times) == 6
    gaps = [b - a for a, b in zip(times, times[1:])]
    # At least the adapter's delays (0.1 s doubling); at most what a loaded machine adds.
    assert all(delay <= gap < delay + 1.0 for gap, delay in zip(gaps, RETRY_DELAYS)), gaps


@pytest.mark.parametrize("status", [400, 401, 403, 409, 500])
def test_other_errors_are_delivered_once(sink, status):
    sink.status = status
    sender = Sender(sink.url)
    assert sender.send({"Ce-Id": "1", "Ce-Name": "p"}, b"{}") == status
    assert len(sink.received) == 1 and sender.dropped == [("p", status)]


def test_while_one_event_is_retried_the_next_ones_wait(sink):
    sink.status = 503
    source = ApiServerSource(None, sink.url, "https://127.0.0.1:1", source_config(apiserversource_manifest(), []))
    source.watches = []  # no API server here: events are put in by hand, as the watch would
    source.start()
    try:
        for name in ("first", "second"):
            source._enqueue("add", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "n"}})
        deadline = time.monotonic() + 20
        while not source.idle() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        source.stop()
    names = [headers["Ce-Name"] for _, headers, _ in sink.received]
    assert names == ["first"] * 6 + ["second"] * 6


# -- the same operations as the captures, on the real API server ------------------------------
def _template(capture: str) -> tuple[dict, dict]:
    """The captured pod's own container (before mutate added its env) and map annotation."""
    pod = CAPTURES[capture]["body"]
    container = {key: pod["spec"]["containers"][0][key] for key in ("name", "image")}
    container["env"] = [pod["spec"]["containers"][0]["env"][0]]
    return container, {"gpu-scheduling-map": pod["metadata"]["annotations"]["gpu-scheduling-map"]}


def _statefulset_manifest(namespace: str) -> dict:
    """The capture's StatefulSet (the seed map, five replicas), rebuilt from its pod."""
    container, annotations = _template("add-sts-0")
    labels = {"app": "gpu-scheduler-check"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "gpu-scheduler-check", "namespace": namespace},
            "spec": {"serviceName": "gpu-scheduler-check", "replicas": 5, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": annotations},
                                  "spec": {"schedulerName": "gpu-scheduler", "containers": [container]}}}}


def _job_manifest(namespace: str) -> dict:
    """The capture's Indexed Job, rebuilt from its pod."""
    container, annotations = _template("add-job-0")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "indexed", "namespace": namespace},
            "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1,
                     "template": {"metadata": {"labels": {"app": "indexed"}, "annotations": annotations},
                                  "spec": {"schedulerName": "gpu-scheduler", "restartPolicy": "Never",
                                           "containers": [container]}}}}


_RANDOM_SUFFIX = re.compile(r"^(kube-api-access|indexed-0)-[a-z0-9]{5}$")
# Written by bind since the captures were made (the Binding's record of the devices placed, and
# the managed-fields entry of that write): bind's doing, not the event source's.
_BIND_RECORD = DEVICES_ANNOTATION
_VOLATILE_KEYS = {"uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "lastTransitionTime",
                  "time", "controller-revision-hash", "namespace"}


def _mutate_since(key: str) -> bool:
    """Written by mutate since the captures were made: the requests and limits a ResourceQuota
    counts (gpu_scheduler/quota.py), the template's count for Kueue (templatecount.py: the pods of
    a counted template carry its annotation), and their managed-fields entries. mutate's doing,
    not the event source's; the captures stay as the adapter sent them."""
    key = key.removeprefix("f:")
    return is_quota_resource(key) or key == TEMPLATE_COUNTS


def _shape(value, key: str = ""):
    """The object with what differs between two runs (ids, times, random suffixes, the
    namespace) replaced by placeholders: the rest must be equal, field by field."""
    if isinstance(value, dict):
        shaped, dropped = {}, False
        for k, v in value.items():
            if k == _BIND_RECORD or _mutate_since(k):
                dropped = True
                continue
            inner = _shape(v, k)
            if inner == {} and v != {} and k.removeprefix("f:") in ("requests", "limits"):
                dropped = True
                continue  # held only what mutate adds now: the capture's container had no requests
            shaped[UUID.sub("<uuid>", k)] = inner
        # A managed-fields map left with only its own "." entry held only what mutate adds now
        # (a container's resources, from a counted template): as the capture's, empty.
        return {} if dropped and shaped == {".": {}} else shaped
    if isinstance(value, list):
        return [_shape(v, key) for v in value]
    if key in _VOLATILE_KEYS or key.endswith("controller-uid"):
        return f"<{key}>"
    if isinstance(value, str):
        return _RANDOM_SUFFIX.sub(r"\1-<random>", UUID.sub("<uuid>", value))
    return value


def _differences(ours, theirs, path="") -> list[str]:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = [f"{path}.{k}: only in ours" for k in ours.keys() - theirs.keys()]
        out += [f"{path}.{k}: only in the capture" for k in theirs.keys() - ours.keys()]
        for k in ours.keys() & theirs.keys():
            out += _differences(ours[k], theirs[k], f"{path}.{k}")
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in _differences(a, b, f"{path}[{i}]")]
    return [] if ours == theirs else [f"{path}: {ours!r} != {theirs!r}"]


def test_the_same_operations_send_what_the_adapter_sent(stack, namespace, sink):
    """The captures' operations, replayed: the seed StatefulSet created (add of pod 0), pod 2
    bound (update), pod 2 force-deleted (delete), an Indexed Job created and bound."""
    source = ApiServerSource.from_manifest(stack.api, sink.url, stack.cp.server, [namespace]).start()
    try:
        stack.apply(_statefulset_manifest(namespace))
        stack.wait_bound(namespace, 5, timeout=60)
        stack.cp.kubectl("delete", "pod", "-n", namespace, "gpu-scheduler-check-2", "--grace-period=0", "--force")

        def sent(kind: str, name: str, bound: bool | None = None):
            return [(headers, body) for _, headers, body in sink.received
                    if headers["Ce-Type"].endswith(kind) and headers["Ce-Name"].startswith(name)
                    and (bound is None or bool(body["spec"].get("nodeName")) == bound)]
        stack.wait_for(lambda: sent(".delete", "gpu-scheduler-check-2"), 30, "the delete event")
        # The Job's map gives GPU 0 of node1 to its pod, which the StatefulSet's pod 0 holds: two
        # workloads, so bind waits for the StatefulSet to go (the captures were made one by one).
        release_namespace(stack, namespace)
        stack.apply(_job_manifest(namespace))
        stack.wait_for(lambda: sent(".update", "indexed-0-", bound=True), 60, "the Job's pod bound")
    finally:
        source.stop()
    ours = {
        "add-sts-0": sent(".add", "gpu-scheduler-check-0")[0],
        "update-sts-2-bound": sent(".update", "gpu-scheduler-check-2", bound=True)[0],
        "delete-sts-2-bound": sent(".delete", "gpu-scheduler-check-2")[0],
        "add-job-0": sent(".add", "indexed-0-")[0],
        "update-job-0-bound": sent(".update", "indexed-0-", bound=True)[0],
    }
    for name, captured in CAPTURES.items():
        headers, body = ours[name]
        # Host and Content-Length are the HTTP layer's (a Go server keeps them out of Header).
        assert set(headers) - {"Host", "Content-Length"} == set(captured["headers"]), name
        for header in set(captured["headers"]) - VOLATILE_HEADERS:
            assert headers[header] == captured["headers"][header], (name, header)
        assert _differences(_shape(body), _shape(captured["body"])) == [], name
    for _, headers, body in sink.received:
        assert headers["Kn-Namespace"] == "gpu-scheduler" and headers["Ce-Source"] == stack.cp.server
        assert headers["Ce-Subject"] == f"/apis/v1/namespaces/{namespace}/pods/{body['metadata']['name']}"
        assert (headers["Ce-Name"], headers["Ce-Namespace"]) == (body["metadata"]["name"], namespace)
        assert UUID.fullmatch(headers["Ce-Id"]) and RFC3339_NANO.fullmatch(headers["Ce-Time"])
