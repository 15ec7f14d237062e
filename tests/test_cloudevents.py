"""localcp/cloudevents.py, the events the tests and benchmarks post to bind themselves, held to
the real receive adapter's captures (tests/fixtures/sample-events/knative-v0.50.0/, re-taken by
localcp/capture_events.py): the same headers, the same shapes."""
from __future__ import annotations

import json
import re

import pytest

from localcp.cloudevents import cloudevent_headers, ping_headers
from tests.fixtures import SAMPLES

CAPTURES = SAMPLES / "knative-v0.50.0"
KINDS = {"add": "apiserversource-add-gpu-scheduler-check-0.json",
         "update": "apiserversource-update-gpu-scheduler-check-2-bound.json",
         "delete": "apiserversource-delete-gpu-scheduler-check-2-bound.json"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_headers_are_the_real_adapters(kind):
    captured = json.loads((CAPTURES / KINDS[kind]).read_text())
    made = cloudevent_headers(kind, captured["body"], captured["headers"]["Ce-Source"],
                              captured["headers"]["Kn-Namespace"])
    assert set(made) == set(captured["headers"])
    volatile = {"Ce-Id", "Ce-Time"}
    assert {k: v for k, v in made.items() if k not in volatile} == \
        {k: v for k, v in captured["headers"].items() if k not in volatile}
    # Go's RFC3339Nano in UTC, as the adapter writes it.
    pattern = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z"
    assert re.fullmatch(pattern, made["Ce-Time"]) and re.fullmatch(pattern, captured["headers"]["Ce-Time"])


def test_every_capture_is_the_adapters_and_names_its_pod():
    files = sorted(CAPTURES.glob("apiserversource-*.json"))
    assert len(files) == 5
    for path in files:
        captured = json.loads(path.read_text())
        headers, pod = captured["headers"], captured["body"]
        assert headers["Ce-Type"].split(".")[-1] in path.name
        assert headers["Ce-Subject"] == f"/apis/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
        assert headers["Kn-Namespace"] == "gpu-scheduler", "the source's namespace (knative/sources.yaml)"
        assert pod["metadata"]["labels"]["gpu-scheduler/managed"] == "true", "the source's selector"
        assert "Host" not in headers and "Content-Length" not in headers


def test_a_ping_is_binary_mode():
    headers = ping_headers()
    assert headers["Ce-Type"] == "dev.knative.sources.ping" and headers["Content-Type"] == "application/json"
