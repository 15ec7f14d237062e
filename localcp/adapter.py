"""Knative Eventing's real ApiServerSource receive adapter, run as a process of this machine for a
stack without Knative installed (LocalStack's default), with a tap between it and bind.

- ReceiveAdapter: the adapter binary localcp/build-knative.sh builds
  (knative.dev/eventing/cmd/apiserver_receive_adapter), configured as Eventing's controller
  configures the adapter Deployment it makes for knative/sources.yaml's ApiServerSource: the same
  environment (K_SINK, K_SOURCE_CONFIG, NAMESPACE, NAME, the logging and observability
  configuration; tests/test_knative_cluster.py holds source_config to the real controller's), and
  the source's ServiceAccount (a bound token of pod-events in a kubeconfig, where a pod would
  have its projected token). Started when its watch delivers: a probe pod's add event reaches
  the tap (the adapter sends nothing for what existed before its watch began).
- EventTap: the sink the adapter sends to, in front of bind, standing in for the network between
  them: each event is forwarded to bind and bind's answer returned to the adapter (whose own
  retry policy then applies), and recorded. Its switches are the faults the tests need: paused
  (events are lost, as when no adapter runs), hold()/release() (events are taken and queued, as
  by a slow or partitioned path, then delivered, shuffled if shuffle), duplicate, drop_rate.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import random
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from . import knative
from .cloudevents import Sender
from .cluster import REPO, ControlPlane, ProcessFailed

log = logging.getLogger("adapter")
SOURCES_MANIFEST = REPO / "knative" / "sources.yaml"
TYPES = {"dev.knative.apiserver.resource.add": "add", "dev.knative.apiserver.resource.update": "update",
         "dev.knative.apiserver.resource.delete": "delete"}
PROBE_PREFIX = "adapter-probe-"  # the pods that show the adapter's watch delivers; the tap keeps their events
# The adapter Deployment's logging and observability settings, as Eventing's controller writes them
# from config-logging and config-observability's defaults (read off the Deployment it made on the
# local stack's Knative).
LOGGING_CONFIG = json.dumps({"zap-logger-config": json.dumps({
    "level": "info", "development": False, "outputPaths": ["stdout"], "errorOutputPaths": ["stderr"],
    "encoding": "json", "encoderConfig": {"timeKey": "ts", "levelKey": "level", "nameKey": "logger",
                                          "callerKey": "caller", "messageKey": "msg", "stacktraceKey": "stacktrace",
                                          "lineEnding": "", "levelEncoder": "", "timeEncoder": "iso8601",
                                          "durationEncoder": "", "callerEncoder": ""}})})
OBSERVABILITY_CONFIG = json.dumps({"tracing": {"protocol": "none"}, "metrics": {"protocol": "none"},
                                   "runtime": {"profiling": "disabled", "exportInterval": 15000000000},
                                   "enableSinkEventErrorReporting": False})


class SourceConfigError(ValueError):
    """An ApiServerSource that cannot be turned into the adapter's configuration."""


