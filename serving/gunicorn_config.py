"""gunicorn's settings for both functions, wherever gunicorn serves them: the images' entry point
(what Knative runs, and func deploy; with webhook.path direct-service, mutate's also serves the
API server over TLS: below), the local control plane (localcp/). functions-framework's own CLI starts the
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
- **The webhook's TLS listener** (WEBHOOK_TLS_PORT; webhook.path direct-service): queue-proxy
  speaks plain HTTP to the container on PORT, and the API server calls the revision's pods
  directly, over TLS, through a ClusterIP Service on WEBHOOK_TLS_PORT. Both are listeners of this
  one server (one app, one set of threads and limits), and only connections accepted on the TLS
  port are wrapped in TLS, with the certificate and key in WEBHOOK_TLS_DIR (tls.crt, tls.key: a
  kubernetes.io/tls Secret mounted there). gunicorn reads them for each connection, so a renewed
  Secret needs no restart. One container instead of a second server beside the function: `func
  deploy` can declare it (func.yaml has one container, its envs and volumes), and the pod is
  Ready exactly when the server that holds both listeners answers its readiness.
- **bind's events from the socket** (serving/fastlane.py): the worker hands a plain HTTP/1.1
  request of the shape the event sources send straight to bind's fast handler, and gives any
  other request, bytes and all, to gthread's own parser; its heartbeat (a system call) is
  written once a second instead of at every request. Half of an event's CPU was gunicorn's
  request and response objects (issue 62). A connection the lane served is kept by its thread
  for up to a second for the next request before it goes back to the poller, by all threads
  but one at most.
- **reuse_port**: a new server can listen on the port while the old one drains (a restart in
  place, as the local control plane does it; in a pod each revision has its own address, and
  Linux lets only processes of the same user share a port: in a pod, the function's own). A
  stopping worker accepts what is already queued on its listener and closes it before it
  finishes its requests (DrainingWorker), so that new connections go to the new server instead of
  waiting in a queue nobody accepts from.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import ssl
import threading
import time

from gunicorn.workers import gthread

from serving import draining, fastlane

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


def _webhook_tls_port() -> int | None:
    """WEBHOOK_TLS_PORT, checked, with its certificate loadable: the server refuses to start
    otherwise, naming the fix, instead of failing every TLS handshake later."""
    value = os.environ.get("WEBHOOK_TLS_PORT", "")
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536 or value == os.environ.get("PORT", "8080"):
        raise SystemExit(f"WEBHOOK_TLS_PORT={value}: not a port other than PORT (8443 in the chart)")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(WEBHOOK_TLS_CERT, WEBHOOK_TLS_KEY)
    except (OSError, ssl.SSLError) as error:
        raise SystemExit(
            f"WEBHOOK_TLS_PORT={value}: cannot load {WEBHOOK_TLS_CERT} and {WEBHOOK_TLS_KEY} ({error}): mount the "
            f"webhook's kubernetes.io/tls Secret (the chart's mutate-webhook-tls) at WEBHOOK_TLS_DIR") from None
    return int(value)


WEBHOOK_TLS_DIR = os.environ.get("WEBHOOK_TLS_DIR", "/var/run/gpu-scheduler/tls")
WEBHOOK_TLS_CERT = os.path.join(WEBHOOK_TLS_DIR, "tls.crt")
WEBHOOK_TLS_KEY = os.path.join(WEBHOOK_TLS_DIR, "tls.key")
WEBHOOK_TLS_PORT = _webhook_tls_port()
if WEBHOOK_TLS_PORT is not None:
    bind.append(f"0.0.0.0:{WEBHOOK_TLS_PORT}")


class _WebhookTLSSettings:
    """gunicorn's settings for a connection accepted on the webhook's TLS listener: the server's
    own, with TLS on (gunicorn's is_ssl is one switch for every listener)."""

    is_ssl = True
    certfile = WEBHOOK_TLS_CERT
    keyfile = WEBHOOK_TLS_KEY

    def __init__(self, settings) -> None:
        self._settings = settings

    def __getattr__(self, name: str):
        return getattr(self._settings, name)


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


# A connection the lane served is kept by its thread for the next request for this long (at most
# this many requests in a row) before it goes back to the poller: an event source sends its events
# on a few kept-alive connections, and each trip through the poller and the thread pool costs
# four thread switches, two epoll changes and a pipe write. A second, not 5 ms: the adapter sends
# a pod's events as they happen, tens of milliseconds apart, not back to back; events 10 ms apart
# cost 0.53 ms of CPU each with 5 ms, 0.40 with a second (docs/performance.md). An idle connection
# kept so holds a thread, so all threads but one at most keep one: the last is free for a probe.
LINGER_SECONDS = 1.0
LINGER_REQUESTS = 64


class DrainingWorker(gthread.ThreadWorker):
    """gunicorn's gthread worker, which on its way out takes the connections already queued on its
    listeners and then closes them, before finishing its requests. gthread only stops polling
    them, and keeps them open until its last request is done: with another server on the port
    (reuse_port), a connection the kernel queued there in the meantime was reset at the end."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Threads that may keep a served connection at once: all but one (none with one thread).
        self._lingering = threading.BoundedSemaphore(max(0, self.cfg.threads - 1))

    @property
    def _tls(self) -> bool:  # gunicorn's cfg.is_ssl, looked up once (a property over its settings)
        if not hasattr(self, "_is_ssl"):
            self._is_ssl = bool(self.cfg.is_ssl)
        return self._is_ssl

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
                self.enqueue_req(self.connection(client, address, listener))
            listener.close()

    def accept(self, listener) -> None:
        """gthread's accept, with the connection made by connection() (TLS on the webhook's port)."""
        try:
            client, address = listener.accept()
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        client.setblocking(True)
        self.enqueue_req(self.connection(client, address, listener))

    _notified = 0.0

    def notify(self) -> None:
        """The heartbeat, at most once a second (a file's mtime set: a system call). gthread
        beats at every turn of its loop, a turn per request; the master reads it only with a
        worker timeout, which these servers do not set (timeout = 0), and a beat a second is
        within any timeout gunicorn accepts."""
        now = time.monotonic()
        if now - self._notified >= 1.0:
            self._notified = now
            super().notify()

    def handle(self, conn: gthread.TConn):
        """gthread's, with bind's CloudEvents served by serving/fastlane.py: a plain HTTP/1.1
        connection's request is read by the lane, and given back to gthread's parser when the lane
        does not serve it."""
        if fastlane.handler is None or conn.cfg is not self.cfg or conn.is_http2 or self._tls:
            return super().handle(conn)
        try:
            if not conn.initialized and not conn.data_ready:
                if not conn.wait_for_data(gthread.DEFAULT_WORKER_DATA_TIMEOUT):
                    return gthread._DEFER  # as gthread does: the poller waits, not a thread
            conn.sock.setblocking(True)
            conn.init()
            if conn.is_http2 or conn.parser.unreader.buf.getbuffer().nbytes:
                return super().handle(conn)  # h2c, or a pipelined request already buffered
            unread = conn.parser.unreader.unread
            for _ in range(LINGER_REQUESTS):
                keep_alive = bool(self.alive and self.cfg.keepalive and len(self.keepalived_conns) < self.max_keepalived)
                if not fastlane.serve(conn.sock, keep_alive, unread):
                    return False
                if conn.parser.unreader.buf.getbuffer().nbytes or not self._linger(conn.sock):
                    return True  # to the poller (or, with a pipelined request buffered, back to a thread)
            return True
        except fastlane.NotMine as request:
            conn.parser.unreader.unread(request.data)
            return super().handle(conn)
        except OSError as error:
            if error.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                self.log.exception("Socket error processing request.")
        except Exception as error:  # as gthread's handle: a 500, logged
            self.handle_error(None, conn.sock, conn.client, error)
        return False

    def _linger(self, sock) -> bool:
        """Whether a next request came on `sock` within LINGER_SECONDS, waited for by this thread
        when another thread stays free (else at once False: the poller waits for it instead)."""
        if not self.alive or not self._lingering.acquire(blocking=False):
            return False
        try:
            return fastlane.next_request_within(sock, LINGER_SECONDS)
        finally:
            self._lingering.release()

    def connection(self, client, address, listener) -> gthread.TConn:
        server = listener.getsockname()
        tls = WEBHOOK_TLS_PORT is not None and isinstance(server, tuple) and server[1] == WEBHOOK_TLS_PORT
        return gthread.TConn(_WebhookTLSSettings(self.cfg) if tls else self.cfg, client, address, server)
