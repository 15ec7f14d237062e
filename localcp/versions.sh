# shellcheck shell=bash
# Sourced by localcp/build*.sh: the version settings of localcp/versions.env, each overridden by
# the environment variable of the same name (GPU_SCHEDULER_K8S, GPU_SCHEDULER_JOBSET,
# GPU_SCHEDULER_LWS, GPU_SCHEDULER_KUEUE; `make K8S=...` and the like set them), exported so that
# the scripts each one calls read the same. localcp/versions.py reads them the same way.
# K8S_VERSION, when set, is the Kubernetes version of this one call (`K8S_VERSION=v1.33.13 bash
# localcp/build.sh`), before GPU_SCHEDULER_K8S.

_versions_env="$(dirname "${BASH_SOURCE[0]}")/versions.env"
while IFS='=' read -r _key _value || [ -n "$_key" ]; do
  case "$_key" in '' | \#*) continue ;; esac
  if [ -z "${!_key:-}" ]; then printf -v "$_key" '%s' "$_value"; fi
  export "${_key?}"
done <"$_versions_env"
unset _key _value _versions_env
K8S_VERSION="${K8S_VERSION:-$GPU_SCHEDULER_K8S}"
GPU_SCHEDULER_K8S="$K8S_VERSION"
export K8S_VERSION GPU_SCHEDULER_K8S

# version_check NAME VALUE PATTERN: exits with a message unless VALUE matches the extended regex.
version_check() {
  if ! [[ $2 =~ $3 ]]; then
    echo "$1=$2: not a version of the form ${4:-$3}" >&2
    exit 2
  fi
}
version_check GPU_SCHEDULER_K8S "$K8S_VERSION" '^v1\.[0-9]+\.[0-9]+$' v1.N.M
for _name in GPU_SCHEDULER_JOBSET GPU_SCHEDULER_LWS GPU_SCHEDULER_KUEUE GPU_SCHEDULER_COREDNS \
  GPU_SCHEDULER_KNATIVE_EVENTING GPU_SCHEDULER_KNATIVE_SERVING GPU_SCHEDULER_TRAEFIK GPU_SCHEDULER_KN \
  GPU_SCHEDULER_FUNC; do
  version_check "$_name" "${!_name}" '^v[0-9]+\.[0-9]+\.[0-9]+$' vX.Y.Z
done
unset _name

# k8s_minor [VERSION]: 37 for v1.37.2 (default: K8S_VERSION).
k8s_minor() {
  local v=${1:-$K8S_VERSION}
  v=${v#v1.}
  echo "${v%%.*}"
}

# k8s_dra_served [VERSION]: true from 1.34, where resource.k8s.io/v1 (DRA's GA API, the one bind,
# the stack and the tests use) is served by default. 1.33 serves only the beta, off by default.
k8s_dra_served() { [ "$(k8s_minor "${1:-}")" -ge 34 ]; }
