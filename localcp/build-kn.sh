#!/usr/bin/env bash
# Builds kn, Knative's CLI (knative.dev/client at GPU_SCHEDULER_KN, localcp/versions.env), once,
# into a cache outside the repo keyed by version; exits at once when it is there. v0.42.0 (kn 1.15)
# is the last release built from one module: later ones need knative.dev/client/pkg, which the
# module proxy does not serve. From a small generated module that requires it, with upstream's
# go.sum; stamped through the ldflags of upstream's hack/build-flags.sh (pkg/kn/commands/version),
# so `kn version` tells. Static, about 2 minutes on 2 cores, once.
#   bash localcp/build-kn.sh          build (or find) it
#   bash localcp/build-kn.sh --path   print where it is (built or not)
# Modules come through the machine's own Go proxy configuration, without its `direct` fallback
# (localcp/gomodule.sh).
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
# shellcheck source=localcp/gomodule.sh
source "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh"
: "${GPU_SCHEDULER_KN:?}"
MODULE=knative.dev/client

cached_program kn "$GPU_SCHEDULER_KN" "${1:-}"

start=$SECONDS
own_module "$DIR" kn "$MODULE" "$GPU_SCHEDULER_KN"
# Knative numbers its releases 1.N where its Go modules say v0.(N+27): kn 1.15 is client v0.42.0.
# Stamped as upstream's hack/build-flags.sh stamps a release (the date quoted: it has a space).
minor=${GPU_SCHEDULER_KN#v0.}; patch=${minor#*.}; minor=${minor%%.*}
release="v1.$((minor - 27)).$patch"
pkg="$MODULE/pkg/kn/commands/version"
ldflags="-s -w -X $pkg.Version=$release -X '$pkg.BuildDate=$(date -u '+%Y-%m-%d %H:%M:%S')'"
log "$GPU_SCHEDULER_KN (kn $release): go build $MODULE/cmd/kn (about 2 minutes on 2 cores, once)"
build_into "$BIN" "$MODULE/cmd/kn" "$ldflags"
cd / && rm -rf "$DIR/module"
log "$("$BIN" version | head -1) in $((SECONDS - start))s: $BIN"
