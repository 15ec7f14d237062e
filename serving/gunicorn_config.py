"""gunicorn's settings for both functions, wherever gunicorn serves them: the images' entry point
(what Knative runs, and func deploy), mutate's webhook-tls container (webhook.path
direct-service), the local control plane (localcp/). functions-framework's own CLI starts the
same gunicorn but takes none of these from the environment or a file, so the images run

    gunicorn --config python:serving.gunicorn_config 'functions_framework:create_app(target="mutate", source="functions/mutate/main.py")'

which is functions-framework's app and functions-framework's settings (the app loaded before the
fork, no request line limit, no worker timeout, log level error, WORKERS and THREADS from the
environment, PORT), plus what long-lived clients need:

- **Keep-alive 120 s** (gunicorn's default is 2 s). Every client that keeps a connection to
  these servers open between requests keeps it idle for up to 90 s: kube-apiserver's webhook
  client (k8s.io/apimachinery's transport defaults: Go's IdleConnTimeout, 90 s), Knative's
  queue-proxy in front of the container (a clone of Go's default transport: 90 s), and the
  ApiServerSource and PingSource adapters (the same). A server that closes an idle connection
  first races the client's next request on it; Go does not resend a POST that meets a
  connection closed under it, and the API server then fails the webhook call ("write: broken
  pipe", "EOF"). With the server waiting longer than any client, the client always closes
  first. An idle connection holds no thread, only one of the worker's 1000 connection slots.
- **Draining on SIGTERM** (a revision rollout, a scale-down, a node drain): the master marks the
  server draining (serving/draining.py), so /health/readiness answers 503 while every
  other request is still served, each answer with "Connection: close" so that kept-alive
  clients reconnect (to a pod that is ready). After DRAIN_SECONDS (default 15: a readiness probe
  every 5 s fails within 5 s, and leaves 10 s for the endpoints and kube-proxy to drop the pod)
  gunicorn stops as it always does: no new connections, the requests in flight finished within
  graceful_timeout (10 s: mutate answers within 4 s, bind's API calls time out at 10 s).
  15 + 10 s stay within Kubernetes' default 30 s grace period. A second SIGTERM changes nothing;
  SIGINT or SIGQUIT stop at once, as in gunicorn.
- **reuse_port**: a new server can listen on the port while the old one drains (a restart in
  place, as the local control plane does it; in a pod each revision has its own address, and
  Linux lets only processes of the same user share a port: in a pod, the function's own). A
  stopping worker accepts what is already queued on its listener and closes it before it
  finishes its requests (DrainingWorker), so that new connections go to the new server instead of
  waiting in a queue nobody accepts from.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

from gunicorn.workers import gthread

from serving import draining

KEEPALIVE_SECONDS = 120
DRAIN_SECONDS = float(os.environ.get("DRAIN_SECONDS", "15"))

# functions-framework's own settings (functions_framework/_http/gunicorn.py), from the same variables.
bind = [f"0.0.0.0:{os.environ.get('PORT', '8080')}"]  # a --bind on the command line replaces it
workers = int(os.environ.get("WORKERS", "1"))
threads = int(os.environ.get("THREADS", str((os.cpu_count() or 1) * 4)))
timeout = 0
limit_request_line = 0
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "error")
preload_app = True  # the app is made in the master and forked, as functions-framework does
# What long-lived clients need (the module's docstring).
keepalive = KEEPALIVE_SECONDS
graceful_timeout = 10
reuse_port = True
worker_class = "serving.gunicorn_config.DrainingWorker"
control_socket_disable = True  # gunicorn's control socket: a file in $HOME, on a read-only root

_log = logging.getLogger("gpu_scheduler.serving")


def when_ready(server) -> None:
    """Drain before stopping: the first SIGTERM starts the drain; the master stops (gunicorn's own
    SIGTERM handling) once DRAIN_SECONDS have passed."""
    stop = server.handle_term  # raises StopIteration: gunicorn's graceful stop
    drained = threading.Event()

    def handle_term() -> None:
        if drained.is_set():
            stop()
        if draining.draining():
            return  # already draining: a second SIGTERM does not cut the drain short
        draining.start()
        _log.info("SIGTERM: draining for %g s: readiness fails, requests are still served, "
                  "each answered with Connection: close; then gunicorn stops", DRAIN_SECONDS)

        def done() -> None:
            drained.set()
            server.SIG_QUEUE.put_nowait(signal.SIGTERM)  # the master's loop: handle_term again

        timer = threading.Timer(DRAIN_SECONDS, done)
        timer.daemon = True
        timer.start()

    server.handle_term = handle_term  # the master dispatches signals to handle_<name>


def pre_request(worker, req) -> None:
    """While draining, every answer closes its connection: the client's next request opens a new
    one, through endpoints that no longer list this server."""
    if draining.draining():
        req.force_close()


class DrainingWorker(gthread.ThreadWorker):
    """gunicorn's gthread worker, which on its way out takes the connections already queued on its
    listeners and then closes them, before finishing its requests. gthread only stops polling
    them, and keeps them open until its last request is done: with another server on the port
    (reuse_port), a connection the kernel queued there in the meantime was reset at the end."""

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if enabled or self.alive:
            return
        for listener in self.sockets:
            listener.setblocking(False)
            while True:
                try:
                    client, address = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionAbortedError:
                    continue
                except OSError:
                    break
                self.nr_conns += 1
                client.setblocking(True)
                self.enqueue_req(gthread.TConn(self.cfg, client, address, listener.getsockname()))
            listener.close()
