"""kn, Knative's CLI, as a Knative user runs it against the local stack (localcp/build-kn.sh builds
it: knative.dev/client at the version of localcp/versions.env, kn 1.15).

Known upstream bug: `kn source apiserver list` and `kn source apiserver describe` panic on any
ApiServerSource whose resources carry a `selector.matchLabels` (the chart's does):
knative.dev/client v0.42.0 pkg/kn/commands/source/apiserver/flags.go:241 writes a slice by
index past its length. The stack shows that source with kubectl instead.
"""
from __future__ import annotations

import subprocess

from .cluster import ControlPlane, ProcessFailed
from .goprogram import CachedProgram

PROGRAM = CachedProgram("kn")
binary, ensure_built = PROGRAM.binary, PROGRAM.ensure_built


def kn(cp: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """kn ARGS... with the stack's kubeconfig."""
    done = subprocess.run([str(PROGRAM.required()), *args, "--kubeconfig", str(cp.kubeconfig)], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ProcessFailed(f"kn {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done
