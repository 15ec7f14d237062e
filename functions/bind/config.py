"""bind's settings, read once at start from its environment into one object that is passed in
(Knative's func template: configuration read once). Wrong settings stop bind here, naming the
variable."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Mapping

from gpu_scheduler.plugins.dynamicresources import allocator as dra
from gpu_scheduler.plugins.config import DEFAULT_NAMESPACE, SchedulerConfig
from kubeapi.client import IN_CLUSTER_NAMESPACE


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
    # needs no watch of it; bind finds it missing anyway and stays ready).
    dra_enabled: bool = True
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
        quota = env.get("GPU_SCHEDULER_QUOTA", "true").lower()
        if quota not in ("true", "false"):
            raise ConfigError(f"GPU_SCHEDULER_QUOTA: {quota[:20]!r}: expected true or false (as for mutate)")
        return cls(
            scheduler=SchedulerConfig(own_namespace(env),
                                      env.get("GPU_SCHEDULER_DRA_DEVICE_CLASS") or dra.DEFAULT_DEVICE_CLASS, rules,
                                      quota == "true"),
            dra_enabled=env.get("GPU_SCHEDULER_DRA", "true").lower() != "false",
            workers=int(text),
            identity=env.get("HOSTNAME") or socket.gethostname(),
            exit_after_record=env.get("GPU_SCHEDULER_TEST_EXIT_AFTER_RECORD") == "1",
            exit_after_bindings=int(env.get("GPU_SCHEDULER_TEST_EXIT_AFTER_BINDINGS", "0") or 0)
            if env.get("GPU_SCHEDULER_TEST_EXIT_AFTER_BINDINGS", "").isdigit() else 0,
        )
