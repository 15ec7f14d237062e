"""kubeapi/kubeconfig.py: the configuration loader bind, mutate and the kubectl plugin use instead of
the kubernetes package's. Side by side with the package's loader (kubernetes.config, a test
dependency) on the same kubeconfigs; over real TLS (a server requiring our client certificate);
an exec credential plugin as a real process; and the shells' imports, which must not load the
kubernetes package at all."""
from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import config as package_config
from kubernetes.client import Configuration
from kubernetes.client.rest import should_bypass_proxies

from kubeapi import kubeconfig
from kubeapi.client import Kube, load_configuration, load_kubectl_configuration
from kubeapi.errors import APIError
from kubeapi.kubeconfig import (BasicAuth, ClusterConfig, ExecCredential, KubeconfigError, StaticToken, TokenFile,
                                bypasses_proxy, from_kubeconfig, in_cluster)
from localcp import pki

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, document: dict) -> Path:
    path.write_text(json.dumps(document))
    return path


def config_of(contexts: list[tuple[str, str, str, str]], clusters: dict[str, dict], users: dict[str, dict],
              current: str | None = None) -> dict:
    """contexts: (name, cluster, user, namespace)."""
    document = {"apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
                "users": [{"name": n, "user": u} for n, u in users.items()],
                "contexts": [{"name": n, "context": {"cluster": c, "user": u, **({"namespace": ns} if ns else {})}}
                             for n, c, u, ns in contexts]}
    if current:
        document["current-context"] = current
    return document


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = pki.make_ca(d)
    server = pki.make_cert(d, "server", ca, "/CN=api", sans=("IP:127.0.0.1", "DNS:api.internal"))
    client = pki.make_cert(d, "client", ca, "/CN=alice", client=True)
    return {"dir": d, "ca": ca[1], "server": server, "client": client}


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


# -- side by side with the kubernetes package's loader -------------------------------------------

def package_load(files: str, context: str | None = None) -> Configuration:
    configuration = Configuration()
    package_config.load_kube_config(config_file=files, context=context, client_configuration=configuration,
                                    persist_config=False)
    return configuration


def test_certificate_files_relative_paths_and_the_namespace_as_the_package_reads_them(certs, tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / "sub" / name).write_bytes((certs["dir"] / name).read_bytes())
    path = write(tmp_path / "sub" / "config", config_of(
        [("dev", "c", "u", "team-a")],
        {"c": {"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt", "tls-server-name": "api.internal"}},
        {"u": {"client-certificate": "client.crt", "client-key": "client.key"}}, current="dev"))
    ours, theirs = from_kubeconfig(str(path)), package_load(str(path))
    assert ours.host == theirs.host.rstrip("/") == "https://127.0.0.1:6443"
    assert Path(ours.ca_file).read_bytes() == Path(theirs.ssl_ca_cert).read_bytes()
    assert Path(ours.cert_file).read_bytes() == Path(theirs.cert_file).read_bytes()
    assert Path(ours.key_file).read_bytes() == Path(theirs.key_file).read_bytes()
    assert ours.tls_server_name == theirs.tls_server_name == "api.internal"
    assert ours.verify is theirs.verify_ssl is True
    assert ours.namespace == "team-a"


