"""The Kubernetes API calls gpu-scheduler's shells make, and nothing else, over the pod's
ServiceAccount or a kubeconfig (kubeapi/kubeconfig.py) and urllib3 or kubeapi/transport.py.

Why not the kubernetes package: its generated CoreV1Api takes 0.7 s to import, validates every
call's arguments with pydantic, and cannot deserialize a Binding response anyway
(kubernetes-client/python#825); its configuration loader alone was 0.5 s of bind's start and,
with its dependencies, more than half of bind's image. A handful of REST calls are simpler by hand.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import quote as _quote_with_slash, urlencode

import urllib3

from kubeapi.errors import APIError
from kubeapi.kubeconfig import ClusterConfig, KubeconfigError, from_kubeconfig, in_cluster
from kubeapi.transport import Transport, tls_context

if TYPE_CHECKING:  # msgspec is bind's: mutate and the kubectl plugin decode in full
    from kubeapi.projection import Decoder

try:  # JSON in and out in C where the functions' images have it (the kubectl plugin does not)
    from msgspec.json import decode as decode_json, encode as encode_json
except ImportError:  # pragma: no cover - the plugin's own environment
    decode_json = json.loads

    def encode_json(body: Any) -> bytes:
        return json.dumps(body).encode()


def quote(segment: str) -> str:
    """One path segment, escaped completely, so a name can never add, remove or climb segments
    of the URL: '/' (and '?', '#', '%') escaped, and the dot segments '.' and '..', which urllib3
    would resolve away ('/pods/../x' is sent as '/x'), as %2E. An empty segment would drop the
    name and turn a read into a list: refused."""
    if not isinstance(segment, str) or not segment:
        raise ValueError(f"an API path segment must be a non-empty string, not {segment!r}")
    if segment in (".", ".."):
        return segment.replace(".", "%2E")
    return _quote_with_slash(segment, safe="")


JSON = "application/json"
# A listing's objects as their metadata alone (PartialObjectMetadataList): the API server sends a
# tenth of a running pod's bytes.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
TIMEOUT = urllib3.Timeout(connect=3, read=10)  # an outage must become a 503 quickly, not a hang
# The package's token hook re-reads the kubeconfig on every call (0.5 ms, most of it scanning the
# environment for proxies); tokens rotate in minutes to hours, so ask it every 10 s at most.
AUTH_REFRESH_SECONDS = 10.0
WATCH_CONNECTIONS = 10  # bind's watches (pods, nodes, device records, ResourceSlices and -Claims), with room
# Idle connections kept for calls: bind's workers, a gang's Bindings in flight and the recorder,
# each reusing one rather than opening a TLS connection per call.
KEPT_CONNECTIONS = 32
LIST_PAGE = 500  # items per page of a listing: bounds what one response holds in memory

# Each method's RBAC need; tests hold this equal to the sets of gpu_scheduler.permissions, and
# bind's fake API (tests/test_placer.py) offers bind only the methods BIND grants.
CALLS = {
    "bind": ("", "pods/binding", "create"),
    "read_pod": ("", "pods", "get"),
    "list_pods": ("", "pods", "list"),
    "list_all_pods": ("", "pods", "list"),
    "list_all_pod_metadata": ("", "pods", "list"),
    "list_namespaced_pods": ("", "pods", "list"),
    "watch_all_pods": ("", "pods", "watch"),
    "patch_pod_status": ("", "pods/status", "patch"),
    "read_node": ("", "nodes", "get"),
    "read_jobset": ("jobset.x-k8s.io", "jobsets", "get"),
    "list_nodes": ("", "nodes", "list"),
    "watch_nodes": ("", "nodes", "watch"),
    "read_lease": ("coordination.k8s.io", "leases", "get"),
    "list_leases": ("coordination.k8s.io", "leases", "list"),
    "watch_leases": ("coordination.k8s.io", "leases", "watch"),
    "create_lease": ("coordination.k8s.io", "leases", "create"),
    "update_lease": ("coordination.k8s.io", "leases", "update"),
    "delete_lease": ("coordination.k8s.io", "leases", "delete"),
    "create_event": ("", "events", "create"),
    "read_event": ("", "events", "get"),
    "patch_event": ("", "events", "patch"),
    "list_events": ("", "events", "list"),
    "create_token_review": ("authentication.k8s.io", "tokenreviews", "create"),
    "list_resource_slices": ("resource.k8s.io", "resourceslices", "list"),
    "watch_resource_slices": ("resource.k8s.io", "resourceslices", "watch"),
    "list_resource_claims": ("resource.k8s.io", "resourceclaims", "list"),
    "watch_resource_claims": ("resource.k8s.io", "resourceclaims", "watch"),
    "read_resource_claim": ("resource.k8s.io", "resourceclaims", "get"),
    "create_resource_claim": ("resource.k8s.io", "resourceclaims", "create"),
    "update_resource_claim": ("resource.k8s.io", "resourceclaims", "update"),
    "update_resource_claim_status": ("resource.k8s.io", "resourceclaims/status", "update"),
    "evict": ("", "pods/eviction", "create"),
    "list_pdbs": ("policy", "poddisruptionbudgets", "list"),
    "watch_pdbs": ("policy", "poddisruptionbudgets", "watch"),
    "patch_node_status": ("", "nodes/status", "patch"),
    "list_resource_quotas": ("", "resourcequotas", "list"),
    "list_resource_quotas_all": ("", "resourcequotas", "list"),
    "watch_resource_quotas": ("", "resourcequotas", "watch"),
    "delete_cluster_role_binding": ("rbac.authorization.k8s.io", "clusterrolebindings", "delete"),
    "delete_role_binding": ("rbac.authorization.k8s.io", "rolebindings", "delete"),
}
# What a call needs besides its own method's grant: from 1.36 (DRAResourceClaimGranularStatusAuthorization)
# a claim's status update that changes its allocation or reservedFor also needs `update` on the
# synthetic resourceclaims/binding, cluster-wide.
ALSO_NEEDS = {
    "update_resource_claim_status": (("resource.k8s.io", "resourceclaims/binding", "update"),),
}


def load_configuration() -> ClusterConfig:
    """In a cluster, the pod's ServiceAccount; elsewhere KUBECONFIG (or ~/.kube/config) and its
    current context. Raises KubeconfigError naming what to fix."""
    try:
        return in_cluster()
    except KubeconfigError:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            raise  # in a pod, its ServiceAccount was meant: say why it cannot be used
        return from_kubeconfig()


def load_kubectl_configuration(kubeconfig: str | None = None, context: str | None = None) -> ClusterConfig:
    """The configuration kubectl would use, its `namespace` the default: `--kubeconfig`, else
    KUBECONFIG (a list of paths, merged), else ~/.kube/config; `--context`, else the current
    context, whose namespace is the default ("default" when it names none). In a pod with no
    kubeconfig at all, the pod's ServiceAccount and namespace. Raises KubeconfigError."""
    files = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if (not kubeconfig and not context and os.environ.get("KUBERNETES_SERVICE_HOST")
            and not any(os.path.exists(f) for f in files.split(os.pathsep) if f)):
        return in_cluster()
    return from_kubeconfig(kubeconfig, context)


