"""mutate: the MutatingWebhook. HTTP <-> gpu_scheduler.admission, nothing else.

Run locally:  functions-framework --source functions/mutate/main.py --target mutate
"""
import json
import logging
import os
import threading
import time

import functions_framework
import prometheus_client as prom
from flask import Request

from gpu_scheduler.admission import ReviewError, decide, parse_review, response_for
from gpu_scheduler.devices import CUDA, MODES
from kubeapi import projection
from jobsets import JobSets
from nodeproduct import NodeProducts
from serving import draining, fastpath, jsonlog

MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit: no AdmissionReview is larger
# The API server waits timeoutSeconds (5 s, knative/webhook.yaml) for the answer. A body still
# arriving after 2 s comes from something that is not the API server (which sends it at once),
# and must not hold one of the threads until the caller has given up.
BODY_SECONDS = float(os.environ.get("BODY_TIMEOUT_SECONDS", "2"))
# A request still unanswered after 4 s is answered 503 at its next step (after its body, its turn
# for a heavy body, its JSON decoding): the API server stops waiting at 5 s. Each step is bounded
# (body 3 MiB, map 256 KiB), so none runs long past it. Cooperative, not functions-framework's
# threaded timeout, which raises an exception asynchronously wherever the thread is (in one bench
# run an answer came back cut short, most likely from it landing in gunicorn's writing).
REQUEST_SECONDS = float(os.environ.get("REQUEST_TIMEOUT_SECONDS", "4"))
# Bodies past HEAVY_BODY (a pod with a map of a few thousand entries, or something hostile) are
# decided HEAVY_AT_ONCE at a time: under the GIL their CPU time would otherwise be taken from every
# small review, and their memory (about 10 times the body while decoded) would add up per thread.
# One waits at most HEAVY_WAIT_SECONDS, inside the 4 s request timeout, then gets 503 (busy).
# Measured (docs/hostile-input.md, "Server settings"): with 1, good reviews' p99 under attack fell
# from 0.8 s to 0.2 s and peak memory from 113 to 87 MiB.
HEAVY_BODY = 128 * 1024
HEAVY_AT_ONCE = int(os.environ.get("HEAVY_AT_ONCE", "1"))
HEAVY_WAIT_SECONDS = 3.0
_heavy = threading.BoundedSemaphore(HEAVY_AT_ONCE)
HEALTH = ("/health/liveness", "/health/readiness")

logging.basicConfig(level=jsonlog.level(), handlers=[jsonlog.handler()], force=True)
log = logging.getLogger("mutate")
# Read once at start; a wrong value stops the function here rather than on the first pod.
DEVICE_ENV_MODE = os.environ.get("DEVICE_ENV_MODE", CUDA)
if DEVICE_ENV_MODE not in MODES:
    raise SystemExit(f"DEVICE_ENV_MODE={DEVICE_ENV_MODE!r}: expected one of {', '.join(MODES)}")
# Pinned GPUs count against the namespace's ResourceQuota (gpu_scheduler/quota.py); "false" turns
# it off (the pods then request nothing for their GPUs, and no quota bounds them).
QUOTA = os.environ.get("GPU_SCHEDULER_QUOTA", "true").lower()
if QUOTA not in ("true", "false"):
    raise SystemExit(f"GPU_SCHEDULER_QUOTA={QUOTA!r}: expected true or false")