def test_inline_data_and_a_token_as_the_package_reads_them(certs, tmp_path):
    path = write(tmp_path / "config", config_of(
        [("dev", "c", "u", "")],
        {"c": {"server": "https://10.0.0.1:443", "certificate-authority-data": b64(certs["ca"])}},
        {"u": {"client-certificate-data": b64(certs["client"][1]), "client-key-data": b64(certs["client"][0]),
               "token": "abc"}}, current="dev"))
    ours, theirs = from_kubeconfig(str(path)), package_load(str(path))
    assert ours.ca_data == Path(theirs.ssl_ca_cert).read_text()
    assert Path(ours.cert_file).read_bytes() == Path(theirs.cert_file).read_bytes()
    assert stat.S_IMODE(os.stat(ours.cert_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(ours.key_file).st_mode) == 0o600
    assert ours.credentials.headers() == {"Authorization": theirs.api_key["BearerToken"]}
    assert ours.namespace == "default"


def test_kubeconfig_list_merged_first_name_and_first_current_context_win(tmp_path, monkeypatch):
    first = write(tmp_path / "a", config_of([("one", "c", "u", "from-a")], {"c": {"server": "https://a:1"}},
                                            {"u": {"token": "ta"}}, current="one"))
    second = write(tmp_path / "b", config_of([("one", "c", "u", "from-b"), ("two", "d", "u", "")],
                                             {"c": {"server": "https://b:1"}, "d": {"server": "https://d:1"}},
                                             {"u": {"token": "tb"}}, current="two"))
    files = os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])
    monkeypatch.setenv("KUBECONFIG", files)
    for context in ("one", "two"):
        ours, theirs = from_kubeconfig(context=context), package_load(files, context)
        assert ours.host == theirs.host
        assert ours.credentials.headers()["Authorization"] == theirs.api_key["BearerToken"]
    # The current context as kubectl takes it (the first file to set it); the package's merger
    # takes the last file's, so it is compared with kubectl itself (test_current_context_as_kubectl...).
    assert from_kubeconfig().host == "https://a:1" and from_kubeconfig().namespace == "from-a"
    assert load_kubectl_configuration(context="two").host == "https://d:1"


@pytest.mark.controlplane  # kubectl's binary, built with the control plane's
def test_merged_files_as_kubectl_merges_them(tmp_path):
    from localcp.cluster import BIN
    first = write(tmp_path / "a", config_of([("one", "c", "u", "from-a")], {"c": {"server": "https://a:1"}},
                                            {"u": {"token": "ta"}}, current="one"))
    second = write(tmp_path / "b", config_of([("one", "c", "u", "from-b"), ("two", "d", "v", "")],
                                             {"c": {"server": "https://b:1"}, "d": {"server": "https://d:1"}},
                                             {"u": {"token": "tb"}, "v": {"token": "tv"}}, current="two"))
    files = os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])
    for context in (None, "one", "two"):
        view = json.loads(subprocess.run(
            [str(BIN / "kubectl"), "config", "view", "--minify", "--raw", "-o", "json",
             *(["--context", context] if context else [])],
            env={**os.environ, "KUBECONFIG": files}, capture_output=True, text=True, check=True).stdout)
        ours = from_kubeconfig(context=context, environ={"KUBECONFIG": files})
        assert ours.host == view["clusters"][0]["cluster"]["server"]
        assert ours.credentials.headers()["Authorization"] == f"Bearer {view['users'][0]['user']['token']}"
        assert ours.namespace == view["contexts"][0]["context"].get("namespace", "default")


def test_insecure_skip_and_basic_auth(tmp_path):
    path = write(tmp_path / "config", config_of([("x", "c", "u", "")],
                                                {"c": {"server": "https://h:6443", "insecure-skip-tls-verify": True}},
                                                {"u": {"username": "ann", "password": "pw"}}, current="x"))
    ours, theirs = from_kubeconfig(str(path)), package_load(str(path))
    assert ours.verify is theirs.verify_ssl is False
    assert ours.credentials == BasicAuth("ann", "pw")
    assert ours.credentials.headers()["Authorization"] == theirs.api_key["BearerToken"]


