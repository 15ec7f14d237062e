"""bind: places pods from ApiServerSource and PingSource CloudEvents. HTTP/CloudEvents <->
gpu_scheduler.binding; the Kubernetes calls live in placer.py.

Run locally:  functions-framework --source functions/bind/main.py --target bind
Knative retries only on connection errors and 404/413/425/429/502/503/504, so: transient API
failures answer 503, permanent ones 200 with the reason in the body, malformed events 400 (an
oversized body too: 413 would be redelivered five times, and no larger body ever becomes a pod
event).
"""
import json
import logging
import os
import re
import uuid

import functions_framework
import prometheus_client as prom
from cloudevents.exceptions import GenericException as CloudEventError
from cloudevents.http import CloudEvent, from_http
from flask import Request

from authn import SinkAuthenticator, Unavailable
from gpu_scheduler.binding import PING, POD_EVENTS, EventError, check_pod, event_type_label
from gpu_scheduler.schedmap import shown
from kubeapi.projection import PODS
from placer import Placer
from serving import draining, fastpath, jsonlog
from serving.sinkauth import Unauthenticated

MAX_BODY = 3 * 1024 * 1024  # the API server's request limit: no pod, so no pod event, is larger
# The adapters send a whole body at once; one still arriving after this is not theirs.
BODY_SECONDS = float(os.environ.get("BODY_TIMEOUT_SECONDS", "2"))

logging.basicConfig(level=jsonlog.level(), handlers=[jsonlog.handler()], force=True)
log = logging.getLogger("bind")
EVENTS = prom.Counter("gpu_scheduler_bind_events_total", "Events received", ["type", "status"])
placer = Placer.from_environment()  # configuration read once, at start; the client is reused
# gunicorn imports this in its master and forks the worker: the watches and the queue's workers
# start in the worker right after the fork (threads do not survive a fork), so that bind finds
# its own work before any request comes. Without a fork, the first request starts them.
os.register_at_fork(after_in_child=placer.start)
# Knative's sink authentication, where it is on (SINK_AUDIENCE, SINK_SENDERS): see authn.py.
sink_auth = SinkAuthenticator.from_environment(placer.api)


# A 2xx answer is a binary-mode CloudEvent (its body the same JSON): `func invoke` prints an answer
# only when it is an event, and the sources' adapters send without a reply sink, so they drop it.
REPLY_TYPE = "dev.gpu-scheduler.bind.reply"
REPLY_SOURCE = "/gpu-scheduler/bind"


def _reply(status, kind="", **body):
    # The label comes from a fixed set: a sender choosing types cannot grow the metrics.
    EVENTS.labels(event_type_label(kind) if kind else "none", str(status)).inc()
    if status >= 400:
        log.info("answered %s", status, extra={"status": status, "event_type": kind, "reply": body})
        return json.dumps(body), status, {"Content-Type": "application/json"}
    return json.dumps(body), status, {"Content-Type": "application/json", "Ce-Specversion": "1.0",
                                      "Ce-Type": REPLY_TYPE, "Ce-Source": REPLY_SOURCE, "Ce-Id": uuid.uuid4().hex}




@functions_framework.http
def bind(request: Request):
    try:
        return _handle(request)
    except Exception:  # a bug must not become a 500 that Knative drops: log it, ask for redelivery
        log.exception("unexpected error")
        return _reply(503, error="internal error in bind; the event will be redelivered")


def _handle(request: Request):
    if request.path == "/health/liveness":
        return "ok\n", 200
    if request.path == "/health/readiness":
        if draining.draining():  # after a SIGTERM: serving/gunicorn_config.py
            return "draining\n", 503
        readiness = placer.readiness()
        return ("ok\n", 200) if readiness.ready else (f"not ready: {readiness.message}\n", 503)
    if request.path == "/metrics":
        return prom.generate_latest(), 200, {"Content-Type": prom.CONTENT_TYPE_LATEST}
    if request.method != "POST":
        return _reply(405, error=f"{request.method} {request.path}: POST a CloudEvent")
    refused = _sender_refused(request.headers.get("Authorization"))
    if refused:
        return refused
    # 400, not 413: the adapter redelivers a 413 five times, and the answer cannot change.
    if (request.content_length or 0) > MAX_BODY:
        return _reply(400, error=f"body: larger than {MAX_BODY} bytes; no pod event is")
    try:
        raw = fastpath.read_within(request.environ, lambda: request.stream.read(MAX_BODY + 1), BODY_SECONDS)
    except fastpath.SlowBody:
        return _reply(400, error=f"body: not received within {BODY_SECONDS:g} s")
    if len(raw) > MAX_BODY:
        return _reply(400, error=f"body: larger than {MAX_BODY} bytes; no pod event is")
    structured = (request.headers.get("Content-Type") or "").lower().startswith("application/cloudevents")
    if structured and not raw.lstrip()[:1] == b"{":
        return _reply(400, error="malformed CloudEvent: body: a structured-mode event must be a JSON object")
    try:
        event = from_http(dict(request.headers), raw)
    except (AttributeError, TypeError) as error:  # the SDK's own, on shapes it does not expect
        return _reply(400, error=f"malformed CloudEvent: {type(error).__name__}: {str(error)[:200]}")
    except RecursionError:  # structured mode's or the data's JSON nested past Python's limit
        return _reply(400, error="malformed CloudEvent: JSON nested too deeply")
    except (CloudEventError, ValueError) as error:
        if "RecursionError" in str(error):  # the SDK wraps the data's RecursionError in its own
            return _reply(400, error="malformed CloudEvent: data: JSON nested too deeply")
        return _reply(400, error=f"malformed CloudEvent: {str(error)[:500]}")
    if event["type"] in POD_EVENTS:
        # Projected as the fast path decodes it, so both paths judge the same pod: a field bind
        # does not read is not read, however it nests.
        event.data = PODS.project(event.data)
    return _on_event(event)