QUOTA_ON = QUOTA == "true"
node_products = NodeProducts.from_environment() if QUOTA_ON else NodeProducts(None)
# A JobSet's pods get their Job's completions and their gang's size from the JobSet (workloads.py).
jobsets = JobSets.from_environment()
DECISIONS = prom.Counter("gpu_scheduler_admission_decisions_total", "Admission decisions", ["allowed", "reason"])
ERRORS = prom.Counter("gpu_scheduler_admission_errors_total", "Rejected requests", ["status"])
# _duration_seconds, as the API server's own apiserver_admission_webhook_admission_duration_seconds.
LATENCY = prom.Histogram("gpu_scheduler_admission_duration_seconds", "Time to decide one AdmissionReview",
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
    if request.path == "/health/readiness" and draining.draining():
        # After a SIGTERM (serving/gunicorn_config.py): still answering, no longer ready.
        return "draining: stopping once endpoints have dropped this server\n", 503
    if request.path in HEALTH:
        return "ok\n", 200  # stateless, configured at import: ready as soon as it serves
    if request.path == "/metrics":
        return prom.generate_latest(), 200, {"Content-Type": prom.CONTENT_TYPE_LATEST}
    if request.method != "POST":
        return _error(405, f"{request.method} {request.path}: POST an AdmissionReview")
    if (request.content_length or 0) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    started = time.perf_counter()
    deadline = time.monotonic() + REQUEST_SECONDS
    try:
        raw = fastpath.read_within(request.environ, lambda: request.stream.read(MAX_BODY + 1), BODY_SECONDS)
    except fastpath.SlowBody:
        return _error(408, f"body: not received within {BODY_SECONDS:g} s")
    if len(raw) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    return _review(raw, started, deadline)

def _review(raw: bytes, started: float, deadline: float):
    """One AdmissionReview, from either path: large bodies a few at a time, within the deadline."""
    if len(raw) <= HEAVY_BODY:
        return _decide(raw, started, deadline)
    if not _heavy.acquire(timeout=max(0.0, min(HEAVY_WAIT_SECONDS, deadline - time.monotonic()))):
        return _error(503, f"busy: {HEAVY_AT_ONCE} other request(s) over {HEAVY_BODY} bytes being decided")
    try:
        return _decide(raw, started, deadline)
    finally:
        _heavy.release()

def _past(deadline: float):
    if time.monotonic() > deadline:
        return _error(503, f"the request took longer than {REQUEST_SECONDS:g} s; cut off")
    return None

def _decide(raw: bytes, started: float, deadline: float):
    if late := _past(deadline):
        return late
    try:
        review = parse_review(projection.admission_review(raw))
    except RecursionError:
        return _error(400, "malformed JSON: body nested too deeply")
    except ValueError as error:  # JSONDecodeError and ReviewError are ValueErrors
        kind = "AdmissionReview" if isinstance(error, ReviewError) else "JSON"
        return _error(400, f"malformed {kind}: {str(error)[:500]}")
    if late := _past(deadline):
        return late
    decision = decide(review, DEVICE_ENV_MODE, QUOTA_ON, node_products, jobsets)
    elapsed = time.perf_counter() - started
    DECISIONS.labels(str(decision.allowed).lower(), decision.reason).inc()
    LATENCY.observe(elapsed)
    log.info("admission decision", extra={
        "uid": review.uid, "pod": review.pod_name, "allowed": decision.allowed,
        "decision": decision.reason, "patch_ops": len(decision.patch), "warnings": list(decision.warnings),
        "detail": decision.message, "latency_ms": round(elapsed * 1000, 3)})
    return json.dumps(response_for(review, decision)), 200, {"Content-Type": "application/json"}

# The fast path (serving/fastpath.py): an AdmissionReview POST with its length declared, as
# the API server sends it, is answered by _review without Flask; anything else goes through mutate().
def _fast(environ: dict):
    if environ["REQUEST_METHOD"] != "POST" or environ.get("PATH_INFO") in (*HEALTH, "/metrics", *fastpath.FRAMEWORK_PATHS):
        return None
    started = time.perf_counter()
    deadline = time.monotonic() + REQUEST_SECONDS
    try:
        raw = fastpath.read_within(environ, lambda: fastpath.read_body(environ, MAX_BODY), BODY_SECONDS)
    except fastpath.SlowBody:
        return _error(408, f"body: not received within {BODY_SECONDS:g} s")
    if raw is None:
        return None
    try:
        return _review(raw, started, deadline)
    except Exception:  # as in mutate(): never a stack trace to the API server
        log.exception("unexpected error")
        return _error(503, "internal error in mutate")

fastpath.install(_fast)