@pytest.mark.parametrize("document, message", [
    ({"clusters": "x"}, "clusters must be a list"),
    (config_of([("x", "c", "u", "")], {"c": {"server": "https://h"}}, {"u": {}}), "sets no current-context"),
    (config_of([("x", "c", "u", "")], {"c": {"server": "https://h"}}, {"u": {}}, current="y"),
     "context 'y' does not exist"),
    (config_of([("x", "missing", "u", "")], {}, {"u": {}}, current="x"), "names cluster 'missing'"),
    (config_of([("x", "c", "nobody", "")], {"c": {"server": "https://h"}}, {}, current="x"), "names user 'nobody'"),
    (config_of([("x", "c", "u", "")], {"c": {}}, {"u": {}}, current="x"), "has no server"),
    (config_of([("x", "c", "u", "")], {"c": {"server": "h:6443"}}, {"u": {}}, current="x"), "is not an http(s) URL"),
    (config_of([("x", "c", "u", "")], {"c": {"server": "https://h"}},
               {"u": {"auth-provider": {"name": "oidc"}}}, current="x"), "use an exec credential plugin"),
    (config_of([("x", "c", "u", "")], {"c": {"server": "https://h"}},
               {"u": {"client-certificate": "/c.crt"}}, current="x"), "give both"),
    (config_of([("x", "c", "u", "")], {"c": {"server": "https://h"}},
               {"u": {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}}}, current="x"),
     "v1alpha1 was removed"),
])
def test_a_kubeconfig_that_cannot_be_used_names_the_fix(tmp_path, document, message):
    path = write(tmp_path / "config", document)
    with pytest.raises(KubeconfigError, match=None) as raised:
        from_kubeconfig(str(path))
    assert message in str(raised.value)


def test_files_that_are_not_kubeconfigs(tmp_path):
    with pytest.raises(KubeconfigError, match="does not exist"):
        from_kubeconfig(str(tmp_path / "none"))
    (tmp_path / "list").write_text("- a\n- b\n")
    with pytest.raises(KubeconfigError, match="not a mapping"):
        from_kubeconfig(str(tmp_path / "list"))
    (tmp_path / "bad").write_text("a: [\n")
    with pytest.raises(KubeconfigError, match="is not YAML"):
        from_kubeconfig(str(tmp_path / "bad"))
    with pytest.raises(KubeconfigError, match="no kubeconfig found"):
        from_kubeconfig(environ={"KUBECONFIG": str(tmp_path / "none")})


def test_a_huge_file_is_refused_without_being_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(kubeconfig, "MAX_FILE_BYTES", 1000)
    (tmp_path / "big").write_text("#" * 5000)
    with pytest.raises(KubeconfigError, match="larger than 1000 bytes"):
        from_kubeconfig(str(tmp_path / "big"))


# -- in a pod ------------------------------------------------------------------------------------

def test_in_cluster_reads_the_rotated_token_again(tmp_path, certs):
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_bytes(certs["ca"].read_bytes())
    (tmp_path / "namespace").write_text("gpu-scheduler")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    got = in_cluster(str(tmp_path), env)
    assert got.host == "https://[fd00::1]:443" and got.namespace == "gpu-scheduler"
    assert got.credentials.headers() == {"Authorization": "Bearer first"}
    (tmp_path / "token").write_text("second")
    assert got.credentials.headers() == {"Authorization": "Bearer second"}
    (tmp_path / "token").unlink()  # mid-rotation: the last token stands
    assert got.credentials.headers() == {"Authorization": "Bearer second"}


def test_in_cluster_without_the_token_names_the_fix(tmp_path):
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeconfigError, match="automountServiceAccountToken"):
        in_cluster(str(tmp_path), env)
    with pytest.raises(KubeconfigError, match="not in a pod"):
        in_cluster(str(tmp_path), {})


def test_load_configuration_in_a_pod_without_its_token_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr(kubeconfig, "IN_CLUSTER_DIR", str(tmp_path))
    with pytest.raises(KubeconfigError, match="automountServiceAccountToken"):
        load_configuration()


# -- an exec credential plugin, run for real -----------------------------------------------------

PLUGIN = r'''#!{python}
import json, os, sys, time
calls = {count!r}
with open(calls, "a") as f:
    f.write("x")
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
runs = len(open(calls).read())
if os.environ.get("PLUGIN_FAIL"):
    print("no credentials for you", file=sys.stderr)
    sys.exit(3)
expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + float(os.environ["PLUGIN_TTL"])))
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {{"token": f"tok-{{runs}}-{{sys.argv[1]}}-{{info['spec'].get('cluster', {{}}).get('server')}}",
                             "expirationTimestamp": expires}}}}))
'''