def unread(raw: bytes) -> dict:
    """The answer of a write whose caller never reads it (the object as stored: a whole pod for a
    status patch, the Event, the Binding's Status), left undecoded: {}. A failed write's answer
    is still decoded, into its APIError."""
    return {}


class Kube:
    def __init__(self, configuration: ClusterConfig, timeout: urllib3.Timeout = TIMEOUT):
        """`timeout`: of each call (not of watches); mutate's are shorter than bind's, inside the
        API server's wait for its answer."""
        self.configuration = configuration
        self.timeout = timeout
        self.host = configuration.host.rstrip("/")
        self.credentials = configuration.credentials
        context, server_name = tls_context(configuration)
        tls: dict[str, Any] = {}
        if urllib3.util.parse_url(self.host).scheme == "https":
            tls = {"ssl_context": context, "cert_reqs": "CERT_REQUIRED" if configuration.verify else "CERT_NONE"}
            if not configuration.verify:
                tls["assert_hostname"] = False
            elif configuration.tls_server_name:
                tls["server_hostname"] = server_name
        # Watches (a connection each, held for minutes) and, through a proxy, every call.
        proxy = configuration.proxy_for_host()
        self.http = (urllib3.ProxyManager(proxy, maxsize=WATCH_CONNECTIONS, **tls) if proxy
                     else urllib3.PoolManager(num_pools=2, maxsize=WATCH_CONNECTIONS, **tls))
        # Without a proxy, calls go over kubeapi/transport.py: a third of urllib3's CPU per call.
        self.transport = None if proxy else Transport(configuration, timeout.connect_timeout, timeout.read_timeout,
                                                      keep=KEPT_CONNECTIONS, tls=(context, server_name))
        self._auth: tuple[float, dict[str, str]] = (float("-inf"), {})
        self._auth_lock = threading.Lock()

    def _auth_headers(self) -> dict[str, str]:
        with self._auth_lock:
            fetched, headers = self._auth
            if time.monotonic() - fetched > AUTH_REFRESH_SECONDS:
                headers = self.credentials.headers()  # a token file read again, an exec plugin run when expired
                self._auth = (time.monotonic(), headers)
            return headers

    def _refused_credentials(self) -> None:
        """A 401: the token may have rotated or expired since it was cached; ask again next call."""
        with self._auth_lock:
            self.credentials.invalidate()
            self._auth = (float("-inf"), {})

    def _call(self, method: str, path: str, body: Any = None, content_type: str = JSON,
              query: dict[str, str] | None = None, decode: Callable[[bytes], dict] = decode_json,
              accept: str = JSON) -> dict:
        headers = {"Accept": accept, **self._auth_headers()}
        data = None
        if body is not None:
            data = encode_json(body)
            headers["Content-Type"] = content_type
        path += f"?{urlencode(query)}" if query else ""
        try:
            if self.transport is not None:
                status, reason, raw = self.transport.request(method, path, data, headers)
            else:
                response = self.http.request(method, self.host + path, body=data, headers=headers, timeout=self.timeout,
                                             retries=1)
                status, reason, raw = response.status, response.reason, response.data
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise APIError.unreachable(error, self.host) from error
        if not 200 <= status <= 299:
            if status == 401:
                self._refused_credentials()
            raise APIError.of_response(status, reason, raw)
        return decode(raw) if raw else {}

    @staticmethod
    def _pod(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"

    def bind(self, namespace: str, name: str, binding: dict) -> dict:
        return self._call("POST", self._pod(namespace, name) + "/binding", binding, decode=unread)

    def read_pod(self, namespace: str, name: str, cached: bool = False, projection: Decoder | None = None) -> dict:
        """`cached`: served from the API server's watch cache (resourceVersion=0), not etcd."""
        return self._call("GET", self._pod(namespace, name), query={"resourceVersion": "0"} if cached else None,
                          decode=projection.object if projection else decode_json)

    def server_version(self) -> dict:
        """The API server's /version (gitVersion, major, minor, ...): every authenticated user may read it."""
        return self._call("GET", "/version")

    def list_pods(self, field_selector: str, projection: Decoder | None = None) -> list[dict]:
        return self._call("GET", "/api/v1/pods", query={"fieldSelector": field_selector},
                          decode=projection.listing if projection else decode_json)["items"]

    def watch(self, path: str, resource_version: str, seconds: int, projection: Decoder | None = None,
              **selectors: str) -> Iterator[tuple[str, dict, int]]:
        """The changes to the objects at `path` after `resource_version`, as (type, object, its
        size in bytes), for about `seconds` (the API server then ends the watch; a watch from the
        watch cache). Bookmarks included. An answer other than 200 raises APIError; an ERROR
        event (410 Gone: the version is too old) is yielded. Over urllib3's pool:
        the stream holds its connection for minutes, which the kept-alive transport keeps for
        short calls. `projection`: decode only the fields it declares (kubeapi/projection.py)."""
        decode = projection.event if projection else decode_json
        query = urlencode({"watch": "1", **{k: v for k, v in selectors.items() if v}, "resourceVersion": resource_version,
                           "allowWatchBookmarks": "true", "timeoutSeconds": str(seconds)})
        try:
            response = self.http.request("GET", f"{self.host}{path}?{query}",
                                         headers={"Accept": JSON, **self._auth_headers()}, preload_content=False,
                                         timeout=urllib3.Timeout(connect=TIMEOUT.connect_timeout, read=seconds + 30),
                                         retries=False)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise APIError.unreachable(error, self.host) from error
        try:
            if not 200 <= response.status <= 299:
                if response.status == 401:
                    self._refused_credentials()
                raise APIError.of_response(response.status, response.reason, response.read(64 * 1024))
            pending = bytearray()
            for chunk in response.stream(256 * 1024):
                pending += chunk
                start = 0
                while (end := pending.find(b"\n", start)) >= 0:
                    line = bytes(pending[start:end])
                    start = end + 1
                    if line.strip():
                        event = decode(line)
                        yield event.get("type") or "", event.get("object") or {}, len(line)
                del pending[:start]
        finally:
            response.release_conn()

    def list_pages(self, path: str, projection: Decoder | None = None, accept: str = JSON, paged: bool = True,
                   **selectors: str) -> Iterator[tuple[list[dict], str]]:
        """A listing of the objects at `path`, LIST_PAGE at a time, as (items, resourceVersion):
        the version, where a watch of them starts, is the first page's (every page is of it).
        `projection`: decode only the fields it declares (kubeapi/projection.py); `accept`:
        METADATA_LIST for the objects' metadata alone. `paged=False`: in one response, which the
        API server answers from its watch cache; a field selector that keeps few objects is
        answered a page at a time by reading through etcd until the page is full (4300 of 20000
        pods: 1.5 s in pages of 500, 0.4 s in one response; bench/gpus.py)."""
        decode = projection.listing if projection else decode_json
        query = {k: v for k, v in selectors.items() if v}
        if paged:
            query["limit"] = str(LIST_PAGE)
        version = ""
        while True:
            listing = self._call("GET", path, query=query, decode=decode, accept=accept)
            meta = listing.get("metadata") or {}
            version = version or meta.get("resourceVersion") or ""
            yield listing.get("items") or [], version
            if not meta.get("continue"):
                return
            query["continue"] = meta["continue"]

    def list_namespaced_pods(self, namespace: str, projection: Decoder | None = None, field_selector: str = "",
                             paged: bool = True) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages(f"/api/v1/namespaces/{quote(namespace)}/pods", projection, paged=paged,
                               fieldSelector=field_selector)

    def list_all_pods(self, projection: Decoder | None = None, field_selector: str = "", paged: bool = True
                      ) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages("/api/v1/pods", projection, paged=paged, fieldSelector=field_selector)

    def list_all_pod_metadata(self, field_selector: str = "", projection: Decoder | None = None, paged: bool = True
                              ) -> Iterator[tuple[list[dict], str]]:
        """Every pod's metadata alone (name, namespace, uid, labels, annotations, owners)."""
        return self.list_pages("/api/v1/pods", projection, METADATA_LIST, paged, fieldSelector=field_selector)

    def watch_all_pods(self, resource_version: str, seconds: int, projection: Decoder | None = None,
                       field_selector: str = "") -> Iterator[tuple[str, dict, int]]:
        return self.watch("/api/v1/pods", resource_version, seconds, projection, fieldSelector=field_selector)

    def list_nodes(self, projection: Decoder | None = None, paged: bool = True) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages("/api/v1/nodes", projection, paged=paged)

    def watch_nodes(self, resource_version: str, seconds: int,
                    projection: Decoder | None = None) -> Iterator[tuple[str, dict, int]]:
        return self.watch("/api/v1/nodes", resource_version, seconds, projection)

    @staticmethod
    def _leases(namespace: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"

    def list_leases(self, namespace: str, label_selector: str, paged: bool = True) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages(self._leases(namespace), paged=paged, labelSelector=label_selector)

    def watch_leases(self, namespace: str, label_selector: str, resource_version: str,
                     seconds: int) -> Iterator[tuple[str, dict, int]]:
        return self.watch(self._leases(namespace), resource_version, seconds, labelSelector=label_selector)

    def read_lease(self, namespace: str, name: str) -> dict:
        return self._call("GET", f"{self._leases(namespace)}/{quote(name)}")

    def create_lease(self, namespace: str, lease: dict, dry_run: bool = False) -> dict:
        """`dry_run`: checked and admitted as a real create would be (the namespace exists, the
        caller may create), and not stored."""
        return self._call("POST", self._leases(namespace), lease, query={"dryRun": "All"} if dry_run else None)

    def update_lease(self, namespace: str, name: str, lease: dict) -> dict:
        """A PUT: refused with 409 unless the body's resourceVersion is the stored one."""
        return self._call("PUT", f"{self._leases(namespace)}/{quote(name)}", lease)

    def delete_lease(self, namespace: str, name: str, resource_version: str) -> dict:
        """Deleted only as it was read (409 if it changed since, 404 if gone)."""
        return self._call("DELETE", f"{self._leases(namespace)}/{quote(name)}",
                          {"kind": "DeleteOptions", "apiVersion": "v1",
                           "preconditions": {"resourceVersion": resource_version}})

    def patch_pod_status(self, namespace: str, name: str, patch: dict) -> dict:
        return self._call("PATCH", self._pod(namespace, name) + "/status", patch, STRATEGIC_PATCH, decode=unread)

    def evict(self, namespace: str, name: str, uid: str) -> dict:
        """The Eviction API (policy/v1): the pod deleted with its own grace period unless a
        PodDisruptionBudget forbids it now (429); only the pod of that UID (409 otherwise)."""
        return self._call("POST", self._pod(namespace, name) + "/eviction",
                          {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": name, "namespace": namespace},
                           "deleteOptions": {"preconditions": {"uid": uid}}})

    def list_pdbs(self) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages("/apis/policy/v1/poddisruptionbudgets")

    def watch_pdbs(self, resource_version: str, seconds: int) -> Iterator[tuple[str, dict, int]]:
        return self.watch("/apis/policy/v1/poddisruptionbudgets", resource_version, seconds)

    def read_jobset(self, namespace: str, name: str) -> dict:
        return self._call("GET", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{quote(namespace)}"
                                 f"/jobsets/{quote(name)}")

    def read_node(self, name: str, cached: bool = False) -> dict:
        """`cached`: served from the API server's watch cache (resourceVersion=0), not etcd."""
        return self._call("GET", f"/api/v1/nodes/{quote(name)}", query={"resourceVersion": "0"} if cached else None)

    def list_resource_quotas(self, namespace: str) -> list[dict]:
        return self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/resourcequotas")["items"]

    def list_resource_quotas_all(self) -> Iterator[tuple[list[dict], str]]:
        """Every namespace's ResourceQuotas (bind's watch of them: GPUQuota)."""
        return self.list_pages("/api/v1/resourcequotas")

    def watch_resource_quotas(self, resource_version: str, seconds: int) -> Iterator[tuple[str, dict, int]]:
        return self.watch("/api/v1/resourcequotas", resource_version, seconds)

    def patch_node_status(self, name: str, patch: dict) -> dict:
        return self._call("PATCH", f"/api/v1/nodes/{quote(name)}/status", patch, MERGE_PATCH)

    def delete_cluster_role_binding(self, name: str) -> dict:
        return self._call("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{quote(name)}")

    def delete_role_binding(self, namespace: str, name: str) -> dict:
        return self._call("DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{quote(namespace)}/rolebindings/"
                                    f"{quote(name)}")

    def create_event(self, namespace: str, event: dict) -> dict:
        return self._call("POST", f"/api/v1/namespaces/{quote(namespace)}/events", event, decode=unread)

    def read_event(self, namespace: str, name: str) -> dict:
        return self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/events/{quote(name)}")

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        return self._call("PATCH", f"/api/v1/namespaces/{quote(namespace)}/events/{quote(name)}", patch, MERGE_PATCH,
                          decode=unread)

    def create_token_review(self, review: dict) -> dict:
        return self._call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)

    def list_events(self, namespace: str, field_selector: str) -> list[dict]:
        return self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/events",
                          query={"fieldSelector": field_selector})["items"]

    # -- DRA (resource.k8s.io/v1) ------------------------------------------------------------------
    RESOURCE = "/apis/resource.k8s.io/v1"

    def list_resource_slices(self) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages(f"{self.RESOURCE}/resourceslices")

    def watch_resource_slices(self, resource_version: str, seconds: int) -> Iterator[tuple[str, dict, int]]:
        return self.watch(f"{self.RESOURCE}/resourceslices", resource_version, seconds)

    def list_resource_claims(self) -> Iterator[tuple[list[dict], str]]:
        return self.list_pages(f"{self.RESOURCE}/resourceclaims")

    def watch_resource_claims(self, resource_version: str, seconds: int) -> Iterator[tuple[str, dict, int]]:
        return self.watch(f"{self.RESOURCE}/resourceclaims", resource_version, seconds)

    def _claims(self, namespace: str) -> str:
        return f"{self.RESOURCE}/namespaces/{quote(namespace)}/resourceclaims"

    def read_resource_claim(self, namespace: str, name: str) -> dict:
        return self._call("GET", f"{self._claims(namespace)}/{quote(name)}")

    def create_resource_claim(self, namespace: str, claim: dict) -> dict:
        return self._call("POST", self._claims(namespace), claim)

    def update_resource_claim(self, namespace: str, name: str, claim: dict) -> dict:
        """A PUT: refused with 409 unless the body's resourceVersion is the stored one."""
        return self._call("PUT", f"{self._claims(namespace)}/{quote(name)}", claim)

    def update_resource_claim_status(self, namespace: str, name: str, claim: dict) -> dict:
        """A PUT of the status subresource, with the same precondition."""
        return self._call("PUT", f"{self._claims(namespace)}/{quote(name)}/status", claim)
