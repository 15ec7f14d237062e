"""Where the API server is and how to prove who we are: a pod's ServiceAccount, or a kubeconfig
read as kubectl reads it. The result is plain data (ClusterConfig) that kubeapi/client.py builds
its connections from.

Why not the kubernetes package's loader: bind and mutate used nothing else of the package, and
importing it was half of bind's start (0.53 of 1.15 s, `python -X importtime`) and more than half
of its image (123 of 202 MB of the virtual environment, with its dependencies). What a loader must
do is small and specified (kubectl's `clientcmd` rules):

- KUBECONFIG is a list of files, merged: the first file to name a cluster, user or context wins,
  and the first to set current-context; files that do not exist are skipped. `--kubeconfig` is one
  file, which must exist.
- Paths in a file (certificate-authority, client-certificate, client-key, tokenFile, exec's
  command when it has a '/') are relative to that file's directory.
- Credentials: token, tokenFile (read again as it rotates), an exec plugin
  (client.authentication.k8s.io/v1 and v1beta1: a token with its expiry, or a client certificate),
  username and password. The in-tree auth-providers (gcp, azure, oidc) are refused with the fix:
  kubectl itself replaced gcp's and azure's with exec plugins.
- Inline data (*-data fields) is base64; TLS reads certificates from files, so client certificates
  given inline are written to private temporary files (0600, removed at exit).

Every error is KubeconfigError (a ValueError) naming the file, context or field and the fix.
"""
from __future__ import annotations

import atexit
import base64
import binascii
import ipaddress
import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit
from urllib.request import getproxies

IN_CLUSTER_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER_NAMESPACE = f"{IN_CLUSTER_DIR}/namespace"
MAX_FILE_BYTES = 16 * 1024 * 1024  # of a kubeconfig or a token file: bounded memory on a wrong path
MAX_EXEC_OUTPUT = 1024 * 1024      # an ExecCredential is a few kilobytes
EXEC_TIMEOUT_SECONDS = 60.0        # nothing here can answer an interactive plugin's prompt
EXPIRY_MARGIN_SECONDS = 10.0       # an exec token is fetched again this long before it expires
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class KubeconfigError(ValueError):
    """The configuration cannot be used; the message names what to fix."""


class Credentials:
    """What proves who we are, as the headers of a request (none: a client certificate or nothing)."""

    def headers(self) -> dict[str, str]:
        return {}

    def invalidate(self) -> None:
        """The API server answered 401: what is cached is not valid any more."""

    @property
    def client_certificate(self) -> tuple[str, str] | None:
        """(certificate file, key file) this credential presents in TLS, if any."""
        return None


@dataclass(frozen=True)
class StaticToken(Credentials):
    token: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass(frozen=True)
class BasicAuth(Credentials):
    username: str
    password: str

    def headers(self) -> dict[str, str]:
        pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}


class TokenFile(Credentials):
    """A token read from its file on each ask (callers cache for seconds): projected ServiceAccount
    tokens are rotated by the kubelet in place. A file that cannot be read keeps the last token."""

    def __init__(self, path: str):
        self.path = path
        self._token = _read_token(path)

    def headers(self) -> dict[str, str]:
        try:
            self._token = _read_token(self.path)
        except KubeconfigError:
            pass  # mid-rotation or briefly unreadable: the previous token is still the best guess
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r})"


