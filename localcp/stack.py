"""The whole system on the local control plane: mutate behind TLS as the API server's webhook,
bind as the event sink, and Knative's real ApiServerSource receive adapter between them.

    with LocalStack() as stack: ...   # everything started; everything stopped on exit

By default bind and mutate run as processes of this machine, beside the control plane, from the
source tree (bind with a kubeconfig holding a bound token of its ServiceAccount). With
in_cluster=True they run as pods on the real nodes, from their images (localcp/images.py), as
Knative would run them (localcp/incluster.py): bind reads the API with its pod's ServiceAccount
token, and the API server calls mutate through its Service. Real nodes come with the cluster
network of localcp/network.py (kube-proxy, CoreDNS, routes between nodes); localcp/podnet.py says
how the control plane and the machine reach into it without a packet leaving the machine.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from kubernetes import client, config

from . import func, images, incluster, knative, pki, traefik
from .cluster import CACHE, REPO, ControlPlane, ProcessFailed, free_port
from .adapter import EventTap, ReceiveAdapter
from .cloudevents import Sender, ping_headers
from .nodes import Nodes, node_addresses
from .workloads import WorkloadControllers

PYTHON = sys.executable
WEBHOOK_MANIFEST = REPO / "knative" / "webhook.yaml"
KNATIVE_VALUES = REPO / "localcp" / "knative-values.yaml"
FUNC_VALUES = REPO / "functions" / "func-values.yaml"  # a func user's values for the rest of the chart
RELEASE = "gpu-scheduler"
BIND_ACCOUNT = ("gpu-scheduler", "bind")
SOURCE_ACCOUNT = ("gpu-scheduler", "pod-events")  # the ApiServerSource's (knative/sources.yaml)
MUTATE_ACCOUNT = ("gpu-scheduler", "mutate")
FUNCTION_BYTECODE = CACHE / "bytecode"  # _function_env


class LocalStack:
    def __init__(self, webhook: bool = True, event_source: bool = True, real_nodes: bool = False,
                 in_cluster: bool = False, mutate_drain_seconds: float = 0, functions: bool = True,
                 workloads: tuple[str, ...] = (), apiserver_flags: tuple[str, ...] = (), knative: bool = False,
                 knative_values: tuple[str, ...] = (), deployed_by_func: bool = False, **source_options):
        """real_nodes: node1..node4 are kubelets with containerd that run the pods
        (localcp/nodes.py); otherwise Node objects without kubelets, where pods are bound and stay
        Pending (enough for placement, and cheap for hundreds of pods). in_cluster: bind and
        mutate run as pods on those real nodes (see the module's docstring).
        mutate_drain_seconds: how long mutate drains on SIGTERM (DRAIN_SECONDS); 0 by default, as
        for bind: nothing here routes by readiness, and a stack stops faster without it.
        functions=False (with in_cluster): the nodes, with the functions' images loaded, and the
        pod network, but no bind, mutate, webhook or event source: room for a release of the chart
        (tests/test_chart_runtime.py installs it with helm); pass webhook=False, event_source=False.
        workloads: the real workload controllers to run beside the control plane, e.g.
        ("jobset", "lws") or ("jobset", "lws", "kueue") (localcp/workloads.py; self.workloads),
        started right after it, before our own webhook, and stopped first. Kueue enables its
        JobSet and LeaderWorkerSet integrations when their CRDs are served (theirs are applied
        before any controller starts) and manages only the namespaces labelled KUEUE_NAMESPACE_LABEL (create_namespace's labels).
        apiserver_flags: more kube-apiserver flags, e.g. ("--feature-gates=GenericWorkload=true",)
        for a test of what a feature gate makes the server keep.
        knative: Knative Eventing and Serving installed from their release configuration
        (localcp/knative.py) on the real nodes, then the chart with runtime knative and
        localcp/knative-values.yaml (knative_values: more `helm install` arguments): bind and
        mutate are Knative Services, the webhook is the chart's, and the events come from the
        real ApiServerSource and PingSource adapters (webhook and event_source are ignored).
        deployed_by_func (with knative): as a func user installs it (docs/install.md, "func"): the
        chart with functions/func-values.yaml for everything but the two Knative Services, and
        `func deploy` of functions/bind and functions/mutate for those."""
        self.knative = knative
        self.deployed_by_func = deployed_by_func
        self.knative_values = tuple(knative_values)
        if knative:
            in_cluster, webhook, event_source = True, False, False
        self.mutate_drain_seconds = mutate_drain_seconds
        self._mutates = 0
        real_nodes = real_nodes or in_cluster
        self.cp = ControlPlane(kubelets=node_addresses() if real_nodes else None)
        self.cp.apiserver_flags += list(apiserver_flags)
        self.real_nodes = real_nodes
        self.in_cluster = in_cluster
        self.functions = functions
        self.nodes: Nodes | None = None
        self.workloads = WorkloadControllers(self.cp, tuple(workloads)) if workloads else None
        self.webhook = webhook
        self.event_source = event_source
        self.source_options = source_options
        self.source: EventTap | None = None  # between the real adapter and bind: its fault switches
        self.adapter: ReceiveAdapter | None = None
        self.mutate_port = free_port()
        self.bind_port = free_port()
        self.mutate_url = f"https://127.0.0.1:{self.mutate_port}"
        self.bind_url = f"http://127.0.0.1:{self.bind_port}"  # in_cluster: the bind Service, via podnet

    def __enter__(self) -> "LocalStack":
        try:
            self.cp.start()
            if self.workloads:
                self.workloads.start()
            if self.real_nodes:
                functions = tuple(images.function_image(n) for n in ("bind", "mutate")) if self.in_cluster else ()
                if self.knative:
                    functions += (*knative.knative_images(), traefik.image())
                if self.deployed_by_func:
                    functions += (func.image(),)  # func invoke runs in a pod: func.invoke_from_a_pod
                self.nodes = Nodes(self.cp, extra_images=functions).start(wait_dns=False)
            self.api = self._admin_api()
            if self.knative:
                self.knative_seconds = knative.install(self.cp)
                self.traefik_seconds = traefik.install(self.cp)  # Knative's networking layer
                if self.functions:
                    self.install_release()
                    if self.sink_service_exists():  # sink.path direct-service
                        self._open_doors("bind-events")
            elif self.in_cluster:
                if self.functions:
                    self._deploy_functions()
                    self._open_doors()
            else:
                self._start_mutate()
            if self.webhook:
                self.register_webhook()
            if not self.in_cluster:
                self._start_bind()
            if self.event_source:
                self.start_event_source(**self.source_options)
            if self.nodes:
                self.nodes.wait_dns()  # CoreDNS started with the nodes; Ready by now, or soon
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.adapter:
            self.adapter.stop()
        if self.workloads:
            self.workloads.stop()  # their webhook configurations first, then the processes
        if self.nodes:
            self.nodes.stop()  # pods deleted through the API first, then kubelets and containerds
        self.cp.__exit__(*exc)

    # -- clients ---------------------------------------------------------------------------
    def _admin_api(self) -> client.CoreV1Api:
        self.api_client = config.new_client_from_config(str(self.cp.kubeconfig))
        return client.CoreV1Api(self.api_client)

    def apply(self, manifest: str | dict) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.cp.kubectl("apply", "-f", "-", input=text).stdout

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """labels: e.g. localcp.workloads.KUEUE_NAMESPACE_LABEL, for Kueue to manage it."""
        self.api.create_namespace({"metadata": {"name": name, **({"labels": labels} if labels else {})}})
        self.cp.wait_namespace_ready(name)
        return name

    # -- mutate ----------------------------------------------------------------------------
    def _start_mutate(self) -> None:
        d = self.cp.workdir
        self.webhook_ca = pki.make_ca(d, "webhook-ca")
        self.mutate_cert = pki.make_cert(d, "mutate", self.webhook_ca, "/CN=mutate",
                                         sans=("IP:127.0.0.1", "DNS:localhost"))
        self.mutate_kubeconfig = self._account_kubeconfig(MUTATE_ACCOUNT)
        self.mutate_process = self._spawn_mutate()

    @staticmethod
    def mutate_command(binds: list[str], cert: tuple[Path, Path],
                       app: str = 'functions_framework:create_app(target="mutate", source="functions/mutate/main.py")'
                       ) -> list[str]:
        """mutate as this stack serves it: functions-framework has no TLS option, so gunicorn
        serves its app over TLS, with localcp/mutate_gunicorn.py (the images' settings). `app`:
        another app served the same way (the bench's null webhook)."""
        key, crt = cert
        return [PYTHON, "-m", "gunicorn", "--config", "python:localcp.mutate_gunicorn",
                *(f"--bind={address}" for address in binds), "--certfile", str(crt), "--keyfile", str(key),
                "--chdir", str(REPO), app]

    def _spawn_mutate(self) -> str:
        """A mutate process on the webhook's port, ready; its name. It listens on a port of its own
        too, where its readiness is read: the webhook's port may be shared with another mutate
        (reuse_port, during a restart)."""
        self._mutates += 1
        name = "mutate" if self._mutates == 1 else f"mutate-{self._mutates}"
        own = free_port()
        self.cp._spawn(name, self.mutate_command([f"127.0.0.1:{self.mutate_port}", f"127.0.0.1:{own}"], self.mutate_cert),
                       env=self._function_env(DRAIN_SECONDS=str(self.mutate_drain_seconds),
                                              KUBECONFIG=str(self.mutate_kubeconfig)))
        context = ssl.create_default_context(cafile=str(self.webhook_ca[1]))
        self.cp._wait(name, lambda: self._get(f"https://127.0.0.1:{own}/health/readiness", context) == 200,
                      "/health/readiness")
        return name

    def restart_mutate(self) -> None:
        """mutate rolled to a new process, as a rollout does it: the new one started and ready on
        the same port (reuse_port), then SIGTERM to the old one, which drains for
        mutate_drain_seconds and stops; returns once it has exited."""
        old = self.mutate_process
        self.mutate_process = self._spawn_mutate()
        process = self.cp.processes.pop(old)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=self.mutate_drain_seconds + 30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise ProcessFailed(f"{old} still running {self.mutate_drain_seconds + 30:g} s after SIGTERM:\n"
                                f"{self.cp.log_tail(old)}") from None

    @staticmethod
    def _get(url: str, context=None) -> int:
        with urllib.request.urlopen(url, context=context, timeout=2) as r:
            return r.status

    @staticmethod
    def _function_env(**extra: str) -> dict[str, str]:
        """The functions' environment here. Their bytecode is kept as their images keep theirs,
        in a tree of its own (here under the cache, written by the first start): with a machine's
        PYTHONDONTWRITEBYTECODE every start compiled bind's modules (0.2 s of its cold start)."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
               "PYTHONPYCACHEPREFIX": str(FUNCTION_BYTECODE), **extra}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.setdefault("LOG_LEVEL", "INFO")
        env.setdefault("DRAIN_SECONDS", "0")  # see __init__'s mutate_drain_seconds
        return env

    def webhook_configuration(self) -> dict:
        """knative/webhook.yaml as shipped (rules, matchConditions, namespace selector, failure
        policy, timeout), with only clientConfig pointed at the local mutate and its CA."""
        manifest = yaml.safe_load(WEBHOOK_MANIFEST.read_text())
        manifest["metadata"].pop("annotations", None)  # cert-manager's CA injection: not here
        ca_bundle = base64.b64encode(self.webhook_ca[1].read_bytes()).decode()
        for webhook in manifest["webhooks"]:
            if self.in_cluster:  # the shipped clientConfig.service, mutate's Service
                webhook["clientConfig"]["caBundle"] = ca_bundle
            else:
                webhook["clientConfig"] = {"url": f"{self.mutate_url}/", "caBundle": ca_bundle}
        return manifest

    def register_webhook(self) -> None:
        self.apply(self.webhook_configuration())

    def unregister_webhook(self) -> None:
        self.cp.kubectl("delete", "mutatingwebhookconfiguration", "gpu-scheduler", "--ignore-not-found")

    # -- in the cluster ----------------------------------------------------------------------
    def _open_doors(self, service_name: str = "bind") -> None:
        """The bind Service on the machine's loopback (bind_url), for what runs on the machine and
        sends to it (the tap of the receive adapter, ping): localcp/podnet.py relays each connection
        to the Service's ClusterIP inside node1's namespace, where kube-proxy picks the endpoint.
        knative: the chart's Service on bind's revision pods (sink.path direct-service)."""
        service = json.loads(self.cp.get(f"/api/v1/namespaces/{incluster.NAMESPACE}/services/{service_name}"))
        config, ready = self.cp.workdir / "network" / "doors.json", self.cp.workdir / "network" / "doors.ready"
        config.write_text(json.dumps({"ready": str(ready), "doors": [{
            "name": "bind", "port": self.bind_port, "cluster_ip": service["spec"]["clusterIP"],
            "service_port": incluster.SERVICE_PORTS["bind"], "netns": self.nodes["node1"].netns}]}))
        self.cp._spawn("doors", [PYTHON, "-m", "localcp.podnet", str(config)], env={**os.environ, "PYTHONPATH": str(REPO)})
        self.cp._wait("doors", ready.exists, "its listeners", timeout=20)

    # -- on Knative --------------------------------------------------------------------------
    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """helm (the one localcp/build-helm.sh builds; HELM overrides it) on this stack."""
        helm = os.environ.get("HELM") or subprocess.run(["bash", str(REPO / "localcp" / "build-helm.sh"), "--path"],
                                                        check=True, capture_output=True, text=True).stdout.strip()
        if not os.access(helm, os.X_OK):
            raise ProcessFailed(f"no helm at {helm}: run `make controlplane` (or bash localcp/build-helm.sh)")
        done = subprocess.run([helm, "--kubeconfig", str(self.cp.kubeconfig), *args],
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise ProcessFailed(f"helm {' '.join(args)}: {done.stderr.strip()}")
        return done

    def _release_values(self) -> tuple[str, ...]:
        """The release's values, as `helm install` arguments: runtime knative, the stack's values,
        a func user's (deployed_by_func), then knative_values."""
        by_func = ("-f", str(FUNC_VALUES)) if self.deployed_by_func else ()
        return ("--set", "runtime=knative", "-f", str(KNATIVE_VALUES), *by_func, *self.knative_values)

    def install_release(self, timeout: float = 240) -> None:
        """The chart on Knative, as a user installs it (helm install, runtime knative, with
        localcp/knative-values.yaml), ready: see knative_not_ready. deployed_by_func: the chart
        without the two Knative Services, then `func deploy` of each (self.func_seconds: how long
        each took, func waiting for its Service to be Ready)."""
        self.helm("install", RELEASE, str(REPO / "chart" / "gpu-scheduler"), "--namespace", incluster.NAMESPACE,
                  "--create-namespace", *self._release_values())
        self.func_seconds: dict[str, float] = {}
        if self.deployed_by_func:
            for name in ("mutate", "bind"):  # mutate first: the chart's webhook already names it
                start = time.monotonic()
                func.deploy(self.cp, name, images.function_image(name).name)
                self.func_seconds[name] = time.monotonic() - start
        try:
            self.wait_for(lambda: not self.knative_not_ready(), timeout, "the release ready on Knative", interval=1)
        except TimeoutError as error:
            raise ProcessFailed(f"{error}: {'; '.join(self.knative_not_ready())}\n"
                                f"{self.cp.kubectl('get', 'ksvc,configurations,revisions,routes,podautoscalers,serverlessservices,apiserversources,pingsources,pods', '-n', incluster.NAMESPACE, '-o', 'wide', check=False).stdout}"
                                f"{self.cp.kubectl('get', 'events', '-n', incluster.NAMESPACE, check=False).stdout[-3000:]}") from None

    def chart_knative_service(self, name: str) -> dict:
        """The Knative Service `name` as the chart renders it with this stack's values
        (functionsDeployedBy chart), kept as the API server and Knative's defaulting webhook would
        keep it (a server-side dry run, under the name <name>-chart: `name` may exist)."""
        rendered = self.helm("template", RELEASE, str(REPO / "chart" / "gpu-scheduler"), "--namespace",
                             incluster.NAMESPACE, *self._release_values(), "--set", "functionsDeployedBy=chart").stdout
        [service] = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Service"
                     and d["apiVersion"].startswith("serving.knative.dev/") and d["metadata"]["name"] == name]
        service["metadata"]["name"] = f"{name}-chart"
        return json.loads(self.cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                          input=json.dumps(service)).stdout)

    def knative_resources(self, resource: str, namespace: str = incluster.NAMESPACE) -> list[dict]:
        return json.loads(self.cp.kubectl("get", resource, "-n", namespace, "-o", "json").stdout)["items"]

    def sink_service_exists(self) -> bool:
        """Whether the release has sink.path direct-service's Service (bind-events)."""
        return self.cp.kubectl("get", "service", "bind-events", "-n", incluster.NAMESPACE,
                               "--ignore-not-found", "-o", "name").stdout.strip() != ""

    def knative_not_ready(self) -> list[str]:
        """What of the release is not ready: every Configuration, its latest Revision and that
        revision's PodAutoscaler and ServerlessService, Route, KIngress (Traefik's) and source Ready, the webhook's Service
        with a ready endpoint, and sink.path direct-service's Service too where the release has it
        (through the Route, bind may be at zero: its Route is what must be ready, and its
        PodAutoscaler says NoTraffic)."""
        missing = []
        per_revision = ("revisions.serving.knative.dev", "podautoscalers.autoscaling.internal.knative.dev",
                        "serverlessservices.networking.internal.knative.dev")
        listed = {resource: self.knative_resources(resource) for resource in (
            "configurations.serving.knative.dev", *per_revision, "routes.serving.knative.dev",
            "ingresses.networking.internal.knative.dev", "apiserversources.sources.knative.dev",
            "pingsources.sources.knative.dev")}

        def ready_condition(item: dict) -> dict:
            return {c["type"]: c for c in item.get("status", {}).get("conditions", [])}.get("Ready", {})
        # Each Configuration's latest revision: an older one no Route sends to any more scales to
        # zero and says so (NoTraffic); what must be ready is what serves.
        latest = {c.get("status", {}).get("latestCreatedRevisionName") for c in listed["configurations.serving.knative.dev"]}
        # A revision at zero (bind.scale.min 0, idle): its PodAutoscaler is Ready False for
        # NoTraffic and its ServerlessService, in Proxy mode (the activator in the path), has no
        # healthy backend: Knative's way of saying so; its Route still reaches it.
        at_zero = {item["metadata"]["name"] for item in listed["podautoscalers.autoscaling.internal.knative.dev"]
                   if ready_condition(item).get("reason") == "NoTraffic"}
        for resource, items in listed.items():
            if resource in per_revision:
                items = [item for item in items if item["metadata"]["name"] in latest]
            if not items:
                missing.append(f"no {resource}")
            for item in items:
                name, kind = item["metadata"]["name"], item["kind"]
                asleep = name in at_zero and (kind == "PodAutoscaler" or (
                    kind == "ServerlessService" and item.get("spec", {}).get("mode") == "Proxy"))
                if ready_condition(item).get("status") != "True" and not asleep:
                    missing.append(f"{kind} {name}")
        for service in ("mutate-webhook", *(("bind-events",) if self.sink_service_exists() else ())):
            if not self.ready_endpoints(service):
                missing.append(f"Service {service} without a ready endpoint")
        return missing

    def _deploy_functions(self, timeout: float = 180) -> None:
        """bind and mutate as Deployments and Services (localcp/incluster.py), with the accounts
        and RBAC of knative/rbac.yaml, ready: each Service has a ready endpoint."""
        self._apply_accounts()
        self.webhook_ca = pki.make_ca(self.cp.workdir, "webhook-ca")
        host = f"mutate.{incluster.NAMESPACE}.svc"  # the name the API server checks for a Service
        key, crt = pki.make_cert(self.cp.workdir, "mutate", self.webhook_ca, f"/CN={host}",
                                 sans=(f"DNS:{host}", f"DNS:{host}.cluster.local"))
        self.apply(incluster.tls_secret(key, crt))
        for name in ("bind", "mutate"):
            self.apply(incluster.deployment(name))
            self.apply(incluster.service(name))

        def ready() -> bool:
            return all(self.ready_endpoints(name) for name in ("bind", "mutate"))
        try:
            self.wait_for(ready, timeout, "bind and mutate ready in the cluster", interval=1)
        except TimeoutError as error:
            pods = self.cp.kubectl("get", "pods", "-n", incluster.NAMESPACE, "-o", "wide", check=False).stdout
            events = self.cp.kubectl("get", "events", "-n", incluster.NAMESPACE, check=False).stdout
            raise ProcessFailed(f"{error}\n{pods}\n{events[-3000:]}") from None

    def ready_endpoints(self, name: str) -> list[str]:
        """The ready addresses of a Service of ours, from its EndpointSlices."""
        slices = json.loads(self.cp.get(f"/apis/discovery.k8s.io/v1/namespaces/{incluster.NAMESPACE}/endpointslices"
                                        f"?labelSelector=kubernetes.io/service-name={name}"))["items"]
        return [e["addresses"][0] for s in slices for e in s.get("endpoints") or []
                if e.get("conditions", {}).get("ready")]

    # -- bind ------------------------------------------------------------------------------
    def _apply_accounts(self) -> None:
        """The namespace, accounts and RBAC that knative/ ships (tests/test_manifests.py holds
        them equal to gpu_scheduler/permissions.py): every test then shows the grant is enough."""
        namespace, name = BIND_ACCOUNT
        for manifest in ("namespace.yaml", "rbac.yaml"):
            self.cp.kubectl("apply", "-f", str(REPO / "knative" / manifest))
        deadline = time.monotonic() + 30
        while not self.cp.service_account_ready(namespace, name):
            if time.monotonic() > deadline:
                raise ProcessFailed(f"ServiceAccount {namespace}/{name} missing after applying knative/rbac.yaml")
            time.sleep(0.2)

    def _bind_kubeconfig(self) -> Path:
        """bind runs as its own ServiceAccount, with a bound token of it."""
        return self._account_kubeconfig(BIND_ACCOUNT)

    def _account_kubeconfig(self, account: tuple[str, str]) -> Path:
        """A kubeconfig with a bound token of one of knative/rbac.yaml's ServiceAccounts (applied first)."""
        self._apply_accounts()
        token = self.cp.service_account_token(*account)
        path = self.cp.workdir / f"{account[1]}.kubeconfig"
        path.write_text(self.cp.kubeconfig_text(user={"token": token}))
        return path

    def _start_bind(self) -> None:
        self.bind_kubeconfig = self._bind_kubeconfig()
        self.start_bind("bind", self.bind_port)

    def start_bind(self, name: str, port: int, tree: Path = REPO, kubeconfig: Path | None = None) -> str:
        """bind from `tree` (its functions/ and core, e.g. an older revision's), served as its
        image serves it (gunicorn with serving/gunicorn_config.py, which a revision older than
        serving/ had in gpu_scheduler/; a revision older than that file by functions-framework's
        CLI, as its image did) as the bind account (or as `kubeconfig` says: an older revision
        needs its own grant), ready; its URL. Stopped with the stack."""
        source = str(tree / "functions" / "bind" / "main.py")
        config = next((package for package in ("serving", "gpu_scheduler")
                       if (tree / package / "gunicorn_config.py").exists()), None)
        if config:
            argv = [PYTHON, "-m", "gunicorn", "--config", f"python:{config}.gunicorn_config",
                    f"--bind=127.0.0.1:{port}", f'functions_framework:create_app(target="bind", source="{source}")']
        else:
            argv = [PYTHON, "-m", "functions_framework", "--target", "bind", "--source", source,
                    "--host", "127.0.0.1", "--port", str(port)]
        # Without the webhook no pod carries the quota requests mutate adds, and GPUQuota would
        # refuse every one: such a stack is one without quotas (GPU_SCHEDULER_QUOTA=false).
        quota = {} if self.webhook else {"GPU_SCHEDULER_QUOTA": "false"}
        self.cp._spawn(name, argv, env={**self._function_env(KUBECONFIG=str(kubeconfig or self.bind_kubeconfig), **quota),
                                        "PYTHONPATH": str(tree)},
                       cwd=str(tree))  # `python -m` puts the working directory first on sys.path: the tree's core, not ours
        url = f"http://127.0.0.1:{port}"
        # Asked often: the bench reads how soon it is ready (a cold start) from this wait.
        self.cp._wait(name, lambda: self._get(f"{url}/health/readiness") == 200, "/health/readiness", interval=0.02)
        return url

    def ping(self) -> dict:
        """What a PingSource tick does: ask bind to resync. Returns bind's answer."""
        sender = Sender(self.bind_url, delays=())
        response = sender.http.request("POST", self.bind_url, body=b"{}", headers=ping_headers())
        return {"status": response.status, **json.loads(response.data or b"{}")}

    def start_event_source(self, **faults) -> EventTap:
        """Knative's real receive adapter for knative/sources.yaml's ApiServerSource, as a process
        of this machine with the source's ServiceAccount, sending to bind through a tap with
        fault switches (localcp/adapter.py); returns the tap, also self.source."""
        self.source = EventTap(self.bind_url, **faults)
        self.adapter = ReceiveAdapter(self.cp, self.api, self.source, self._account_kubeconfig(SOURCE_ACCOUNT))
        try:
            self.adapter.start()
        except BaseException:
            self.adapter.stop()
            raise
        return self.source

    # -- waiting ---------------------------------------------------------------------------
    def pods(self, namespace: str, selector: str = "") -> list[dict]:
        listing = self.api.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        return json.loads(listing.data)["items"]

    def wait_for(self, condition, timeout: float = 60, what: str = "condition", interval: float = 0.2):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"{what} not met after {timeout}s")

    def wait_bound(self, namespace: str, count: int, selector: str = "", timeout: float = 60) -> list[dict]:
        def bound():
            pods = self.pods(namespace, selector)
            done = [p for p in pods if p["spec"].get("nodeName")]
            return pods if len(pods) >= count and len(done) == len(pods) else None
        return self.wait_for(bound, timeout, f"{count} pods bound in {namespace}")
