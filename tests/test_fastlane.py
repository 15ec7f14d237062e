"""The lane (serving/fastlane.py) answers exactly what gunicorn and Flask answer: bind served by
its image's entry point (serving/gunicorn_config.py) with the lane, and the same with
GPU_SCHEDULER_FAST_PATH=off (every request through gunicorn's parser and Flask), given the same
bytes. Besides the fast path's cases (tests/test_fastpath.py), the shapes of HTTP the lane gives
back to gunicorn or must get right itself: pipelined requests, a body in pieces or late, chunked
bodies, Expect, duplicate and malformed headers, Connection: close, and a kept-alive connection
that carries an event and then a probe. bind's API server is down here: every pod it would bind
is kept and retried by its queue in both."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid

import pytest

from bench.events import serve_bind_image
from tests.test_fastpath import bind_cases, event

BODY_SECONDS = 1.0


class ImageServer:
    """bind run by its image's entry point, on a port of this machine."""

    def __init__(self, env: dict[str, str]):
        self.process, self.port = serve_bind_image({"BODY_TIMEOUT_SECONDS": str(BODY_SECONDS), **env})

    def exchange(self, *pieces: bytes, pause: float = 0.0, answers: int = 1, timeout: float = 10) -> list[tuple]:
        """Send the pieces on one new connection (pausing between them), read `answers` answers:
        each (status, JSON or bytes body, headers), then whether the server closed the connection."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            for i, piece in enumerate(pieces):
                if i and pause:
                    time.sleep(pause)  # the delay between the pieces is what is tested
                sock.sendall(piece)
            reader = sock.makefile("rb")
            out = [read_response(reader) for _ in range(answers)]
            sock.settimeout(0.5)
            try:
                closed = reader.read(1) == b""
            except (TimeoutError, socket.timeout):
                closed = False
            return out, closed

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(timeout=20)


def read_response(reader) -> tuple:
    """The final answer (after any interim 1xx): status, body, content type, Connection."""
    while True:
        status_line = reader.readline()
        assert status_line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), status_line
        headers = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if not status_line.split()[1].startswith(b"1"):
            break
    body = reader.read(int(headers.get("content-length", 0)))
    try:
        body = json.loads(body)
        body.pop("event_id", None)
    except ValueError:
        pass
    return int(status_line.split()[1]), body, headers.get("content-type"), headers.get("connection", "").lower()


def post(body: bytes, headers: dict[str, str], path: str = "/", extra: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: bind", *(f"{k}: {v}" for k, v in headers.items() if v is not None)]
    if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1") + extra + b"\r\n" + body


@pytest.fixture(scope="module")
def servers(unreachable_kubeconfig):
    env = {"KUBECONFIG": str(unreachable_kubeconfig)}
    lane, plain = ImageServer(env), ImageServer({**env, "GPU_SCHEDULER_FAST_PATH": "off"})
    yield lane, plain
    lane.stop()
    plain.stop()


def same(servers, *pieces: bytes, **how) -> tuple:
    """The lane's answers, once seen equal to gunicorn's: status, body, content type, and whether
    the connection was closed after them. (gunicorn says "Connection: keep-alive" on an answer
    after which it closes a connection whose body came too late; the lane says "close".)"""
    answers = [server.exchange(*pieces, **how) for server in servers]
    assert [([a[:3] for a in said], closed) for said, closed in answers[1:]] == [([a[:3] for a in answers[0][0]], answers[0][1])]
    return answers[0]


def encoded(body) -> bytes:
    return body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()


@pytest.mark.parametrize("case", list(bind_cases()), ids=lambda case: case[0])
def test_the_fast_paths_cases_answered_the_same(servers, case):
    _, body, headers, path = case
    same(servers, post(encoded(body), {"Content-Type": "application/json", **headers}, path))


def add_event() -> tuple[bytes, dict[str, str]]:
    body, headers = event()
    return json.dumps(body).encode(), {"Content-Type": "application/json", **headers}


def test_two_pipelined_events_are_both_answered(servers):
    body, headers = add_event()
    (first, second), closed = same(servers, post(body, headers) + post(body, {**headers, "Ce-Id": str(uuid.uuid4())}),
                                   answers=2)
    assert first[0] == second[0] == 200 and not closed


def test_a_body_in_pieces_is_read_whole(servers):
    body, headers = add_event()
    request = post(body, headers)
    cut = request.index(b"\r\n\r\n") + 4
    [answer], _ = same(servers, request[:cut - 10], request[cut - 10:cut + 100], request[cut + 100:], pause=0.2)
    assert answer[0] == 200


def test_a_body_late_past_its_deadline_is_refused(servers):
    body, headers = add_event()
    request = post(body, headers)
    [answer], _ = same(servers, request[:-20], request[-20:], pause=BODY_SECONDS + 1)
    assert answer[0] == 400 and "not received within" in answer[1]["error"]


def test_a_chunked_body_is_gunicorns_to_read(servers):
    body, headers = add_event()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    [answer], _ = same(servers, post(chunked, {**headers, "Transfer-Encoding": "chunked"}))
    assert answer[0] == 200


def test_expect_100_continue(servers):
    body, headers = add_event()
    [answer], _ = same(servers, post(body, {**headers, "Expect": "100-continue"}))
    assert answer[0] == 200


@pytest.mark.parametrize("extra", [b"Content-Type: application/json\r\n", b"Content-Length: 3\r\n",
                                   b"X-Folded: a\r\n continued\r\n", b"No-Colon\r\n", b"Bad_Name: x\r\n"],
                         ids=["content-type twice", "content-length twice", "folded", "no colon", "underscore"])
def test_odd_heads_are_answered_as_gunicorn_answers_them(servers, extra):
    body, headers = add_event()
    same(servers, post(body, headers, extra=extra))


def test_http_1_0_and_other_methods(servers):
    body, headers = add_event()
    same(servers, post(body, headers).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    same(servers, post(body, headers).replace(b"POST", b"PUT", 1))


def test_connection_close_is_honoured(servers):
    body, headers = add_event()
    [answer], closed = same(servers, post(body, {**headers, "Connection": "close"}))
    assert answer[0] == 200 and answer[3] == "close" and closed


def test_a_kept_alive_connection_carries_an_event_then_a_probe(servers):
    body, headers = add_event()
    probe = b"GET /health/liveness HTTP/1.1\r\nHost: bind\r\n\r\n"
    (event_answer, probe_answer), closed = same(servers, post(body, headers), probe, pause=0.2, answers=2)
    assert event_answer[0] == 200 and probe_answer[0] == 200 and not closed


def test_a_connection_the_lane_answered_stays_open_past_gunicorns_default_keep_alive(servers):
    body, headers = add_event()
    # 3 s idle: gunicorn's default keep-alive (2 s) would have closed it; the images keep 120 s
    (first, second), closed = same(servers, post(body, headers), post(body, {**headers, "Ce-Id": str(uuid.uuid4())}),
                                   pause=3, answers=2)
    assert first[0] == second[0] == 200 and not closed


def test_events_back_to_back_on_one_connection_are_all_answered(servers):
    body, headers = add_event()
    # 2 ms apart: within the time a thread keeps a connection it served for the next request
    # (serving/gunicorn_config.py, LINGER_SECONDS), so the lane reads the next one itself
    requests = [post(body, {**headers, "Ce-Id": str(uuid.uuid4())}) for _ in range(5)]
    answers, closed = same(servers, *requests, pause=0.002, answers=5)
    assert [a[0] for a in answers] == [200] * 5 and not closed


def test_with_every_thread_but_one_keeping_a_connection_a_probe_is_still_answered_at_once(unreachable_kubeconfig):
    """A thread keeps a connection the lane served for the next request (LINGER_SECONDS, 1 s):
    with two threads, one connection keeps one; the next connection served goes back to the
    poller instead, and a probe on a third connection finds the last thread free. Were both kept,
    the probe would wait for the first of them to give its connection back."""
    from serving.gunicorn_config import LINGER_SECONDS
    server = ImageServer({"KUBECONFIG": str(unreachable_kubeconfig), "THREADS": "2"})
    try:
        body, headers = add_event()
        kept = []
        for _ in range(2):  # each served, and each then waited on by its thread if one is free for it
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(post(body, {**headers, "Ce-Id": str(uuid.uuid4())}))
            assert read_response(sock.makefile("rb"))[0] == 200
            kept.append(sock)
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as probe:
            probe.sendall(b"GET /health/liveness HTTP/1.1\r\nHost: bind\r\n\r\n")
            status = read_response(probe.makefile("rb"))[0]
        waited = time.monotonic() - started
        assert status == 200
        assert waited < LINGER_SECONDS / 2, f"the probe waited {waited:.2f} s for a thread"
        for sock in kept:
            sock.close()
    finally:
        server.stop()
