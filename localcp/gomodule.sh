# shellcheck shell=bash
# Sourced by localcp/build-traefik.sh, localcp/build-kn.sh and localcp/build-func.sh: a Go program
# built from a module of our own that requires the upstream one at an exact version (the module
# proxy serves exact versions, not version lists, so `go install pkg@version` fails), with
# upstream's go.sum.

# cached_program NAME VERSION [--path]: DIR (the cache's NAME-VERSION) and BIN (DIR/bin/NAME) set;
# with --path, BIN printed and the script ends; the script ends too when BIN is built already; go
# is required otherwise. Sets PROGRAM, which log's lines begin with.
cached_program() {
  PROGRAM=$1
  DIR="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}/$1-$2"
  BIN="$DIR/bin/$1"
  if [ "${3:-}" = --path ]; then echo "$BIN"; exit 0; fi
  if [ -x "$BIN" ]; then log "cached: $BIN"; exit 0; fi
  command -v go >/dev/null || { log "go is required"; exit 1; }
}

log() { echo "$PROGRAM: $*"; }

# own_module DIR NAME MODULE VERSION: DIR/module, a new module gpu-scheduler.local/NAME-build that
# requires MODULE@VERSION with its go.sum, made the current directory; sets SRC to the upstream
# module's directory in the module cache. Static builds, through the machine's Go proxy
# configuration without its `direct` fallback: a lookup the proxy refuses fails at once instead of
# trying the module's own download site.
own_module() {
  local dir=$1 name=$2 module=$3 version=$4
  rm -rf "$dir/module"; mkdir -p "$dir/module" "$dir/bin"
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
  GOPROXY="$(go env GOPROXY)"; GOPROXY="${GOPROXY%,direct}"; GOPROXY="${GOPROXY%|direct}"
  export GOPROXY
  cd "$dir/module" || return 1
  go mod init "gpu-scheduler.local/$name-build" >/dev/null 2>&1
  go mod edit -require="$module@$version"
  SRC=$(go mod download -json "$module@$version" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])')
  cp "$SRC/go.sum" . && chmod u+w go.sum
}

# build_into BIN PACKAGE LDFLAGS: go build PACKAGE to BIN (written whole or not at all), the
# module downloads left out of its output.
build_into() {
  go build -trimpath -ldflags "$3" -o "$1.tmp" "$2" 2>&1 | sed '/^go: downloading /d; s/^/  [go build] /'
  mv "$1.tmp" "$1"
}