def plugin_config(tmp_path: Path, ttl: float, fail: bool = False) -> tuple[Path, Path]:
    count = tmp_path / "calls"
    script = tmp_path / "bin" / "plugin"
    script.parent.mkdir(exist_ok=True)
    script.write_text(PLUGIN.format(python=sys.executable, count=str(count)))
    script.chmod(0o755)
    env = [{"name": "PLUGIN_TTL", "value": str(ttl)}] + ([{"name": "PLUGIN_FAIL", "value": "1"}] if fail else [])
    path = write(tmp_path / "config", config_of(
        [("x", "c", "u", "")], {"c": {"server": "https://h:6443"}},
        {"u": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/plugin", "args": ["arg"],
                        "env": env, "provideClusterInfo": True, "interactiveMode": "Never"}}}, current="x"))
    return path, count


def test_an_exec_plugin_token_is_cached_until_it_expires_as_the_package_reads_it(tmp_path):
    path, count = plugin_config(tmp_path, ttl=3600)
    ours = from_kubeconfig(str(path))
    assert isinstance(ours.credentials, ExecCredential)
    assert ours.credentials.headers() == {"Authorization": "Bearer tok-1-arg-https://h:6443"}
    assert ours.credentials.headers() == {"Authorization": "Bearer tok-1-arg-https://h:6443"}
    assert count.read_text() == "x"
    ours.credentials.invalidate()  # a 401
    assert ours.credentials.headers() == {"Authorization": "Bearer tok-2-arg-https://h:6443"}
    theirs = package_load(str(path))
    assert theirs.api_key["BearerToken"] == "Bearer tok-3-arg-https://h:6443"


def test_an_expired_exec_token_is_fetched_again(tmp_path):
    path, count = plugin_config(tmp_path, ttl=1)  # inside the margin: expired at once
    credentials = from_kubeconfig(str(path)).credentials
    credentials.headers()
    credentials.headers()
    assert count.read_text() == "xx"


def test_a_failing_or_missing_or_silent_exec_plugin_names_itself(tmp_path, monkeypatch):
    path, _ = plugin_config(tmp_path, ttl=60, fail=True)
    with pytest.raises(KubeconfigError, match="exited 3: no credentials for you"):
        from_kubeconfig(str(path)).credentials.headers()
    missing = ExecCredential("client.authentication.k8s.io/v1", ["no-such-plugin-here"], {}, None)
    with pytest.raises(KubeconfigError, match="was not found: install it"):
        missing.headers()
    monkeypatch.setattr(kubeconfig, "EXEC_TIMEOUT_SECONDS", 0.5)
    silent = ExecCredential("client.authentication.k8s.io/v1", ["sleep", "5"], {}, None)
    started = time.monotonic()
    with pytest.raises(KubeconfigError, match="gave no answer"):
        silent.headers()
    assert time.monotonic() - started < 4
    wrong = ExecCredential("client.authentication.k8s.io/v1", ["echo", '{"apiVersion": "v1", "status": {}}'], {}, None)
    with pytest.raises(KubeconfigError, match="answered in 'v1'"):
        wrong.headers()


# -- over real TLS -------------------------------------------------------------------------------

class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None, str | None]] = []

    def do_GET(self):
        peer = self.connection.getpeercert() or {}
        subject = dict(item for group in peer.get("subject", ()) for item in group).get("commonName")
        Recorder.seen.append((self.path.split("?")[0], self.headers.get("Authorization"), subject))
        status = 401 if self.headers.get("Authorization") == "Bearer stale" else 200
        body = b'{"gitVersion": "v1.37.2"}' if "watch" not in self.path else b'{"type":"ADDED","object":{}}\n'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_server(certs):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs["ca"]))
    context.load_cert_chain(str(certs["server"][1]), str(certs["server"][0]))
    context.verify_mode = ssl.CERT_OPTIONAL
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    Recorder.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_calls_and_watches_present_the_inline_client_certificate_and_check_the_server(tls_server, certs, tmp_path):
    path = write(tmp_path / "config", config_of(
        [("x", "c", "u", "")], {"c": {"server": tls_server, "certificate-authority-data": b64(certs["ca"]),
                                      "tls-server-name": "api.internal"}},
        {"u": {"client-certificate-data": b64(certs["client"][1]), "client-key-data": b64(certs["client"][0]),
               "token": "t"}}, current="x"))
    api = Kube(from_kubeconfig(str(path)))
    assert api.server_version()["gitVersion"] == "v1.37.2"  # kubeapi/transport.py
    assert [kind for kind, _, _ in api.watch("/api/v1/pods", "1", 5)] == ["ADDED"]  # urllib3
    assert Recorder.seen == [("/version", "Bearer t", "alice"), ("/api/v1/pods", "Bearer t", "alice")]


