"""mutate: the MutatingWebhook. HTTP <-> gpu_scheduler.admission, nothing else.

Run locally:  functions-framework --source functions/mutate/main.py --target mutate
"""
import json
import logging
import os
import time

import functions_framework
import prometheus_client as prom
from flask import Request

from gpu_scheduler import fastpath, jsonlog
from gpu_scheduler.admission import ReviewError, decide, parse_review, response_for
from gpu_scheduler.devices import CUDA, MODES

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit: no AdmissionReview is larger
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


@functions_framework.http
def mutate(request: Request):
    try:
        return _handle(request)
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
    raw = request.stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    return _review(raw, started)


def _review(raw: bytes, started: float):
    try:
        review = parse_review(json.loads(raw))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and ReviewError are ValueErrors
        kind = "AdmissionReview" if isinstance(error, ReviewError) else "JSON"
        return _error(400, f"malformed {kind}: {error}")
    decision = decide(review, DEVICE_ENV_MODE)
    elapsed = time.perf_counter() - started
    DECISIONS.labels(str(decision.allowed).lower(), decision.reason).inc()
    LATENCY.observe(elapsed)
    log.info("admission decision", extra={
        "uid": review.uid, "pod": review.pod_name, "allowed": decision.allowed,
        "decision": decision.reason, "patch_ops": len(decision.patch), "warnings": list(decision.warnings),
        "detail": decision.message, "latency_ms": round(elapsed * 1000, 3)})
    return json.dumps(response_for(review, decision)), 200, {"Content-Type": "application/json"}


# The fast path (gpu_scheduler/fastpath.py): an AdmissionReview POST with its length declared, as
# the API server sends it, is answered by _review without Flask; anything else goes through mutate().
def _fast(environ: dict):
    if environ["REQUEST_METHOD"] != "POST" or environ.get("PATH_INFO") in (*HEALTH, "/metrics", *fastpath.FRAMEWORK_PATHS):
        return None
    started = time.perf_counter()
    raw = fastpath.read_body(environ, MAX_BODY)
    if raw is None:
        return None
    try:
        return _review(raw, started)
    except Exception:  # as in mutate(): never a stack trace to the API server
        log.exception("unexpected error")
        return _error(503, "internal error in mutate")


fastpath.install(_fast)
