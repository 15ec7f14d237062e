#!/usr/bin/env bash
# Builds Knative Eventing and Serving (the first step toward running them on the local stack),
# once, into a cache outside the repo keyed by project and version; exits at once when they are
# there. Each project is its upstream Go module at the setting of localcp/versions.env
# (GPU_SCHEDULER_KNATIVE_EVENTING, GPU_SCHEDULER_KNATIVE_SERVING; default v0.50.0 each), built from
# a small generated module of its own that requires it (the module proxy serves exact versions but
# not version lists, so `go install pkg@version` fails), with the upstream go.sum: every
# dependency (knative.dev/pkg, and serving's knative.dev/networking and knative.dev/caching) at the
# version upstream pins and tested, checked. One module per project: their dependency versions
# differ. Static (CGO_ENABLED=0), as upstream's ko builds them.
#
# Into $CACHE/knative-<project>-<version>/ go:
#   bin/<cmd>   the main packages knative.dev/<project>/cmd/<cmd> (what the release configuration's
#               ko://knative.dev/<project>/cmd/<cmd> images run):
#                 eventing: controller webhook apiserver_receive_adapter mtping jobsink
#                           requestreply auth_proxy (the last three: what config/core's job-sink and
#                           request-reply Deployments and the controller's AUTH_PROXY_IMAGE name)
#                 serving:  controller webhook activator autoscaler queue
#   config/     the release configuration, copied out of the module cache (YAML only: the
#               placeholder.go files that let `go mod vendor` carry it are left out):
#     core/     the module's config/core, recursively (namespace, service accounts, configmaps,
#               roles, CRDs, webhooks, deployments). Upstream's git keeps some of its files as
#               symlinks, which module zips leave out; they are put back from where they point:
#                 eventing: core/configmaps/eventing-integrations-images.yaml and
#                           eventing-transformations-images.yaml, from the module's
#                           third_party/eventing-integrations-latest/ (the ConfigMaps the
#                           controller's Deployment reads images from)
#     networking/  serving only: knative.dev/networking's config/*.yaml at the version serving's
#                  go.mod pins (the Certificate, Ingress, ServerlessService, ClusterDomainClaim
#                  CRDs and the config-network ConfigMap)
#     caching/     serving only: knative.dev/caching's config/image.yaml (the Image CRD) likewise
#     modules.txt  module@version of each directory above
# Each piece (a project's binaries, its configuration) is skipped when it is there.
#   bash localcp/build-knative.sh [eventing|serving]...  build (or find) those named (default: both)
#   bash localcp/build-knative.sh --path   print their directories (built or not), eventing's then serving's
# Modules come through the machine's own Go proxy configuration.
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
: "${GPU_SCHEDULER_KNATIVE_EVENTING:?}" "${GPU_SCHEDULER_KNATIVE_SERVING:?}"  # (set by versions.sh)
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
EVENTING_DIR="$CACHE/knative-eventing-$GPU_SCHEDULER_KNATIVE_EVENTING"
SERVING_DIR="$CACHE/knative-serving-$GPU_SCHEDULER_KNATIVE_SERVING"
EVENTING_CMDS=(controller webhook apiserver_receive_adapter mtping jobsink requestreply auth_proxy)
SERVING_CMDS=(controller webhook activator autoscaler queue)

if [ "${1:-}" = --path ]; then printf '%s\n' "$EVENTING_DIR" "$SERVING_DIR"; exit 0; fi
log() { echo "knative: $*"; }

# module_dir MODULE[@VERSION]: the module's directory in the module cache, downloaded if need be
# (without a version: the version of the current module's build list).
module_dir() {
  go mod download -json "$1" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])'
}

# copy_yaml FROM TO: FROM's *.yaml, recursively, into TO (made writable: the module cache is not).
copy_yaml() {
  mkdir -p "$2"
  (cd "$1" && find . -name '*.yaml' -print0) | (cd "$1" && xargs -0 cp --parents -t "$2")
  chmod -R u+w "$2"
}

