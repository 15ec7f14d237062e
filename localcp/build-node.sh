#!/usr/bin/env bash
# Builds what a real node of the local stack runs (localcp/nodes.py), once, into a cache outside
# the repo keyed by Debian suite; exits at once when it is there. Called by localcp/build.sh.
#   - containerd 1.6, runc 1.1 and the CNI plugins (ptp, host-local, loopback) from Debian
#     bookworm's containerd, runc and containernetworking-plugins, unpacked with dpkg -x through a
#     private apt state: nothing is installed, no service unit or /etc/containerd is written.
#   - The check image's base: a Debian bookworm root filesystem with python3-minimal, made by
#     Debian's mmdebstrap (also only unpacked, run from the cache) as a tar. localcp/images.py
#     layers check/check.py on it as Dockerfile.check says.
set -euo pipefail
SUITE=bookworm
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
NODE_DIR="$CACHE/node-$SUITE"
BINARIES=(bin/containerd bin/containerd-shim-runc-v2 bin/ctr bin/runc cni/ptp cni/host-local cni/loopback)
ROOTFS="$NODE_DIR/rootfs-python3-minimal.tar"

log() { echo "nodes: $*"; }
have_node() { for b in "${BINARIES[@]}"; do [ -x "$NODE_DIR/$b" ] || return 1; done; [ -s "$ROOTFS" ]; }
if have_node; then log "cached: $NODE_DIR"; exit 0; fi

for tool in apt-get dpkg perl; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done
# shellcheck source=localcp/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian.sh"

start=$SECONDS
fetch="$NODE_DIR/fetch"
rm -rf "$NODE_DIR"; mkdir -p "$NODE_DIR/bin" "$NODE_DIR/cni"
log "containerd, runc, CNI plugins and mmdebstrap from Debian $SUITE (private apt state in $fetch)"
debian_unpack "$SUITE" "$fetch" containerd runc containernetworking-plugins mmdebstrap
root="$fetch/root"
cp "$root/usr/bin/containerd" "$root/usr/bin/containerd-shim-runc-v2" "$root/usr/bin/ctr" \
   "$root/usr/sbin/runc" "$NODE_DIR/bin/"
cp "$root/usr/lib/cni/ptp" "$root/usr/lib/cni/host-local" "$root/usr/lib/cni/loopback" "$NODE_DIR/cni/"
log "$("$NODE_DIR/bin/containerd" --version), $("$NODE_DIR/bin/runc" --version | head -1) in $((SECONDS - start))s"

# extract: the packages and their dependencies unpacked, no maintainer scripts, no chroot; python
# runs from it as it is (44 MB instead of the essential variant's 164 MB).
log "check image base: mmdebstrap --variant=extract --include=python3-minimal $SUITE"
PATH=/usr/sbin:/usr/bin:/sbin:/bin perl "$root/usr/bin/mmdebstrap" --quiet --variant=extract \
  --include=python3-minimal --mode=root --format=tar "$SUITE" "$ROOTFS.part" "$(debian_source "$SUITE")"
mv "$ROOTFS.part" "$ROOTFS"
rm -rf "$fetch"
have_node || { log "the build finished without every piece in $NODE_DIR"; exit 1; }
log "built in $((SECONDS - start))s into $NODE_DIR"
