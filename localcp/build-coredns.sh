#!/usr/bin/env bash
# Builds CoreDNS (the cluster DNS of the local stack, as kubeadm installs it: localcp/coredns.py)
# from its Go module github.com/coredns/coredns at the setting GPU_SCHEDULER_COREDNS
# (localcp/versions.env, default v1.15.0), once, into a cache outside the repo keyed by version;
# exits at once when it is there. The module's root is its main package, with the plugins of its
# plugin.cfg already generated into core/plugin. It is built from a small generated module of
# our own that requires it (the module proxy serves exact versions but not version lists, so
# `go install pkg@version` fails), with the upstream go.sum: every dependency at the version
# upstream tested, checked. Static (CGO_ENABLED=0), as upstream's release build.
#   bash localcp/build-coredns.sh           build (or find) it
#   bash localcp/build-coredns.sh --path    print where it is (built or not)
# Modules come through the machine's own Go proxy configuration.
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
: "${GPU_SCHEDULER_COREDNS:?}"  # (set by versions.sh)
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
DIR="$CACHE/coredns-$GPU_SCHEDULER_COREDNS"
COREDNS="$DIR/bin/coredns"
MODULE=github.com/coredns/coredns

if [ "${1:-}" = --path ]; then echo "$COREDNS"; exit 0; fi
log() { echo "coredns: $*"; }
if [ -x "$COREDNS" ]; then log "cached: $COREDNS"; exit 0; fi
for tool in go python3; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done

start=$SECONDS
rm -rf "$DIR"; mkdir -p "$DIR/module" "$DIR/bin"
(
  cd "$DIR/module"
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
  go mod init gpu-scheduler.local/coredns-build >/dev/null 2>&1
  go mod edit -require="$MODULE@$GPU_SCHEDULER_COREDNS"
  src=$(go mod download -json "$MODULE@$GPU_SCHEDULER_COREDNS" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])')
  cp "$src/go.sum" . && chmod u+w go.sum
  log "$MODULE $GPU_SCHEDULER_COREDNS: go build (a few minutes on 2 cores, once)"
  go build -trimpath -ldflags "-s -w" -o "$COREDNS.tmp" "$MODULE" 2>&1 | sed 's/^/  [go build] /'
)
rm -rf "$DIR/module"
mv "$COREDNS.tmp" "$COREDNS"
# `coredns -version`: CoreDNS-1.15.0, then platform, Go and git commit (empty: no -X GitCommit).
log "$("$COREDNS" -version | paste -sd ' ' | sed 's/[, ]*$//') in $((SECONDS - start))s: $COREDNS"