def _sender_refused(authorization: str | None):
    """The reply refusing the sender, or None when it may send (or sink authentication is off).
    Both paths ask it before reading the body."""
    if sink_auth is None:
        return None
    try:
        sink_auth.check(authorization)
    except Unauthenticated as refusal:  # 401: Knative does not redeliver it
        return _reply(401, error=f"unauthenticated: {refusal}")
    except Unavailable as error:
        return _reply(503, error=f"cannot authenticate the sender now: {error}")
    return None


def _on_event(event: CloudEvent):
    kind = event["type"]
    if kind == PING:
        outcome = placer.resync()
    elif kind in POD_EVENTS:
        try:
            pod = check_pod(event.data)
        except EventError as error:
            return _reply(400, kind, error=f"malformed {kind} event {shown(event['id'])}: {error}")
        outcome = placer.place_event(pod)
    else:
        log.debug("ignored event", extra={"event_id": event["id"], "event_type": kind})
        return _reply(200, kind, result="ignored", why=f"event type {shown(kind)} is not handled")
    return _reply(503 if outcome.get("retry") else 200, kind, **outcome)


# -- the fast path: what the event sources send, without Flask and from_http -----------------
# ApiServerSource and PingSource send binary-mode CloudEvents 1.0 with a JSON body. Those are
# answered here (serving/fastpath.py); anything else, or missing a required attribute, goes
# through bind() above, which answers as it always has.
REQUIRED = ("HTTP_CE_ID", "HTTP_CE_SOURCE", "HTTP_CE_TYPE")
JSON_TYPE = re.compile(r"application/json\s*(;.*)?$", re.IGNORECASE)
NOT_EVENTS = ("/health/liveness", "/health/readiness", "/metrics", *fastpath.FRAMEWORK_PATHS)


def _binary_event(environ: dict, raw: bytes) -> CloudEvent | None:
    """What from_http makes of a binary-mode CloudEvent 1.0 with a JSON object as data (None
    for any other request: from_http decides those)."""
    if environ.get("HTTP_CE_SPECVERSION") != "1.0" or not all(environ.get(k) for k in REQUIRED):
        return None
    if not JSON_TYPE.match(environ.get("CONTENT_TYPE", "")):
        return None
    attributes = {"datacontenttype": environ["CONTENT_TYPE"]}
    for key, value in environ.items():
        if key.startswith("HTTP_CE_"):
            name = key[8:].lower()
            if not name.isalnum():  # attribute names are [a-z0-9]: leave oddities to from_http
                return None
            attributes[name] = value
    try:
        # A pod event's pod decoded into only what bind reads (kubeapi/projection.py): its managed
        # fields, statuses and volumes, skipped in C, were a third of bind's CPU per event.
        data = PODS.object(raw) if attributes["type"] in POD_EVENTS else json.loads(raw)
    except (ValueError, RecursionError):  # from_http's path says what is wrong with it
        return None
    return CloudEvent(attributes, data)


def _fast(environ: dict):
    if (environ["REQUEST_METHOD"] != "POST" or "HTTP_CE_SPECVERSION" not in environ
            or environ.get("PATH_INFO") in NOT_EVENTS):
        return None
    try:
        refused = _sender_refused(environ.get("HTTP_AUTHORIZATION"))
        if refused:
            return refused
    except Exception:  # as in bind()
        log.exception("unexpected error")
        return _reply(503, error="internal error in bind; the event will be redelivered")
    try:
        raw = fastpath.read_within(environ, lambda: fastpath.read_body(environ, MAX_BODY), BODY_SECONDS)
    except fastpath.SlowBody:
        return _reply(400, error=f"body: not received within {BODY_SECONDS:g} s")
    if raw is None:
        return None
    try:
        event = _binary_event(environ, raw)
        if event is None:
            fastpath.replay(environ, raw)
            return None
        return _on_event(event)
    except Exception:  # as in bind(): a bug must not become a 500 that Knative drops
        log.exception("unexpected error")
        return _reply(503, error="internal error in bind; the event will be redelivered")


fastpath.install(_fast, lane=True)
