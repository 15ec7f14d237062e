"""gunicorn settings for mutate where this repository serves it with gunicorn directly (the local
control plane, for TLS; the bench): the images' own (serving/gunicorn_config.py: keep-alive
past the API server's 90 s idle connections, the drain on SIGTERM, reuse_port for a restart in
place), with mutate's values of WORKERS and THREADS when the environment does not set them
(knative/mutate-service.yaml, functions/mutate/func.yaml set the same).

- WORKERS=1: one process. A second would have its own caches and its own gate for heavy bodies,
  so twice the memory and twice the heavy work at once (not measured: the figures below are for 1).
- THREADS=12: a slow client holds a thread up to its body deadline (2 s), a heavy body one while
  it waits its turn (up to 3 s); with 8, ten such requests kept good reviews waiting (p99 0.8 s),
  with 12 they did not (0.2 s). Memory stays bounded: 12 bodies of at most 3 MiB, one decoded
  at a time (about 40 MiB), and the process's own 35 MiB are under half of the 256 MiB limit.
- No request timeout here: mutate answers 503 itself at its next step once a request has run
  4 s (REQUEST_TIMEOUT_SECONDS, functions/mutate/main.py); functions-framework's threaded timeout
  raises its exception asynchronously, wherever the thread is: in one bench run an answer came
  back cut short, most likely from that exception landing in gunicorn's writing of it.
"""
import os

from serving.gunicorn_config import *  # noqa: F401,F403  (settings and hooks)

workers = int(os.environ.get("WORKERS", "1"))
threads = int(os.environ.get("THREADS", "12"))
