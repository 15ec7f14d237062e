"""mutate: the MutatingWebhook. HTTP <-> gpu_scheduler.admission, nothing else.

Run locally:  functions-framework --source functions/mutate/main.py --target mutate
"""
import json
import logging
import time

import functions_framework
from flask import Request

from gpu_scheduler.admission import ReviewError, admission_response

# The API server's own request limit: no AdmissionReview is larger.
MAX_BODY = 3 * 1024 * 1024
HEALTH = ("/health/liveness", "/health/readiness")

log = logging.getLogger("mutate")


def _error(status, message):
    return json.dumps({"error": message}), status, {"Content-Type": "application/json"}


@functions_framework.http
def mutate(request: Request):
    if request.path in HEALTH:
        return "ok\n", 200  # stateless and configured at import: ready once serving
    if request.method != "POST":
        return _error(405, f"{request.method} {request.path}: POST an AdmissionReview")
    if (request.content_length or 0) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    started = time.perf_counter()
    raw = request.stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        return _error(413, f"body is larger than {MAX_BODY} bytes")
    try:
        review, decision = admission_response(json.loads(raw))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and ReviewError are ValueErrors
        kind = "AdmissionReview" if isinstance(error, ReviewError) else "JSON"
        log.info("rejected malformed request: %s", error)
        return _error(400, f"malformed {kind}: {error}")
    log.info("admission %s allowed=%s reason=%s patch_ops=%d latency_ms=%.2f %s",
             review["response"]["uid"], decision.allowed, decision.reason, len(decision.patch),
             (time.perf_counter() - started) * 1000, decision.message)
    return json.dumps(review), 200, {"Content-Type": "application/json"}
