"""gunicorn settings for mutate where this repository serves it with gunicorn directly (the local
control plane, for TLS; the bench): the same values the images get from their environment
(knative/mutate-service.yaml, functions/mutate/func.yaml), read from the same variables.

- WORKERS=1: one process. The decision is CPU-bound Python; a second worker would double the
  memory (each keeps its own caches) for no gain on the 2 cores measured (README, "Hostile input").
- THREADS=8: a slow client (body deadline 2 s) holds one thread; eight leave room for the API
  server's concurrent reviews while a few hostile requests run.
- CLOUD_RUN_TIMEOUT_SECONDS=4 with functions-framework's threaded timeout worker: a request still
  running after 4 s is cut off (RequestTimeoutException in its thread, answered 503), before the
  API server's 5 s (knative/webhook.yaml timeoutSeconds) makes it useless anyway.
"""
import os

import functions_framework._http.gunicorn as _ff

workers = int(os.environ.get("WORKERS", "1"))
threads = int(os.environ.get("THREADS", "8"))
# Read by the worker class in each request's thread; set here, in the master, before it forks.
_ff.TIMEOUT_SECONDS = int(os.environ.get("CLOUD_RUN_TIMEOUT_SECONDS", "4"))
worker_class = "functions_framework._http.gunicorn.GThreadWorkerWithTimeoutSupport"
loglevel = "error"
