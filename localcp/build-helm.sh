#!/usr/bin/env bash
# Builds helm (the chart in chart/gpu-scheduler is rendered, linted and installed with it) from
# its Go module helm.sh/helm/v3, once, into a cache outside the repo keyed by version; exits at
# once when it is there. Modules come through the machine's own Go proxy configuration.
#   bash localcp/build-helm.sh           build (or find) it
#   bash localcp/build-helm.sh --path    print where it is (built or not)
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
DIR="$CACHE/helm-$HELM_VERSION"
HELM="$DIR/bin/helm"

if [ "${1:-}" = --path ]; then echo "$HELM"; exit 0; fi
log() { echo "helm: $*"; }
if [ -x "$HELM" ]; then log "cached: $HELM"; exit 0; fi
command -v go >/dev/null || { log "go is required"; exit 1; }

start=$SECONDS
rm -rf "$DIR/module"; mkdir -p "$DIR/module" "$DIR/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
cd "$DIR/module"
# A module of our own that requires helm's (whose go.mod replaces nothing): the versions of
# every dependency are helm's own.
go mod init gpu-scheduler.local/helm-build >/dev/null 2>&1
go mod edit -require="helm.sh/helm/v3@$HELM_VERSION"
go mod download helm.sh/helm/v3
# The flags of helm's Makefile: `helm version` tells the version, and `helm template` and `helm
# lint` assume the Kubernetes version of the client-go helm is built with (k8s.io/client-go
# v0.N is Kubernetes 1.N) instead of 1.20: Chart.yaml's kubeVersion needs >= 1.30.
client_go="$(go list -m -f '{{.Version}}' k8s.io/client-go)"
minor="$(echo "$client_go" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done
log "$HELM_VERSION (client-go $client_go): go build (a few minutes on 2 cores, once)"
go build -trimpath -ldflags "$ldflags" -o "$HELM.tmp" helm.sh/helm/v3/cmd/helm 2>&1 | sed 's/^/  [go build] /'
mv "$HELM.tmp" "$HELM"
log "$("$HELM" version --short) in $((SECONDS - start))s: $HELM"
