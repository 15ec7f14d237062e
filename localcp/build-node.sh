#!/usr/bin/env bash
# Builds what a real node of the local stack runs (localcp/nodes.py), once, into a cache outside
# the repo keyed by Debian suite; exits at once when it is there. Called by localcp/build.sh.
#   - containerd 1.7 (containerd, its runc shim and ctr) from Debian trixie's containerd: 1.7 is
#     the first with CDI (enable_cdi), through which the DRA driver of the real nodes injects its
#     devices (bookworm's is 1.6). Go binaries linked against glibc 2.34 at most: they run on
#     bookworm.
#   - runc 1.1 and the CNI plugins (ptp, host-local, loopback) from Debian bookworm's runc and
#     containernetworking-plugins (trixie's runc needs glibc 2.38; bookworm has 2.36).
#   All unpacked with dpkg -x through a private apt state: nothing is installed, no service unit
#   or /etc/containerd is written.
#   - The images' base, the stand-in for their FROM python:3.11.x-slim-bookworm: a Debian bookworm
#     root filesystem with python3, dash (the /bin/sh that RUN runs) and python3-venv (the venv and ensurepip modules, with Debian's
#     pip and setuptools wheels, which Dockerfile.bind and Dockerfile.mutate's `python -m venv`
#     needs), made by Debian's mmdebstrap (also only unpacked, run from the cache) as a tar.
#     localcp/images.py applies Dockerfile.check, .bind and .mutate to it.
# Each piece is built when it is missing, independently of the other.
set -euo pipefail
SUITE=bookworm
CONTAINERD_SUITE=trixie
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
NODE_DIR="$CACHE/node-$SUITE"
CONTAINERD_DIR="$CACHE/containerd-$CONTAINERD_SUITE"
BINARIES=(bin/runc cni/ptp cni/host-local cni/loopback)
CONTAINERD_BINARIES=(containerd containerd-shim-runc-v2 ctr)
ROOTFS="$NODE_DIR/rootfs-python3.tar"

log() { echo "nodes: $*"; }
have_binaries() { for b in "${BINARIES[@]}"; do [ -x "$NODE_DIR/$b" ] || return 1; done; }
have_node() { have_binaries && [ -s "$ROOTFS" ]; }
have_containerd() { for b in "${CONTAINERD_BINARIES[@]}"; do [ -x "$CONTAINERD_DIR/bin/$b" ] || return 1; done; }
if have_node && have_containerd; then log "cached: $NODE_DIR, $CONTAINERD_DIR"; exit 0; fi

for tool in apt-get dpkg perl; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done
# shellcheck source=localcp/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian.sh"

if ! have_containerd; then
  start=$SECONDS
  log "containerd from Debian $CONTAINERD_SUITE (private apt state in $CONTAINERD_DIR/fetch)"
  rm -rf "$CONTAINERD_DIR"; mkdir -p "$CONTAINERD_DIR/bin"
  debian_unpack "$CONTAINERD_SUITE" "$CONTAINERD_DIR/fetch" containerd
  for b in "${CONTAINERD_BINARIES[@]}"; do cp "$CONTAINERD_DIR/fetch/root/usr/bin/$b" "$CONTAINERD_DIR/bin/"; done
  rm -rf "$CONTAINERD_DIR/fetch"
  log "$("$CONTAINERD_DIR/bin/containerd" --version) in $((SECONDS - start))s"
fi
if have_node; then exit 0; fi

start=$SECONDS
fetch="$NODE_DIR/fetch"
rm -rf "$fetch"; mkdir -p "$NODE_DIR/bin" "$NODE_DIR/cni"
if have_binaries; then
  log "cached: runc, CNI plugins; mmdebstrap from Debian $SUITE (private apt state in $fetch)"
  debian_unpack "$SUITE" "$fetch" mmdebstrap
else
  log "runc, CNI plugins and mmdebstrap from Debian $SUITE (private apt state in $fetch)"
  debian_unpack "$SUITE" "$fetch" runc containernetworking-plugins mmdebstrap
  root="$fetch/root"
  cp "$root/usr/sbin/runc" "$NODE_DIR/bin/"
  cp "$root/usr/lib/cni/ptp" "$root/usr/lib/cni/host-local" "$root/usr/lib/cni/loopback" "$NODE_DIR/cni/"
  log "$("$NODE_DIR/bin/runc" --version | head -1) in $((SECONDS - start))s"
fi

# extract: the packages and their dependencies unpacked, no maintainer scripts, no chroot; python
# runs from it as it is.
log "images' base: mmdebstrap --variant=extract --include=python3,python3-venv,dash $SUITE"
PATH=/usr/sbin:/usr/bin:/sbin:/bin perl "$fetch/root/usr/bin/mmdebstrap" --quiet --variant=extract \
  --include=python3,python3-venv,dash --mode=root --format=tar "$SUITE" "$ROOTFS.part" "$(debian_source "$SUITE")"
mv "$ROOTFS.part" "$ROOTFS"
rm -rf "$fetch"
have_node && have_containerd || { log "the build finished without every piece in $NODE_DIR, $CONTAINERD_DIR"; exit 1; }
log "built in $((SECONDS - start))s into $NODE_DIR"
