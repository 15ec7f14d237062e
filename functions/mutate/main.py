"""mutate: the MutatingWebhook. HTTP <-> gpu_scheduler.admission, nothing else.

Run locally:  functions-framework --source functions/mutate/main.py --target mutate
"""
import json
import logging
import os
import socket
import time

import functions_framework
import prometheus_client as prom
from flask import Request
from functions_framework.exceptions import RequestTimeoutException

from gpu_scheduler import jsonlog
from gpu_scheduler.admission import ReviewError, decide, parse_review, response_for
from gpu_scheduler.devices import CUDA, MODES

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit: no AdmissionReview is larger
# The API server waits timeoutSeconds (5 s, knative/webhook.yaml) for the answer. A body still
# arriving after 2 s comes from something that is not the API server (which sends it at once),
# and must not hold one of the threads until the caller has given up.
BODY_SECONDS = float(os.environ.get("BODY_TIMEOUT_SECONDS", "2"))
READ_CHUNK = 64 * 1024
HEALTH = ("/health/liveness", "/health/readiness")

logging.basicConfig(level=jsonlog.level(), handlers=[jsonlog.handler()], force=True)
log = logging.getLogger("mutate")
# Read once at start; a wrong value stops the function here rather than on the first pod.
DEVICE_ENV_MODE = os.environ.get("DEVICE_ENV_MODE", CUDA)
if DEVICE_ENV_MODE not in MODES:
    raise SystemExit(f"DEVICE_ENV_MODE={DEVICE_ENV_MODE!r}: expected one of {', '.join(MODES)}")
DECISIONS = prom.Counter("gpu_scheduler_admission_decisions_total", "Admission decisions", ["allowed", "reason"])
ERRORS = prom.Counter("gpu_scheduler_admission_errors_total", "Rejected requests", ["status"])
LATENCY = prom.Histogram("gpu_scheduler_admission_seconds", "Time to decide one AdmissionReview",
                         buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))


def _error(status, message):
    ERRORS.labels(str(status)).inc()
    log.info("rejected request: %s", message, extra={"status": status})
    return json.dumps({"error": message}), status, {"Content-Type": "application/json"}


class SlowBody(Exception):
    pass


def read_body(request: Request, limit: int, seconds: float) -> bytes:
    """At most `limit` + 1 bytes of the body, all within `seconds` (SlowBody otherwise). Under
    gunicorn the socket's timeout is set to what is left before each read, so a client that
    stalls or trickles cannot keep this thread past the deadline."""
    sock = request.environ.get("gunicorn.socket")
    deadline = time.monotonic() + seconds
    chunks, size = [], 0
    try:
        while size <= limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SlowBody()
            if sock is not None:
                sock.settimeout(left)
            chunk = request.stream.read(min(READ_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except (socket.timeout, TimeoutError):
        raise SlowBody() from None
    finally:
        if sock is not None:
            sock.settimeout(None)
    return b"".join(chunks)


@functions_framework.http
def mutate(request: Request):
    try:
        return _handle(request)
    except RequestTimeoutException:  # the server's per-request limit (REQUEST_TIMEOUT in README)
        log.warning("request cut off: it ran past the server's request timeout")
        return _error(503, "mutate cut this request off: it ran past the request timeout")
    except Exception:  # never a stack trace to the API server: log it, answer a JSON error
        log.exception("unexpected error")
        return _error(503, "internal error in mutate")


def _handle(request: Request):
    if request.path in HEALTH:
        return "ok\n", 200  # stateless, configured at import: ready as soon as it serves
    if request.path == "/metrics":
        return prom.generate_latest(), 200, {"Content-Type": prom.CONTENT_TYPE_LATEST}
    if request.method != "POST":
        return _error(405, f"{request.method} {request.path}: POST an AdmissionReview")
    if (request.content_length or 0) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    started = time.perf_counter()
    try:
        raw = read_body(request, MAX_BODY, BODY_SECONDS)
    except SlowBody:
        return _error(408, f"body: not received within {BODY_SECONDS:g} s")
    if len(raw) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    try:
        review = parse_review(json.loads(raw))
    except RecursionError:
        return _error(400, "malformed JSON: body nested too deeply")
    except ValueError as error:  # JSONDecodeError and ReviewError are ValueErrors
        kind = "AdmissionReview" if isinstance(error, ReviewError) else "JSON"
        return _error(400, f"malformed {kind}: {str(error)[:500]}")
    decision = decide(review, DEVICE_ENV_MODE)
    elapsed = time.perf_counter() - started
    DECISIONS.labels(str(decision.allowed).lower(), decision.reason).inc()
    LATENCY.observe(elapsed)
    log.info("admission decision", extra={
        "uid": review.uid, "pod": review.pod_name, "allowed": decision.allowed,
        "decision": decision.reason, "patch_ops": len(decision.patch), "warnings": list(decision.warnings),
        "detail": decision.message, "latency_ms": round(elapsed * 1000, 3)})
    return json.dumps(response_for(review, decision)), 200, {"Content-Type": "application/json"}
