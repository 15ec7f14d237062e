#!/usr/bin/env bash
# Builds Traefik Proxy, the local stack's Knative networking layer (its Knative provider turns
# KIngress objects into routes: localcp/traefik.py), once, into a cache outside the repo keyed by
# version; exits at once when it is there.
#   - github.com/traefik/traefik/v3 at GPU_SCHEDULER_TRAEFIK (localcp/versions.env), cmd/traefik,
#     from a small generated module that requires it, with upstream's go.sum.
#   - Traefik's go.mod replaces three modules with forks of its own; a dependency's replaces are not
#     honoured, so its replace lines are copied into the build module (read from its go.mod, not
#     written here: a new version brings its own).
#   - v3.7 does not build: its nested module github.com/traefik/traefik/dynamic/ext is not served.
#   - Stamped as upstream's Makefile stamps it (pkg/version.Version), so `traefik version` tells.
#   - Static (CGO_ENABLED=0), about 12-15 minutes on 2 cores, once. The module carries no built web
#     UI: it runs without --api (localcp/traefik.py).
#   bash localcp/build-traefik.sh          build (or find) it
#   bash localcp/build-traefik.sh --path   print where it is (built or not)
# Modules come through the machine's own Go proxy configuration, without its `direct` fallback
# (localcp/gomodule.sh).
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
# shellcheck source=localcp/gomodule.sh
source "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh"
: "${GPU_SCHEDULER_TRAEFIK:?}"
MODULE=github.com/traefik/traefik/v3

cached_program traefik "$GPU_SCHEDULER_TRAEFIK" "${1:-}"

start=$SECONDS
own_module "$DIR" traefik "$MODULE" "$GPU_SCHEDULER_TRAEFIK"
# Upstream's replace directives, each as `go mod edit` takes it.
go mod edit -json "$SRC/go.mod" |
  python3 -c 'import json,sys
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"], r["New"]
    lhs = old["Path"] + ("@" + old["Version"] if old.get("Version") else "")
    rhs = new["Path"] + ("@" + new["Version"] if new.get("Version") else "")
    print(f"-replace={lhs}={rhs}")' | xargs -r go mod edit
ldflags="-s -w -X $MODULE/pkg/version.Version=$GPU_SCHEDULER_TRAEFIK"
ldflags+=" -X $MODULE/pkg/version.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
log "$GPU_SCHEDULER_TRAEFIK: go build $MODULE/cmd/traefik (12-15 minutes on 2 cores, once)"
build_into "$BIN" "$MODULE/cmd/traefik" "$ldflags"
cd / && rm -rf "$DIR/module"
log "$("$BIN" version | awk '/^Version:/ {print $2}') in $((SECONDS - start))s: $BIN"
