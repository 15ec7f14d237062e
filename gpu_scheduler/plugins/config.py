"""The settings the plugins read (their args in the profile, registry.plugin_args), read once by each shell: bind from its environment, the kubectl
plugin from its flags (which default to the same variables)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .dynamicresources import allocator as dra

DEFAULT_NAMESPACE = "gpu-scheduler"


@dataclass(frozen=True)
class SchedulerConfig:
    namespace: str = DEFAULT_NAMESPACE  # where bind keeps its device records
    dra_device_class: str = dra.DEFAULT_DEVICE_CLASS  # of DRA pods that name none
    dra_rules: Mapping[str, dra.Rule] = field(default_factory=lambda: dra.parse_rules(None))
    # Quotas (gpu_scheduler/quota.py): pinned pods carry the requests a ResourceQuota counts (mutate
    # adds them) and GPUQuota refuses a pod whose count fell short. On in the shells unless
    # GPU_SCHEDULER_QUOTA=false (set for mutate and bind alike); off for a bare configuration, whose
    # pods (tests' pods, made without mutate) carry no such requests.
    quota: bool = False
