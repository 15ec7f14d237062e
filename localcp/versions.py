"""The versions the local stack builds and runs, one setting each: localcp/versions.env holds the
defaults, and the environment variable of the same name overrides one (`make K8S=v1.33.13` sets
GPU_SCHEDULER_K8S; JOBSET=, LWS=, KUEUE= the workload controllers'). localcp/versions.sh reads the
same file for the build scripts, so that what Python runs is what they built.

Read once, when localcp.cluster is imported: a process runs one version (localcp/compat.py runs
pytest once per version, each with its own environment)."""
from __future__ import annotations

import os
import re
from pathlib import Path

VERSIONS_FILE = Path(__file__).with_name("versions.env")
K8S = "GPU_SCHEDULER_K8S"
WORKLOAD_SETTINGS = {"jobset": "GPU_SCHEDULER_JOBSET", "lws": "GPU_SCHEDULER_LWS", "kueue": "GPU_SCHEDULER_KUEUE"}
COREDNS = "GPU_SCHEDULER_COREDNS"  # cluster DNS: localcp/build-coredns.sh, localcp/coredns.py
# Knative Eventing and Serving: localcp/build-knative.sh
KNATIVE_SETTINGS = {"eventing": "GPU_SCHEDULER_KNATIVE_EVENTING", "serving": "GPU_SCHEDULER_KNATIVE_SERVING"}
K8S_PATTERN = re.compile(r"v1\.(\d+)\.\d+")
WORKLOAD_PATTERN = re.compile(r"v\d+\.\d+\.\d+")
DRA_FIRST_MINOR = 34  # resource.k8s.io/v1 (DRA GA) served by default; 1.33 serves only the beta, off by default


def defaults() -> dict[str, str]:
    """localcp/versions.env: NAME=VALUE lines; # comments and blank lines skipped."""
    found = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return found


def setting(name: str) -> str:
    """The environment's value of `name` when set and not empty, else localcp/versions.env's."""
    value = os.environ.get(name) or defaults()[name]
    pattern = K8S_PATTERN if name == K8S else WORKLOAD_PATTERN
    if not pattern.fullmatch(value):
        raise ValueError(f"{name}={value}: not a version of the form "
                         f"{'v1.N.M' if name == K8S else 'vX.Y.Z'} (localcp/versions.env)")
    return value


def kubernetes() -> str:
    """The Kubernetes version of the stack, e.g. v1.37.2."""
    return setting(K8S)


def workload(kind: str) -> str:
    """The version of a workload controller (jobset, lws, kueue)."""
    return setting(WORKLOAD_SETTINGS[kind])


def coredns() -> str:
    """The version of CoreDNS the stack's cluster DNS runs, e.g. v1.15.0."""
    return setting(COREDNS)


def knative(project: str) -> str:
    """The version of a Knative project (eventing, serving), e.g. v0.50.0."""
    return setting(KNATIVE_SETTINGS[project])


def minor(version: str) -> int:
    """37 for v1.37.2."""
    match = K8S_PATTERN.fullmatch(version)
    if not match:
        raise ValueError(f"{version}: not a Kubernetes version v1.N.M")
    return int(match.group(1))


def dra_served(version: str) -> bool:
    """Whether the API server of `version` serves resource.k8s.io/v1, which bind, the stack's DRA
    test driver and the tests use (and localcp/build.sh builds the driver for)."""
    return minor(version) >= DRA_FIRST_MINOR


# Knative v0.50.0 refuses to start on a Kubernetes older than knative.dev/pkg's
# DefaultKubernetesMinVersion (v1.34.0 in the pkg version its go.mod pins).
KNATIVE_FIRST_MINOR = 34


def knative_supported(version: str) -> bool:
    """Whether Knative (localcp/versions.env's) runs on Kubernetes `version`."""
    return minor(version) >= KNATIVE_FIRST_MINOR