def label_selector_string(selector: dict[str, Any] | None) -> str:
    """metav1.LabelSelectorAsSelector(selector).String(): requirements sorted by key."""
    if not selector:
        return ""
    requirements: list[tuple[str, str]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        requirements.append((key, f"{key}={value}"))
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = ",".join(sorted(expression.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                "Exists": key, "DoesNotExist": f"!{key}"}.get(operator)
        if text is None:
            raise SourceConfigError(f"selector: unknown operator {operator!r} for {key!r}")
        requirements.append((key, text))
    return ",".join(text for _, text in sorted(requirements))


def _resource(kind: str) -> str:
    """meta.UnsafeGuessKindToResource, for the kinds a source may name."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


def source_config(source: dict[str, Any], namespaces: list[str]) -> dict[str, Any]:
    """K_SOURCE_CONFIG for an ApiServerSource, as Eventing's reconciler makes it. `namespaces`:
    the names the namespaceSelector matches now (the reconciler lists them)."""
    spec = source.get("spec") or {}
    selector = spec.get("namespaceSelector")
    config: dict[str, Any] = {
        "namespaces": sorted(namespaces) if selector is not None else [source["metadata"]["namespace"]],
        # An empty selector means every namespace, watched by one cluster-wide watch.
        "allNamespaces": selector is not None and not selector.get("matchLabels") and not selector.get("matchExpressions"),
        "resources": [],
        "mode": spec.get("mode", ""),
    }
    for resource in spec.get("resources") or []:
        group, _, version = resource["apiVersion"].rpartition("/")
        watch: dict[str, Any] = {"gvr": {"Group": group, "Version": version, "Resource": _resource(resource["kind"])}}
        if resource.get("selector") is not None:
            watch["selector"] = label_selector_string(resource["selector"])
        config["resources"].append(watch)
    if spec.get("owner"):
        config["owner"] = spec["owner"]
    return config


def apiserversource_manifest(path: Path = SOURCES_MANIFEST) -> dict[str, Any]:
    """The ApiServerSource document of knative/sources.yaml."""
    for document in yaml.safe_load_all(path.read_text()):
        if document and document.get("kind") == "ApiServerSource":
            return document
    raise SourceConfigError(f"{path}: no ApiServerSource")


def adapter_binary() -> Path:
    eventing, _ = knative.projects()
    return eventing.directory / "bin" / "apiserver_receive_adapter"


# -- the tap -------------------------------------------------------------------------------------
class EventTap:
    """The adapter's sink, forwarding to bind (see the module's docstring)."""

    def __init__(self, upstream: str, duplicate: int = 1, drop_rate: float = 0.0, shuffle: bool = False, seed: int = 0):
        self.sender = Sender(upstream, delays=())  # the adapter retries, not the tap
        self.duplicate = duplicate
        self.drop_rate = drop_rate
        self.shuffle = shuffle
        self.random = random.Random(seed)
        self.paused = False
        self.received: list[dict] = []  # every request as it came: {"headers", "body"} (captures)
        self.sent: list[tuple[str, str]] = []  # (add|update|delete, pod name) handed to bind
        self.dropped: list[str] = []  # pods whose events a switch dropped
        self.probes: list[tuple[str, str]] = []  # (type, name) of the probe pods' events
        self._held: list[tuple[dict[str, str], bytes]] = []
        self._holding = False
        self._draining = False  # release() delivering what was held
        self._busy = 0
        self._lock = threading.Lock()
        self._released: queue.Queue = queue.Queue()
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = tap._take(dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._threads = [threading.Thread(target=self.server.serve_forever, name="tap", daemon=True),
                         threading.Thread(target=self._deliver_released, name="tap-release", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _take(self, headers: dict[str, str], body: bytes) -> int:
        name = headers.get("Ce-Name", "")
        with self._lock:
            self.received.append({"headers": headers, "body": body.decode(errors="replace")})
        if name.startswith(PROBE_PREFIX):
            self.probes.append((TYPES.get(headers.get("Ce-Type", ""), "other"), name))
            return 202
        copies = []
        for _ in range(self.duplicate):
            if self.paused or self.drop_rate and self.random.random() < self.drop_rate:
                self.dropped.append(name)
            else:
                copies.append((headers, body))
        with self._lock:
            if self._holding or self._draining:  # behind what is held: delivered in order
                self._held += copies
                return 202
            self._busy += 1
        try:
            status = 200
            for copy in copies:
                status = self._forward(*copy)
            return status
        finally:
            with self._lock:
                self._busy -= 1

    def retarget(self, upstream: str) -> None:
        """Forward to another bind from now on (a bench restarting the bind it measures)."""
        self.sender = Sender(upstream, delays=())

    def _forward(self, headers: dict[str, str], body: bytes) -> int:
        forwarded = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")}
        status = self.sender.send(forwarded, body) or 502  # a connection error: the adapter retries as for a 502
        self.sent.append((TYPES.get(headers.get("Ce-Type", ""), "other"), headers.get("Ce-Name", "")))
        return status

    def hold(self) -> None:
        """Take events and queue them, unsent (a slow or partitioned path)."""
        with self._lock:
            self._holding = True

    def release(self) -> None:
        """Deliver what was held (shuffled if shuffle), then pass events through again; what
        arrives meanwhile goes behind it, so the order of delivery is the order of arrival."""
        with self._lock:
            if self.shuffle:
                self.random.shuffle(self._held)
            self._holding = False
            self._draining = True
        self._released.put(True)

    def _deliver_released(self) -> None:
        while self._released.get() is not None:
            while True:
                with self._lock:
                    if not self._held:
                        self._draining = False
                        break
                    copy = self._held.pop(0)
                    self._busy += 1
                try:
                    self._forward(*copy)
                finally:
                    with self._lock:
                        self._busy -= 1

    def queued(self) -> int:
        """The events held, not yet delivered."""
        with self._lock:
            return len(self._held)

    def idle(self) -> bool:
        with self._lock:
            return not self._held and not self._busy and not self._draining

    def stop(self) -> None:
        if self._threads[0].is_alive():
            self._released.put(None)
            self.server.shutdown()
            self.server.server_close()


# -- the adapter ---------------------------------------------------------------------------------
class ReceiveAdapter:
    """The real adapter for knative/sources.yaml's ApiServerSource, sending to `tap`."""

    def __init__(self, cp: ControlPlane, api, tap: EventTap, kubeconfig: Path, name: str = "apiserversource",
                 manifest: dict[str, Any] | None = None):
        self.cp, self.api, self.tap, self.kubeconfig, self.name = cp, api, tap, kubeconfig, name
        self.manifest = manifest or apiserversource_manifest()
        self.binary = adapter_binary()
        if not self.binary.exists():
            raise ProcessFailed(f"no Knative receive adapter at {self.binary}: bash localcp/build-knative.sh")

    def environment(self) -> dict[str, str]:
        """The adapter Deployment's environment, as Eventing's controller writes it."""
        namespaces = [n.metadata.name for n in self.api.list_namespace().items]
        metadata = self.manifest["metadata"]
        return {"K_SINK": self.tap.url, "K_SOURCE_CONFIG": json.dumps(source_config(self.manifest, namespaces),
                                                                        separators=(",", ":")),
                "SYSTEM_NAMESPACE": "knative-eventing", "NAMESPACE": metadata["namespace"], "NAME": metadata["name"],
                "METRICS_DOMAIN": "knative.dev/eventing", "K_LOGGING_CONFIG": LOGGING_CONFIG,
                "K_KLOG_VERBOSITY": "0", "K_OBSERVABILITY_CONFIG": OBSERVABILITY_CONFIG}

    def start(self, timeout: float = 30) -> "ReceiveAdapter":
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
               "KUBECONFIG": str(self.kubeconfig), **self.environment()}
        self.process = self.cp._spawn(self.name, [str(self.binary)], env=env)
        self.wait_delivering(timeout)
        return self

    def wait_delivering(self, timeout: float = 30) -> None:
        """Returns once the adapter's watch delivers: a probe pod created now (matching the
        source's selector, scheduled by no one) has its add event at the tap."""
        selector = self.manifest["spec"]["resources"][0].get("selector", {}).get("matchLabels", {})
        name = f"{PROBE_PREFIX}{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout
        while True:  # each try a new probe: the first may be created before the watch began
            self.api.create_namespaced_pod("default", {
                "metadata": {"name": name, "labels": selector},
                "spec": {"schedulerName": "gpu-scheduler-adapter-probe", "containers": [{"name": "c", "image": "none"}]}})
            probe_deadline = time.monotonic() + 2
            while time.monotonic() < probe_deadline and ("add", name) not in self.tap.probes:
                if self.process.poll() is not None:
                    raise ProcessFailed(f"the receive adapter exited:\n{self.cp.log_tail(self.name)}")
                time.sleep(0.05)
            self.api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            if ("add", name) in self.tap.probes:
                return
            if time.monotonic() > deadline:
                raise ProcessFailed(f"the receive adapter did not deliver within {timeout:g}s:\n{self.cp.log_tail(self.name)}")
            name = f"{PROBE_PREFIX}{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        process = self.cp.processes.pop(self.name, None)
        if process and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.tap.stop()