def test_a_server_name_the_certificate_does_not_carry_is_refused(tls_server, certs, tmp_path):
    path = write(tmp_path / "config", config_of(
        [("x", "c", "u", "")], {"c": {"server": tls_server, "certificate-authority": str(certs["ca"]),
                                      "tls-server-name": "someone.else"}}, {"u": {"token": "t"}}, current="x"))
    api = Kube(from_kubeconfig(str(path)))
    with pytest.raises(APIError) as raised:
        api.server_version()
    assert raised.value.status == 0 and Recorder.seen == []
    insecure = Kube(ClusterConfig(host=tls_server, verify=False, credentials=StaticToken("t")))
    assert insecure.server_version()["gitVersion"] == "v1.37.2"


def test_a_401_asks_the_credentials_again(tls_server, certs):
    class Rotating(TokenFile):
        def __init__(self):
            self.tokens = ["stale", "fresh"]
            self.invalidated = 0

        def headers(self):
            return {"Authorization": f"Bearer {self.tokens[0]}"}

        def invalidate(self):
            self.invalidated += 1
            self.tokens.pop(0)

    credentials = Rotating()
    api = Kube(ClusterConfig(host=tls_server, ca_file=str(certs["ca"]), credentials=credentials))
    with pytest.raises(APIError) as raised:
        api.server_version()
    assert raised.value.status == 401 and credentials.invalidated == 1
    assert api.server_version()["gitVersion"] == "v1.37.2"  # not after AUTH_REFRESH_SECONDS: at once


def test_an_unreadable_certificate_authority_is_a_configuration_error(tmp_path):
    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(KubeconfigError, match="cannot be read as PEM"):
        Kube(ClusterConfig(host="https://h:6443", ca_file=str(tmp_path / "ca.crt")))


# -- proxies -------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["https://10.1.2.3:6443", "https://api.corp.example:443", "https://corp.example",
                                 "https://[fd00::5]:6443", "https://other.example:6443", "https://h:6443"])
@pytest.mark.parametrize("no_proxy", ["", "*", "10.0.0.0/8", ".corp.example", "corp.example", "fd00::/8",
                                      "h:6443", "api.corp.example:443, other.example", "10.1.2.3"])
def test_no_proxy_rules_as_the_package_decides(url, no_proxy):
    assert bypasses_proxy(url, no_proxy) == should_bypass_proxies(url, no_proxy)


def test_the_proxy_of_the_cluster_or_the_environment(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert ClusterConfig(host="https://h:6443").proxy_for_host() == "http://proxy:3128"
    assert ClusterConfig(host="https://h:6443", no_proxy="h").proxy_for_host() is None
    assert ClusterConfig(host="https://h:6443", proxy_url="http://p:1").proxy_for_host() == "http://p:1"
    assert Kube(ClusterConfig(host="https://h:6443")).transport is None  # through urllib3's ProxyManager


# -- what the shells import ----------------------------------------------------------------------

@pytest.mark.parametrize("imports", [
    "sys.path[:0] = ['functions/bind']; import main",
    "sys.path[:0] = ['functions/mutate']; import main",
    "import kubectl_gpu_scheduler.cli as c, kubeapi.client as k; k.load_kubectl_configuration",
])
def test_the_shells_do_not_import_the_kubernetes_package(imports, unreachable_kubeconfig):
    code = f"import sys; {imports}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECONFIG": str(unreachable_kubeconfig), "LOG_LEVEL": "ERROR"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
