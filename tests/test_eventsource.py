"""The ApiServerSource stand-in sends what Knative's adapter sends: compared header by header
with the adapter's own capture in ../shared/sample-events/, on a pod from the real API server."""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import sample
from localcp.eventsource import ApiServerSource, cloudevent_headers, ping_headers
from test_end_to_end import pod_manifest

CAPTURED = sample("apiserversource-add-gpu-scheduler-check-0.json")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
RFC3339_NANO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z")


def test_headers_of_the_captured_pod_match_the_capture():
    pod = CAPTURED["body"]
    headers = cloudevent_headers("add", pod, CAPTURED["headers"]["Ce-Source"])
    assert set(headers) == set(CAPTURED["headers"])
    for name in set(headers) - {"Ce-Id", "Ce-Time"}:
        assert headers[name] == CAPTURED["headers"][name], name
    assert UUID.fullmatch(headers["Ce-Id"]) and RFC3339_NANO.fullmatch(headers["Ce-Time"])
    assert UUID.fullmatch(CAPTURED["headers"]["Ce-Id"]) and RFC3339_NANO.fullmatch(CAPTURED["headers"]["Ce-Time"])


def test_a_ping_is_a_binary_cloudevent_of_the_pingsource_type():
    headers = ping_headers()
    assert headers["Ce-Type"] == "dev.knative.sources.ping" and headers["Ce-Specversion"] == "1.0"


class Sink(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Sink.received.append((dict(self.headers), json.loads(body)))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_real_pod_add_looks_like_the_capture(stack, namespace):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    source = ApiServerSource(stack.api, f"http://127.0.0.1:{server.server_port}/", stack.cp.server,
                             "gpu-scheduler/managed=true").start()
    try:
        stack.apply(pod_manifest(namespace, "capture-0", "0=node1:0\n"))
        adds = stack.wait_for(lambda: [(h, b) for h, b in Sink.received if h.get("Ce-Name") == "capture-0"
                                       and h.get("Ce-Type", "").endswith(".add")], 20, "the add event")
    finally:
        source.stop()
        server.shutdown()
    headers, body = adds[0]
    sent = {k: v for k, v in headers.items() if k.startswith("Ce-") or k == "Content-Type"}
    assert set(sent) == set(CAPTURED["headers"])
    assert sent["Ce-Subject"] == f"/apis/v1/namespaces/{namespace}/pods/capture-0"
    assert (sent["Ce-Kind"], sent["Ce-Apiversion"], sent["Ce-Namespace"]) == ("Pod", "v1", namespace)
    assert sent["Ce-Source"] == stack.cp.server
    # The data is the whole pod, as the adapter sends it: the same top-level shape as the capture.
    assert set(body) == set(CAPTURED["body"])
    assert body["metadata"]["uid"] and "managedFields" in body["metadata"]
    assert body["metadata"]["labels"]["gpu-scheduler/managed"] == "true"
