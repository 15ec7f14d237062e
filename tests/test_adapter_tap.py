"""localcp/adapter.py's EventTap, between the real receive adapter and bind, without a cluster:
events forwarded with bind's answer returned, recorded; paused loses them; hold() queues them
and release() delivers them in the order they came (shuffled only if shuffle), what arrives
during the release going behind them; duplicate sends copies. A sink of the test's own records
what reaches it."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from localcp.adapter import EventTap
from localcp.cloudevents import cloudevent_headers


class Sink:
    def __init__(self, status: int = 200, delay: float = 0.0):
        self.got: list[str] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay if self.headers["Ce-Name"].endswith("slow") else 0)
                sink.got.append(self.headers["Ce-Name"])
                body = json.dumps({"result": "Bound"}).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def wired():
    sink = Sink(delay=0.3)
    tap = EventTap(sink.url)
    http = urllib3.PoolManager()

    def send(name: str) -> int:
        pod = {"metadata": {"name": name, "namespace": "ns"}}
        return http.request("POST", tap.url, body=json.dumps(pod).encode(),
                            headers=cloudevent_headers("add", pod, "https://api")).status
    yield sink, tap, send
    tap.stop()
    sink.server.shutdown()


def wait(condition, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_forwarded_with_binds_answer_and_recorded(wired):
    sink, tap, send = wired
    assert send("a") == 200
    assert sink.got == ["a"] and tap.sent == [("add", "a")] and tap.sender.results == [("a", 200, "Bound")]
    assert tap.received[0]["headers"]["Ce-Name"] == "a"


def test_paused_loses_events(wired):
    sink, tap, send = wired
    tap.paused = True
    assert send("lost") == 200
    assert sink.got == [] and tap.dropped == ["lost"]


def test_held_events_are_delivered_in_order_and_later_ones_behind_them(wired):
    sink, tap, send = wired
    tap.hold()
    for name in ("1-slow", "2", "3"):
        assert send(name) == 202
    assert tap.queued() == 3 and sink.got == [] and not tap.idle()
    tap.release()
    assert send("4") in (200, 202)  # during the release: behind the held ones
    wait(tap.idle)
    assert sink.got == ["1-slow", "2", "3", "4"]


def test_duplicates_and_shuffle(wired):
    sink, tap, send = wired
    tap.duplicate, tap.shuffle = 3, True
    tap.hold()
    for name in ("a", "b", "c"):
        send(name)
    assert tap.queued() == 9
    tap.release()
    wait(tap.idle)
    assert sorted(sink.got) == sorted(["a", "b", "c"] * 3) and sink.got != ["a"] * 3 + ["b"] * 3 + ["c"] * 3
