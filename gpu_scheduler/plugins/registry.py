"""The registry (plugin name -> factory) and bind's one profile, as data (kube-scheduler's
in-tree registry and its default KubeSchedulerConfiguration profile). bind, `plan`, `explain` and
`suggest` all run `DEFAULT_PROFILE`; `new_framework` builds it with the settings of a shell.

The filters run in kube-scheduler's order for the checks it has, cheapest and most fundamental
first (NodeExists first: the filters after it read the node); GPU accounting and DRA last, since
they read bind's records and claims. Unreserve runs in reverse: the claim's allocation, then the
records."""
from __future__ import annotations

from typing import Any, Mapping

from ..framework.events import ClusterEvent
from ..framework.interface import Plugin
from ..framework.profile import Registry
from ..framework.runtime import Framework
from .config import SchedulerConfig
from .defaultbinder import DefaultBinder
from .defaultpreemption import DefaultPreemption
from .dynamicresources.plugin import DynamicResources
from .gang import Gang
from .gpuquota import GPUQuota
from .gpusheld import GPUsHeld
from .mapentry import MapEntry
from .nodeaffinity import NodeAffinity
from .nodeexists import NodeExists
from .nodegpucapacity import NodeGPUCapacity
from .nodeports import NodePorts
from .noderesourcesfit import NodeResourcesFit
from .nodeready import NodeReady
from .nodeunschedulable import NodeUnschedulable
from .poolentry import PoolEntry
from .schedulinggates import SchedulingGates
from .tainttoleration import TaintToleration


def _plain(cls: type[Plugin]):
    return lambda args, handle: cls()


REGISTRY: Registry = {
    SchedulingGates.name: _plain(SchedulingGates),
    Gang.name: _plain(Gang),
    MapEntry.name: _plain(MapEntry),
    NodeExists.name: _plain(NodeExists),
    NodeUnschedulable.name: _plain(NodeUnschedulable),
    NodeReady.name: _plain(NodeReady),
    TaintToleration.name: _plain(TaintToleration),
    NodeGPUCapacity.name: _plain(NodeGPUCapacity),
    NodeAffinity.name: _plain(NodeAffinity),
    NodePorts.name: _plain(NodePorts),
    NodeResourcesFit.name: _plain(NodeResourcesFit),
    GPUQuota.name: lambda args, handle: GPUQuota(bool(args.get("enabled", True))),
    GPUsHeld.name: _plain(GPUsHeld),
    PoolEntry.name: _plain(PoolEntry),
    DynamicResources.name: lambda args, handle: DynamicResources(SchedulerConfig(
        dra_device_class=args["deviceClass"], dra_rules=args["rules"]) if args else SchedulerConfig()),
    DefaultPreemption.name: lambda args, handle: DefaultPreemption(handle.run_filters),
    DefaultBinder.name: _plain(DefaultBinder),
}

# Each registered plugin's cluster events, known without building a profile (the queue's hints).
EVENTS_TO_REGISTER: dict[str, frozenset[ClusterEvent]] = {
    cls.name: cls.events for cls in (
        SchedulingGates, Gang, MapEntry, NodeExists, NodeUnschedulable, NodeReady, TaintToleration, NodeGPUCapacity,
        NodeAffinity, NodePorts, NodeResourcesFit, GPUQuota, PoolEntry, GPUsHeld, DynamicResources, DefaultPreemption,
        DefaultBinder)}

DEFAULT_PROFILE: Mapping[str, Any] = {
    "schedulerName": "gpu-scheduler",
    "plugins": {
        "preEnqueue": ["SchedulingGates"],
        "podGroup": ["Gang"],
        "preFilter": ["MapEntry", "Gang", "DynamicResources"],
        # PoolEntry first: a pool pod's candidates are mostly entries its workload's pods hold, which it
        # refuses at once, without the node checks (a no-op for a pod with an index).
        "filter": ["PoolEntry", "NodeExists", "NodeUnschedulable", "NodeReady", "TaintToleration", "NodeGPUCapacity",
                   "NodeAffinity", "NodePorts", "NodeResourcesFit", "GPUQuota", "GPUsHeld", "DynamicResources"],
        "postFilter": ["DefaultPreemption"],
        "reserve": ["PoolEntry", "GPUsHeld", "DynamicResources"],
        "permit": ["Gang"],
        "preBind": ["DynamicResources"],
        "bind": ["DefaultBinder"],
    },
}


def plugin_config(config: SchedulerConfig) -> list[dict[str, Any]]:
    """A shell's settings as the profile's pluginConfig entries."""
    return [
        {"name": "DynamicResources", "args": {"deviceClass": config.dra_device_class, "rules": config.dra_rules}},
        {"name": "GPUQuota", "args": {"enabled": config.quota}},
    ]


def new_framework(config: SchedulerConfig | None = None, profile: Mapping[str, Any] = DEFAULT_PROFILE) -> Framework:
    """The framework of `profile` (bind's by default), with a shell's settings."""
    config = config or SchedulerConfig()
    return Framework.from_config({**profile, "pluginConfig": plugin_config(config)}, REGISTRY)