# config PROJECT SRC DIR: DIR/config from the module at SRC (the generated module is the current
# directory, for serving's dependencies' versions).
config() {
  local project=$1 src=$2 dir=$3 tmp="$3/config.tmp" module
  rm -rf "$tmp"
  copy_yaml "$src/config/core" "$tmp/core"
  echo "knative.dev/$project@${src##*@} config/core -> core/" >"$tmp/modules.txt"
  case "$project" in
    eventing)
      local third_party="$src/third_party/eventing-integrations-latest" name
      for name in eventing-integrations-images eventing-transformations-images; do
        [ -f "$third_party/$name.yaml" ] || { log "$src has no third_party/eventing-integrations-latest/$name.yaml"; exit 1; }
        cp "$third_party/$name.yaml" "$tmp/core/configmaps/$name.yaml"
        echo "knative.dev/$project@${src##*@} third_party/eventing-integrations-latest/$name.yaml -> core/configmaps/" >>"$tmp/modules.txt"
      done
      chmod -R u+w "$tmp/core/configmaps" ;;
    serving)
      for module in networking caching; do
        local dep
        dep=$(module_dir "knative.dev/$module")
        if [ "$module" = caching ]; then
          mkdir -p "$tmp/caching" && cp "$dep/config/image.yaml" "$tmp/caching/" && chmod u+w "$tmp/caching/image.yaml"
          echo "knative.dev/$module@${dep##*@} config/image.yaml -> caching/" >>"$tmp/modules.txt"
        else
          mkdir -p "$tmp/networking" && cp "$dep/config/"*.yaml "$tmp/networking/" && chmod -R u+w "$tmp/networking"
          echo "knative.dev/$module@${dep##*@} config/*.yaml -> networking/" >>"$tmp/modules.txt"
        fi
      done ;;
  esac
  mv "$tmp" "$dir/config"
}

# project NAME VERSION CMD...: builds (or finds) $CACHE/knative-NAME-VERSION/{bin,config}.
project() {
  local name=$1 version=$2; shift 2
  local module="knative.dev/$name" dir="$CACHE/knative-$name-$version" missing=() cmd
  for cmd in "$@"; do [ -x "$dir/bin/$cmd" ] || missing+=("$cmd"); done
  if [ ${#missing[@]} -eq 0 ]; then log "cached: $name $version binaries in $dir/bin"; fi
  if [ -d "$dir/config" ]; then log "cached: $name $version configuration in $dir/config"; fi
  if [ ${#missing[@]} -eq 0 ] && [ -d "$dir/config" ]; then return 0; fi
  for tool in go python3; do
    command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
  done
  rm -rf "$dir/module" "$dir/bin.tmp"; mkdir -p "$dir/module" "$dir/bin"
  (
    cd "$dir/module"
    export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
    go mod init "gpu-scheduler.local/knative-$name-build" >/dev/null 2>&1
    go mod edit -require="$module@$version"
    local src start=$SECONDS
    src=$(module_dir "$module@$version")
    # The upstream go.sum: every dependency at the version upstream tested, checked.
    cp "$src/go.sum" . && chmod u+w go.sum
    if [ ! -d "$dir/config" ]; then
      config "$name" "$src" "$dir"
      log "$name $version configuration copied in $((SECONDS - start))s: $dir/config ($(find "$dir/config" -name '*.yaml' | wc -l) files)"
    fi
    if [ ${#missing[@]} -gt 0 ]; then
      start=$SECONDS
      local packages=("${missing[@]/#/$module/cmd/}")
      log "$module $version: go build ${missing[*]} (a minute or two on 2 cores, once)"
      mkdir -p "$dir/bin.tmp"
      go build -trimpath -ldflags "-s -w" -o "$dir/bin.tmp/" "${packages[@]}" 2>&1 | sed 's/^/  [go build] /'
      for cmd in "${missing[@]}"; do mv "$dir/bin.tmp/$cmd" "$dir/bin/$cmd"; done
      log "$name $version binaries built in $((SECONDS - start))s: $dir/bin (${missing[*]})"
    fi
  )
  rm -rf "$dir/module" "$dir/bin.tmp"
}

build() {
  case "$1" in
    eventing) project eventing "$GPU_SCHEDULER_KNATIVE_EVENTING" "${EVENTING_CMDS[@]}" ;;
    serving) project serving "$GPU_SCHEDULER_KNATIVE_SERVING" "${SERVING_CMDS[@]}" ;;
    *) log "unknown project $1 (eventing, serving)"; exit 2 ;;
  esac
}

if [ $# -eq 0 ]; then set -- eventing serving; fi
for name in "$@"; do build "$name"; done
