"""examples/ (the requests of docs/try-it.md's "Run a function locally") are the real captures and
the shipped PingSource, and the functions answer them as that page says."""
from __future__ import annotations

import base64
import json

import pytest
import yaml

from conftest import REPO
from localcp.eventsource import ping_headers
from tests.fixtures import SAMPLES

EXAMPLES = REPO / "examples"


def headers_file(name: str) -> dict[str, str]:
    """A file of `Name: value` lines, as `curl -H @file` reads it."""
    return dict(line.split(": ", 1) for line in (EXAMPLES / name).read_text().splitlines())


def example(name: str) -> tuple[dict[str, str], bytes]:
    """The headers and body of an example request (headers: the .headers file, if any)."""
    headers = headers_file(f"{name}.headers") if (EXAMPLES / f"{name}.headers").exists() else {}
    return headers, (EXAMPLES / f"{name}.json").read_bytes()


def captured(name: str) -> dict:
    return json.loads((SAMPLES / "k8s-1.34" / name).read_text())


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
