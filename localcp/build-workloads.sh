#!/usr/bin/env bash
# Builds the real workload controllers the local stack can run beside the control plane
# (localcp/workloads.py), once, into a cache outside the repo keyed by name and version; exits at
# once when they are there. Called by localcp/build.sh. Each one is its upstream Go module's main
# package, built from a small generated module of our own that requires it (the module proxy
# serves these versions but not their version lists, so `go install pkg@version` fails), with the
# upstream go.sum; beside the binary go its CRDs (config's bases, without the conversion patches)
# and its webhook directory (manifests.yaml, the kustomization and its patches: they add the pod
# webhooks' objectSelector), which localcp/workloads.py applies and registers by URL.
# The versions are settings (localcp/versions.env; GPU_SCHEDULER_JOBSET, GPU_SCHEDULER_LWS,
# GPU_SCHEDULER_KUEUE in the environment; `make JOBSET=v0.10.1 LWS=v0.7.0`), each built into its
# own directory beside the others. The paths inside the modules are the same in every version
# built here (jobset v0.10.1 and v0.11.1, lws v0.7.0 and v0.8.0, kueue v0.17.0):
#   - JobSet      sigs.k8s.io/jobset (default v0.11.1; main package: the module's root)
#   - LeaderWorkerSet  sigs.k8s.io/lws (default v0.8.0; sigs.k8s.io/lws/cmd)
#   - Kueue       sigs.k8s.io/kueue (default v0.17.0; sigs.k8s.io/kueue/cmd/kueue; its webhook
#                 directory has no patches directory, its kustomization's patches are inline)
#   bash localcp/build-workloads.sh [jobset|lws|kueue]...   build (or find) those named (default: all three)
#   bash localcp/build-workloads.sh --path    print the directory they go to (built or not):
#                                             <dir>/<name>-<version>/{bin/<name>-controller,crds,webhook}
# Modules come through the machine's own Go proxy configuration.
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
WORKLOADS="$CACHE/workloads"

if [ "${1:-}" = --path ]; then echo "$WORKLOADS"; exit 0; fi
log() { echo "workload controllers: $*"; }

# controller NAME MODULE VERSION MAIN_PACKAGE CRD_DIR WEBHOOK_FILE (the last two inside the module):
# builds $WORKLOADS/NAME-VERSION/bin/NAME-controller and copies the CRDs and the webhook file's
# directory beside it; nothing when the binary is there.
controller() {
  local name=$1 module=$2 version=$3 main=$4 crds=$5 webhook=$6
  local dir="$WORKLOADS/$name-$version" start=$SECONDS src
  local bin="$dir/bin/$name-controller"
  if [ -x "$bin" ]; then log "cached: $bin"; return 0; fi
  for tool in go python3; do
    command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
  done
  rm -rf "$dir"; mkdir -p "$dir/module" "$dir/bin"
  (
    cd "$dir/module"
    export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
    go mod init "gpu-scheduler.local/$name-build" >/dev/null 2>&1
    go mod edit -require="$module@$version"
    src=$(go mod download -json "$module@$version" |
      python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])')
    for path in "$crds" "$webhook" "$(dirname "$webhook")/kustomization.yaml"; do
      [ -e "$src/$path" ] || { log "$module $version has no $path (its layout changed: see this script's header)"; exit 1; }
    done
    # The upstream go.sum: every dependency at the version upstream tested, checked.
    cp "$src/go.sum" . && chmod u+w go.sum
    mkdir -p "$dir/crds" "$dir/webhook"
    cp "$src/$crds"/*.yaml "$dir/crds/"
    cp "$(dirname "$src/$webhook")"/*.yaml "$dir/webhook/"
    cp "$src/$webhook" "$dir/webhook/manifests.yaml"
    if [ -d "$(dirname "$src/$webhook")/patches" ]; then cp -r "$(dirname "$src/$webhook")/patches" "$dir/webhook/"; fi
    chmod -R u+w "$dir/crds" "$dir/webhook"
    log "$module $version: go build $main (a minute or two on 2 cores, once)"
    go build -trimpath -ldflags "-s -w" -o "$bin.tmp" "$main" 2>&1 | sed 's/^/  [go build] /'
  )
  rm -rf "$dir/module"
  mv "$bin.tmp" "$bin"
  log "$name $version built in $((SECONDS - start))s: $bin"
}

# (set by versions.sh)
: "${GPU_SCHEDULER_JOBSET:?}" "${GPU_SCHEDULER_LWS:?}" "${GPU_SCHEDULER_KUEUE:?}"
build() {
  case "$1" in
    jobset) controller jobset sigs.k8s.io/jobset "$GPU_SCHEDULER_JOBSET" sigs.k8s.io/jobset \
              config/components/crd/bases config/components/webhook/manifests.yaml ;;
    lws) controller lws sigs.k8s.io/lws "$GPU_SCHEDULER_LWS" sigs.k8s.io/lws/cmd \
           config/crd/bases config/webhook/manifests.yaml ;;
    kueue) controller kueue sigs.k8s.io/kueue "$GPU_SCHEDULER_KUEUE" sigs.k8s.io/kueue/cmd/kueue \
             config/components/crd/bases config/components/webhook/manifests.yaml ;;
    *) log "unknown controller $1 (jobset, lws, kueue)"; exit 2 ;;
  esac
}

if [ $# -eq 0 ]; then set -- jobset lws kueue; fi
for name in "$@"; do build "$name"; done