def _read_token(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise KubeconfigError(f"token file {path}: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise KubeconfigError(f"token file {path} is larger than {MAX_FILE_BYTES} bytes: not a token")
    return data.decode("utf-8", "replace").strip()


class ExecCredential(Credentials):
    """A credential plugin's answer (client.authentication.k8s.io ExecCredential), fetched when first
    needed and again when it expires or the API server refuses it."""

    def __init__(self, api_version: str, command: list[str], env: Mapping[str, str], cwd: str | None,
                 cluster: Mapping[str, Any] | None = None, run: Callable[..., Any] = subprocess.run):
        self.api_version, self.command, self.env, self.cwd, self.cluster = api_version, command, dict(env), cwd, cluster
        self._run = run
        self._lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._expires = float("inf")
        self._files: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"ExecCredential({self.command[0]!r})"

    def _fresh(self) -> dict[str, Any]:
        with self._lock:
            if self._status is None or time.time() >= self._expires - EXPIRY_MARGIN_SECONDS:
                self._status = self._exec()
                expiry = self._status.get("expirationTimestamp")
                self._expires = _timestamp(expiry) if expiry else float("inf")
            return self._status

    def _exec(self) -> dict[str, Any]:
        info: dict[str, Any] = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        if self.cluster is not None:
            info["spec"]["cluster"] = dict(self.cluster)
        name = self.command[0]
        try:
            done = self._run(self.command, env={**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)},
                             cwd=self.cwd, stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=EXEC_TIMEOUT_SECONDS)
        except FileNotFoundError:
            raise KubeconfigError(f"exec credential plugin {name!r} was not found: install it, or put it on PATH")
        except subprocess.TimeoutExpired:
            raise KubeconfigError(f"exec credential plugin {name!r} gave no answer in {EXEC_TIMEOUT_SECONDS:.0f} s"
                                  " (it may be waiting for input, which nothing here can give)")
        except OSError as error:
            raise KubeconfigError(f"exec credential plugin {name!r} could not run: {error.strerror or error}")
        if done.returncode != 0:
            detail = (done.stderr or b"")[-2000:].decode("utf-8", "replace").strip()
            raise KubeconfigError(f"exec credential plugin {name!r} exited {done.returncode}"
                                  + (f": {detail}" if detail else ""))
        if len(done.stdout) > MAX_EXEC_OUTPUT:
            raise KubeconfigError(f"exec credential plugin {name!r} wrote more than {MAX_EXEC_OUTPUT} bytes")
        try:
            answer = json.loads(done.stdout)
        except ValueError as error:
            raise KubeconfigError(f"exec credential plugin {name!r} did not write an ExecCredential (JSON): {error}")
        if not isinstance(answer, dict) or not isinstance(answer.get("status"), dict):
            raise KubeconfigError(f"exec credential plugin {name!r} wrote an ExecCredential without a status")
        if answer.get("apiVersion") != self.api_version:
            raise KubeconfigError(f"exec credential plugin {name!r} answered in {answer.get('apiVersion')!r},"
                                  f" not the {self.api_version} the kubeconfig asks for")
        status = answer["status"]
        if not status.get("token") and not (status.get("clientCertificateData") and status.get("clientKeyData")):
            raise KubeconfigError(f"exec credential plugin {name!r} gave neither a token nor a client certificate")
        return status

    def headers(self) -> dict[str, str]:
        token = self._fresh().get("token")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def invalidate(self) -> None:
        with self._lock:
            self._status = None

    @property
    def client_certificate(self) -> tuple[str, str] | None:
        # Read once, when the connections are built (as the kubernetes package does): a plugin
        # whose certificates expire needs the process restarted.
        status = self._fresh()
        if not status.get("clientCertificateData"):
            return None
        if self._files is None:
            self._files = (_private_file(status["clientCertificateData"].encode(), "client-certificate"),
                           _private_file(status["clientKeyData"].encode(), "client-key"))
        return self._files


def _timestamp(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
    except ValueError:
        raise KubeconfigError(f"exec credential: expirationTimestamp {str(text)[:40]!r} is not an RFC 3339 time")


@dataclass(frozen=True)
class ClusterConfig:
    """One API server and how to reach and authenticate to it."""
    host: str                              # https://host:port, no trailing slash
    ca_file: str | None = None
    ca_data: str | None = None             # PEM
    cert_file: str | None = None           # the client certificate, when TLS is the credential
    key_file: str | None = None
    verify: bool = True                    # False: insecure-skip-tls-verify
    tls_server_name: str | None = None     # the name the server's certificate is checked against
    proxy_url: str | None = None
    no_proxy: str = ""
    credentials: Credentials = field(default_factory=Credentials)
    namespace: str = "default"             # the context's, or the pod's

    def client_certificate(self) -> tuple[str, str] | None:
        if self.cert_file:
            return self.cert_file, self.key_file or self.cert_file
        return self.credentials.client_certificate

    def proxy_for_host(self) -> str | None:
        """The proxy calls go through: the cluster's proxy-url, else the environment's (HTTPS_PROXY
        and the like) unless NO_PROXY covers the host, as the kubernetes package decided."""
        if self.proxy_url:
            return self.proxy_url
        url = urlsplit(self.host)
        proxies = getproxies()
        proxy = proxies.get(url.scheme) or proxies.get("all")
        if not proxy or bypasses_proxy(self.host, self.no_proxy or proxies.get("no", "")):
            return None
        return proxy


def bypasses_proxy(url: str, no_proxy: str) -> bool:
    """Whether NO_PROXY's comma-separated rules cover `url`'s host: '*', an address or network
    (CIDR), or a domain and its subdomains (a leading dot or not), with or without a port."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
        entry = entry.lstrip(".")
        for candidate in (host, parts.netloc.lower()):
            if candidate == entry or candidate.endswith("." + entry):
                return True
    return False


def in_cluster(directory: str | None = None, environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """The pod's ServiceAccount: the API server's Service from the environment the kubelet sets,
    its CA, its token (rotated: read again) and its namespace."""
    directory = directory or IN_CLUSTER_DIR
    environ = os.environ if environ is None else environ
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token, ca = os.path.join(directory, "token"), os.path.join(directory, "ca.crt")
    if not os.path.isfile(token) or not os.path.isfile(ca):
        raise KubeconfigError(f"in a pod without its ServiceAccount token ({directory}): set"
                              " automountServiceAccountToken true on the pod or its ServiceAccount")
    namespace = "default"
    try:
        with open(os.path.join(directory, "namespace")) as f:
            namespace = f.read(1024).strip() or "default"
    except OSError:
        pass
    bracketed = f"[{host}]" if ":" in host else host
    return ClusterConfig(host=f"https://{bracketed}:{port}", ca_file=ca, credentials=TokenFile(token),
                         namespace=namespace)


def kubeconfig_files(kubeconfig: str | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """The files kubectl would read: --kubeconfig alone, else KUBECONFIG's list, else ~/.kube/config."""
    environ = os.environ if environ is None else environ
    if kubeconfig:
        return [kubeconfig]
    listed = environ.get("KUBECONFIG")
    if listed:
        return [f for f in listed.split(os.pathsep) if f]
    return [os.path.join(os.path.expanduser("~"), ".kube", "config")]


def _load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise KubeconfigError(f"kubeconfig {path}: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise KubeconfigError(f"kubeconfig {path} is larger than {MAX_FILE_BYTES} bytes: not a kubeconfig")
    import yaml  # only here: a pod's ServiceAccount needs no YAML
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        document = yaml.load(data, Loader=loader)
    except yaml.YAMLError as error:
        raise KubeconfigError(f"kubeconfig {path} is not YAML: {str(error)[:300]}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path} is a {type(document).__name__}, not a mapping (a Config)")
    return document


@dataclass
class _Named:
    value: dict[str, Any]
    directory: str  # of the file that named it: its relative paths start there
    path: str


def _merge(files: list[str], must_exist: bool) -> tuple[dict[str, dict[str, _Named]], str, str]:
    """clusters/users/contexts by name (the first file to name one wins), current-context (the
    first file to set it wins), and the files read (for messages)."""
    merged: dict[str, dict[str, _Named]] = {"clusters": {}, "users": {}, "contexts": {}}
    current = ""
    read = []
    for path in files:
        if not os.path.exists(path):
            if must_exist:
                raise KubeconfigError(f"kubeconfig {path} does not exist")
            continue
        read.append(path)
        document = _load_yaml(path)
        directory = os.path.dirname(os.path.abspath(path))
        for section, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            entries = document.get(section) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"kubeconfig {path}: {section} must be a list")
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise KubeconfigError(f"kubeconfig {path}: an entry of {section} has no name")
                value = entry.get(inner) or {}
                if not isinstance(value, dict):
                    raise KubeconfigError(f"kubeconfig {path}: {section} {entry['name']!r}: {inner} must be a mapping")
                merged[section].setdefault(entry["name"], _Named(value, directory, path))
        if not current and isinstance(document.get("current-context"), str):
            current = document["current-context"]
    if not read:
        raise KubeconfigError(f"no kubeconfig found at {os.pathsep.join(files)} (set --kubeconfig or KUBECONFIG)")
    return merged, current, os.pathsep.join(read)


def _decoded(value: Any, what: str, where: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=False)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"kubeconfig {where}: {what} is not base64") from None


def _resolve(directory: str, path: Any) -> str:
    path = os.path.expanduser(str(path))
    return path if os.path.isabs(path) else os.path.join(directory, path)


def _private_file(data: bytes, what: str) -> str:
    """`data` in a file only this user can read, removed when the process exits."""
    try:
        descriptor, path = tempfile.mkstemp(prefix=f"gpu-scheduler-{what}-")
    except OSError as error:
        raise KubeconfigError(f"the kubeconfig's inline {what} needs a writable temporary directory"
                              f" ({tempfile.gettempdir()}: {error.strerror or error}): set TMPDIR") from None
    atexit.register(_remove, path)
    with os.fdopen(descriptor, "wb") as f:  # mkstemp creates it 0600
        f.write(data)
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def from_kubeconfig(kubeconfig: str | None = None, context: str | None = None,
                    environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """The cluster, user and namespace of `context` (else the current context) in the kubeconfig
    kubectl would read (`kubeconfig` alone, else KUBECONFIG's files merged, else ~/.kube/config)."""
    environ = os.environ if environ is None else environ
    files = kubeconfig_files(kubeconfig, environ)
    merged, current, where = _merge(files, must_exist=bool(kubeconfig))
    chosen = context or current
    if not chosen:
        raise KubeconfigError(f"{where} sets no current-context (use --context)")
    named = merged["contexts"].get(chosen)
    if named is None:
        raise KubeconfigError(f"context {chosen!r} does not exist in {where}")
    ctx = named.value
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    cluster = merged["clusters"].get(cluster_name) if isinstance(cluster_name, str) else None
    if cluster is None:
        raise KubeconfigError(f"context {chosen!r} names cluster {cluster_name!r}, which {where} does not define")
    user = merged["users"].get(user_name) if isinstance(user_name, str) and user_name else None
    if user_name and user is None:
        raise KubeconfigError(f"context {chosen!r} names user {user_name!r}, which {where} does not define")
    c, at = cluster.value, f"{cluster.path} cluster {cluster_name!r}"
    server = c.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError(f"{at} has no server (its API server's URL)")
    url = urlsplit(server)
    if url.scheme not in ("https", "http") or not url.hostname:
        raise KubeconfigError(f"{at}: server {server[:100]!r} is not an http(s) URL")
    ca_file = _resolve(cluster.directory, c["certificate-authority"]) if c.get("certificate-authority") else None
    ca_data = (_decoded(c["certificate-authority-data"], "certificate-authority-data", at).decode("ascii", "replace")
               if c.get("certificate-authority-data") else None)
    cert_file = key_file = None
    credentials: Credentials = Credentials()
    if user is not None:
        u, at_user = user.value, f"{user.path} user {user_name!r}"
        if u.get("auth-provider"):
            provider = (u["auth-provider"] or {}).get("name", "?") if isinstance(u["auth-provider"], dict) else "?"
            raise KubeconfigError(f"{at_user} uses auth-provider {provider!r}, which gpu-scheduler does not run:"
                                  " use an exec credential plugin instead (gke-gcloud-auth-plugin, kubelogin),"
                                  " as kubectl does")
        if u.get("client-certificate-data"):
            cert_file = _private_file(_decoded(u["client-certificate-data"], "client-certificate-data", at_user),
                                      "client-certificate")
        elif u.get("client-certificate"):
            cert_file = _resolve(user.directory, u["client-certificate"])
        if u.get("client-key-data"):
            key_file = _private_file(_decoded(u["client-key-data"], "client-key-data", at_user), "client-key")
        elif u.get("client-key"):
            key_file = _resolve(user.directory, u["client-key"])
        if bool(cert_file) != bool(key_file):
            raise KubeconfigError(f"{at_user} has a client certificate without its key, or a key without its"
                                  " certificate: give both")
        if u.get("token"):
            credentials = StaticToken(str(u["token"]))
        elif u.get("tokenFile"):
            credentials = TokenFile(_resolve(user.directory, u["tokenFile"]))
        elif u.get("exec"):
            credentials = _exec_credential(u["exec"], user.directory, at_user, c)
        elif u.get("username") or u.get("password"):
            credentials = BasicAuth(str(u.get("username") or ""), str(u.get("password") or ""))
    namespace = ctx.get("namespace") if isinstance(ctx.get("namespace"), str) and ctx.get("namespace") else "default"
    return ClusterConfig(host=server.rstrip("/"), ca_file=ca_file, ca_data=ca_data, cert_file=cert_file,
                         key_file=key_file, verify=not c.get("insecure-skip-tls-verify"),
                         tls_server_name=c.get("tls-server-name") or None, proxy_url=c.get("proxy-url") or None,
                         no_proxy=environ.get("NO_PROXY") or environ.get("no_proxy") or "",
                         credentials=credentials, namespace=namespace)


def _exec_credential(spec: Any, directory: str, at: str, cluster: Mapping[str, Any]) -> ExecCredential:
    if not isinstance(spec, dict) or not spec.get("command"):
        raise KubeconfigError(f"{at}: exec needs a command")
    api_version = spec.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise KubeconfigError(f"{at}: exec apiVersion {api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}"
                              " (client.authentication.k8s.io/v1alpha1 was removed in Kubernetes 1.24)")
    command = str(spec["command"])
    if os.sep in command and not os.path.isabs(command):
        command = os.path.join(directory, command)  # kubectl: relative to the kubeconfig's directory
    args = spec.get("args") or []
    env = spec.get("env") or []
    if not isinstance(args, list) or not isinstance(env, list):
        raise KubeconfigError(f"{at}: exec's args and env must be lists")
    try:
        variables = {str(item["name"]): str(item["value"]) for item in env}
    except (TypeError, KeyError):
        raise KubeconfigError(f"{at}: each of exec's env is a name and a value") from None
    shared = None
    if spec.get("provideClusterInfo"):
        shared = {k: v for k, v in {"server": cluster.get("server"),
                                    "certificate-authority-data": cluster.get("certificate-authority-data"),
                                    "tls-server-name": cluster.get("tls-server-name"),
                                    "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify"),
                                    "proxy-url": cluster.get("proxy-url")}.items() if v}
        for extension in cluster.get("extensions") or []:
            if isinstance(extension, dict) and extension.get("name") == "client.authentication.k8s.io/exec":
                shared["config"] = extension.get("extension")
    return ExecCredential(api_version, [command, *map(str, args)], variables, directory, shared)
