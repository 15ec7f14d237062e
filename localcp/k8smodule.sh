# Sourced by localcp/build.sh and localcp/build-dra.sh: a Go module of our own in the current
# directory that builds packages of k8s.io/kubernetes at a release.
# k8s.io/kubernetes' go.mod requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at
# v0.0.0 and replaces them with its own ./staging tree; outside the kubernetes repo we replace each
# of them with the published v0.N.M of release v1.N.M instead. Only versions that are exactly
# v0.0.0: k8s.io/utils and k8s.io/kube-openapi carry v0.0.0-<date>-<hash> pseudo-versions, which
# are real and have no v0.N.M. Modules come through the machine's own Go proxy configuration.

# k8s_build_module NAME VERSION: `go mod init gpu-scheduler.local/NAME`, requiring
# k8s.io/kubernetes@VERSION with its staging modules replaced.
k8s_build_module() {
  local name=$1 version=$2 upstream
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
  go mod init "gpu-scheduler.local/$name" >/dev/null 2>&1
  upstream=$(go mod download -json "k8s.io/kubernetes@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  go mod edit -require="k8s.io/kubernetes@$version"
  # Every requirement pinned at exactly v0.0.0 is a staging module: use its published release.
  local staging=${version/v1./v0.}
  go mod edit -json "$upstream" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Require") or []:
    if r["Version"] == "v0.0.0":
        print(r["Path"])' | while read -r path; do go mod edit -replace="$path=$path@$staging"; done
}

# k8s_ldflags VERSION: the flags of the release build that tell a binary its version
# (kubectl version, discovery).
k8s_ldflags() {
  local version=$1 minor v=k8s.io/component-base/version
  minor=${version#v1.}; minor=${minor%%.*}
  echo "-s -w -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
