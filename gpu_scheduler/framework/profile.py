"""The one profile: which plugins run at each extension point, in order. bind, `plan --cluster`
and `explain` all run it (kube-scheduler's KubeSchedulerProfile, as data). The filters run in
kube-scheduler's order for the checks it has, cheapest and most fundamental first; GPU accounting
and DRA last, since they read bind's records and claims."""
from __future__ import annotations

from dataclasses import dataclass

from ..plugins.defaultbinder import DefaultBinder
from ..plugins.defaultpreemption import DefaultPreemption
from ..plugins.dynamicresources import DynamicResources
from ..plugins.gang import Gang
from ..plugins.gpuquota import GPUQuota
from ..plugins.gpusheld import GPUsHeld
from ..plugins.mapentry import MapEntry
from ..plugins.nodeaffinity import NodeAffinity
from ..plugins.nodeexists import NodeExists
from ..plugins.nodegpucapacity import NodeGPUCapacity
from ..plugins.nodeports import NodePorts
from ..plugins.noderesourcesfit import NodeResourcesFit
from ..plugins.nodeready import NodeReady
from ..plugins.nodeunschedulable import NodeUnschedulable
from ..plugins.tainttoleration import TaintToleration
from .config import SchedulerConfig
from .events import ClusterEvent
from .interface import (
    BindPlugin, FilterPlugin, PermitPlugin, Plugin, PostFilterPlugin, PreBindPlugin, PreFilterPlugin, ReservePlugin,
)

# Every plugin class of the profile: their names and events are known without a configuration.
PLUGINS: tuple[type[Plugin], ...] = (
    MapEntry, NodeExists, NodeUnschedulable, NodeReady, TaintToleration, NodeGPUCapacity, NodeAffinity, NodePorts,
    NodeResourcesFit, GPUQuota, GPUsHeld, DynamicResources, Gang, DefaultPreemption, DefaultBinder,
)


def events_to_register() -> dict[str, frozenset[ClusterEvent]]:
    """Each plugin's name -> the cluster events that can undo its refusal (the scheduling
    queue's queueing hints). A plugin that registers none is retried only when the pod changes."""
    return {plugin.name: plugin.events for plugin in PLUGINS}


@dataclass(frozen=True)
class Profile:
    pre_filter: tuple[PreFilterPlugin, ...]
    filter: tuple[FilterPlugin, ...]
    post_filter: tuple[PostFilterPlugin, ...]
    reserve: tuple[ReservePlugin, ...]
    permit: tuple[PermitPlugin, ...]
    pre_bind: tuple[PreBindPlugin, ...]
    bind: tuple[BindPlugin, ...]


def default_profile(config: SchedulerConfig) -> Profile:
    node_exists, gpus_held, dynamic, gang = NodeExists(), GPUsHeld(), DynamicResources(config), Gang()
    # NodeExists first: the filters after it read the node.
    filters = (node_exists, NodeUnschedulable(), NodeReady(), TaintToleration(), NodeGPUCapacity(), NodeAffinity(),
               NodePorts(), NodeResourcesFit(), GPUQuota(config.quota), gpus_held, dynamic)
    return Profile(
        pre_filter=(MapEntry(), gang, dynamic),
        filter=filters,
        post_filter=(DefaultPreemption(filters),),  # runs the filters again with its victims gone
        reserve=(gpus_held, dynamic),  # Unreserve in reverse: the claim's allocation, then the records
        permit=(gang,),
        pre_bind=(dynamic,),
        bind=(DefaultBinder(),),
    )
