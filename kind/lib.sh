# shellcheck shell=bash disable=SC2034  # variables here are used by the scripts that source this
# Shared by kind/*.sh: settings, messages and prerequisite checks. Source it; do not run it.
# Every setting can be overridden from the environment (kind/kind.mk exports its variables).

KIND_CLUSTER="${KIND_CLUSTER:-gpu-scheduler}"
NAMESPACE="${NAMESPACE:-gpu-scheduler}"
RELEASE="${RELEASE:-gpu-scheduler}"   # the Helm release, and the webhook configuration's name
# One Knative release train, v1.21: each repository's newest v1.21 patch that the offline tests
# validate against (tests/fixtures/k8s-schemas/README.md: Serving knative-v1.21.3, Eventing
# knative-v1.21.4). Knative tags patch releases per repository, so the numbers differ.
SERVING_VERSION="${SERVING_VERSION:-knative-v1.21.3}"
KOURIER_VERSION="${KOURIER_VERSION:-knative-v1.21.0}"
EVENTING_VERSION="${EVENTING_VERSION:-knative-v1.21.4}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.21.1}"
BIND_IMAGE="${BIND_IMAGE:-kind.local/gpu-scheduler-bind:dev}"
MUTATE_IMAGE="${MUTATE_IMAGE:-kind.local/gpu-scheduler-mutate:dev}"
CHECK_IMAGE="${CHECK_IMAGE:-kind.local/gpu-scheduler-check:latest}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# helm: the one on PATH, else the one `make controlplane` built (localcp/build-helm.sh).
if ! command -v helm >/dev/null 2>&1; then
  built_helm="$(bash "$REPO_ROOT/localcp/build-helm.sh" --path)"
  [ ! -x "$built_helm" ] || PATH="$(dirname "$built_helm"):$PATH"
fi
KUBE_CONTEXT="kind-${KIND_CLUSTER}"
CONTROL_PLANE="${KIND_CLUSTER}-control-plane"   # the node container's name

step() { printf '\n==> %s\n' "$*"; }
ok() { printf '    ok: %s\n' "$*"; }
die() { printf '\nERROR: %s\n' "$*" >&2; exit 1; }

# kubectl against this cluster only, whatever the current context is.
k() { kubectl --context "$KUBE_CONTEXT" "$@"; }

# version_ge A B: true when dotted version A >= B (leading v and suffixes ignored).
version_ge() {
  local a b
  a="$(printf '%s' "$1" | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1)"
  b="$(printf '%s' "$2" | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1)"
  [ -n "$a" ] || return 1
  [ "$(printf '%s\n%s\n' "$b" "$a" | sort -V | head -n1)" = "$b" ]
}

# tool_version TOOL: the tool's own version string.
tool_version() {
  case "$1" in
    docker) docker version --format '{{.Server.Version}}' 2>/dev/null ;;
    kind) kind version -q 2>/dev/null || kind version 2>/dev/null ;;
    kubectl) kubectl version --client -o json 2>/dev/null | grep -m1 '"gitVersion"' ;;
    kn) kn version 2>/dev/null | grep -m1 -i 'version' ;;
    func) func version 2>/dev/null | head -n1 ;;
    helm) helm version --short 2>/dev/null ;;
    python3) python3 --version 2>&1 ;;
    *) "$1" --version 2>/dev/null | head -n1 ;;
  esac
}

# Minimum versions: the node image digest in kind/cluster.yaml was built by kind v0.30.0;
# kubectl within one minor of the cluster's 1.34; kn and func from the same Knative train;
# helm 3.14 or newer (the tests use the v3.22.0 localcp/build-helm.sh builds).
min_version() {
  case "$1" in
    docker) echo 20.10.0 ;;
    kind) echo 0.30.0 ;;
    kubectl) echo 1.33.0 ;;
    kn) echo 1.21.0 ;;
    func) echo 1.21.0 ;;
    helm) echo 3.14.0 ;;
    python3) echo 3.9.0 ;;
    *) echo 0 ;;
  esac
}

# require TOOL...: each tool is installed, answers, and is new enough; else stop with a hint.
require() {
  local tool version
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (need >= $(min_version "$tool")); see docs/kind.md, Prerequisites"
    version="$(tool_version "$tool")" || true
    if [ "$tool" = docker ] && [ -z "$version" ]; then
      die "docker is installed but the daemon does not answer: start Docker (docker info shows why)"
    fi
    version_ge "$version" "$(min_version "$tool")" \
      || die "$tool ${version:-(version unknown)} is too old or unreadable: need >= $(min_version "$tool")"
    ok "$tool $(printf '%s' "$version" | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1)"
  done
}

# The cluster exists and kubectl reaches it.
require_cluster() {
  kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER" \
    || die "no kind cluster '$KIND_CLUSTER': run 'make kind-up' first"
  k get --raw=/readyz >/dev/null 2>&1 \
    || die "the API server of '$KIND_CLUSTER' does not answer (context $KUBE_CONTEXT)"
}

# wait_until SECONDS DESCRIPTION COMMAND...: retry COMMAND every 3 s; fail with DESCRIPTION.
wait_until() {
  local timeout="$1" what="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${timeout}s waiting for: $what"
    sleep 3
  done
}

# retry ATTEMPTS COMMAND...: for applies that race a webhook just started, or a download.
retry() {
  local attempts="$1" n=1; shift
  until "$@"; do
    [ "$n" -lt "$attempts" ] || return 1
    printf '    retrying in 10s (%d/%d): %s\n' "$n" "$attempts" "$*" >&2
    n=$((n + 1)); sleep 10
  done
}

# wait_deployments NAMESPACE: every Deployment there is Available.
wait_deployments() {
  k -n "$1" wait --for=condition=Available deployment --all --timeout=600s >/dev/null \
    || die "deployments in $1 did not become Available: kubectl --context $KUBE_CONTEXT -n $1 get pods"
  ok "deployments in $1 are Available"
}
