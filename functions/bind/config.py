"""bind's settings, read once at start from its environment into one object that is passed in
(Knative's func template: configuration read once). Wrong settings stop bind here, naming the
variable."""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

from gpu_scheduler.devices import CUDA, MODES
from gpu_scheduler.plugins.dynamicresources import allocator as dra
from gpu_scheduler.plugins.config import DEFAULT_NAMESPACE, SchedulerConfig
from gpu_scheduler.schedmap import shown
from kubeapi.kubeconfig import IN_CLUSTER_NAMESPACE


class ConfigError(ValueError):
    """A setting bind cannot run with; the message names the variable and the fix."""


def own_namespace(env: Mapping[str, str]) -> str:
    """Where bind keeps its device records: its own namespace (in a cluster, its ServiceAccount's;
    elsewhere GPU_SCHEDULER_NAMESPACE, by default gpu-scheduler)."""
    try:
        with open(IN_CLUSTER_NAMESPACE) as f:
            return f.read().strip() or DEFAULT_NAMESPACE
    except OSError:
        return env.get("GPU_SCHEDULER_NAMESPACE") or DEFAULT_NAMESPACE


@dataclass(frozen=True)
class BindConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # DRA mode's watches: on unless GPU_SCHEDULER_DRA=false (a cluster without resource.k8s.io/v1
    # needs no watch of it; bind finds it missing anyway and stays ready, but in device_mode dra).
    dra_enabled: bool = True
    # The install's device env mode (DEVICE_ENV_MODE, the chart's deviceEnvMode, as mutate reads
    # it): in dra mode every pod without its own annotation needs resource.k8s.io/v1, so bind is not
    # ready on an API server that does not serve it (dra_mode_unserved says why).
    device_mode: str = CUDA
    workers: int = 8  # threads placing pods from the queue
    identity: str = ""  # this instance, on its Events (reportingInstance)
    # For the test of bind dying between its two writes (tests/test_records_cluster.py): exit at
    # once after writing a pod's device records, before its Binding. Never set outside that test.
    exit_after_record: bool = False
    # For the test of bind dying between two Bindings of a gang (tests/test_gang_cluster.py): exit
    # at once after this many Bindings. Never set outside that test.
    exit_after_bindings: int = 0

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> "BindConfig":
        env = os.environ if env is None else env
        try:
            rules = dra.parse_rules(env.get("GPU_SCHEDULER_DRA_DEVICE_RULES"))
        except dra.RuleError as error:
            raise ConfigError(str(error)) from None
        text = env.get("RESYNC_CONCURRENCY", "8")
        if not text.isdigit() or not 1 <= int(text) <= 256:
            raise ConfigError(f"RESYNC_CONCURRENCY: {text[:20]!r} is not a number of workers from 1 to 256")
        mode = env.get("DEVICE_ENV_MODE", CUDA)
        if mode not in MODES:
            raise ConfigError(f"DEVICE_ENV_MODE: {mode[:20]!r}: expected one of {', '.join(MODES)} (as for mutate)")
        dra_watched = env.get("GPU_SCHEDULER_DRA", "true").lower() != "false"
        if mode == "dra" and not dra_watched:
            # Every pod of a dra install needs the claims and slices that GPU_SCHEDULER_DRA=false leaves unwatched.
            raise ConfigError("DEVICE_ENV_MODE dra needs GPU_SCHEDULER_DRA on: set the chart's dra.enabled true,"
                              " or deviceEnvMode cuda or nvidia")
        quota = env.get("GPU_SCHEDULER_QUOTA", "true").lower()
        if quota not in ("true", "false"):
            raise ConfigError(f"GPU_SCHEDULER_QUOTA: {quota[:20]!r}: expected true or false (as for mutate)")
        return cls(
            scheduler=SchedulerConfig(own_namespace(env),
                                      env.get("GPU_SCHEDULER_DRA_DEVICE_CLASS") or dra.DEFAULT_DEVICE_CLASS, rules,
                                      quota == "true"),
            dra_enabled=dra_watched,
            device_mode=mode,
            workers=int(text),
            identity=env.get("HOSTNAME") or socket.gethostname(),
            exit_after_record=env.get("GPU_SCHEDULER_TEST_EXIT_AFTER_RECORD") == "1",
            exit_after_bindings=int(env.get("GPU_SCHEDULER_TEST_EXIT_AFTER_BINDINGS", "0") or 0)
            if env.get("GPU_SCHEDULER_TEST_EXIT_AFTER_BINDINGS", "").isdigit() else 0,
        )


DRA_API = "resource.k8s.io/v1"
DRA_SINCE = (1, 34)  # the first Kubernetes to serve DRA_API (on by default)
MAX_VERSION_CHARS = 64  # of the API server's gitVersion, quoted in a message


def _number(value: Any) -> int | None:
    """A /version field such as "33" or "33+" (some providers add a +) as a number."""
    match = re.match(r"\d+", value) if isinstance(value, str) else None
    return int(match[0]) if match else None


def dra_mode_unserved(version: Mapping[str, Any]) -> str:
    """Why bind in device env mode dra cannot place pods on this API server, which does not serve
    DRA_API, and the fix: another mode, or a server that serves it. `version`: the server's
    /version ({} when it could not be read): its gitVersion names it; the version it behaves as
    (emulationMajor and -Minor where it emulates an older one, --emulated-version) says whether
    it is too old (upgrade) or has the group turned off (turn it on)."""
    since = ".".join(map(str, DRA_SINCE))
    needs = f"device env mode dra (DEVICE_ENV_MODE) needs {DRA_API} (Kubernetes {since} or newer)"
    other_mode = "set the chart's deviceEnvMode to cuda or nvidia (DEVICE_ENV_MODE of bind and mutate)"
    name = version.get("gitVersion")
    name = name[:MAX_VERSION_CHARS] if isinstance(name, str) else ""
    name = name if re.fullmatch(r"[\w.+-]*", name) else shown(name)  # the server's text, in a log line
    parsed = re.match(r"v?(\d+)\.(\d+)", name)
    behaves = ((_number(version.get("major")), _number(version.get("minor"))) if version.get("minor")
               else (int(parsed[1]), int(parsed[2])) if parsed else (None, None))
    emulates = (_number(version.get("emulationMajor")), _number(version.get("emulationMinor")))
    if name and None not in emulates and emulates != behaves:
        behaves = emulates
        name = f"{name}, emulating {emulates[0]}.{emulates[1]},"
    if name and None not in behaves and behaves >= DRA_SINCE:  # new enough: the group is turned off
        return (f"{needs}; this API server is {name} but does not serve it: {other_mode}, or turn it on in"
                f" kube-apiserver (--runtime-config={DRA_API}=true, feature gate DynamicResourceAllocation)")
    server = f"is {name}" if name else "(its version could not be read)"
    return f"{needs}; this API server {server} and does not serve it: {other_mode}, or upgrade to {since} or newer"
