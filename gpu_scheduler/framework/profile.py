"""A profile: which plugins run at each extension point, in order (kube-scheduler's
KubeSchedulerProfile). It is data, as in a KubeSchedulerConfiguration:

    {"plugins": {"preEnqueue": ["SchedulingGates", ...], "filter": [...], ...},
     "pluginConfig": [{"name": "GPUQuota", "args": {"enabled": True}}]}

and a registry (name -> factory, beside the plugins: gpu_scheduler/plugins/registry.py) turns the
names into plugins. The framework imports no plugin: `build` only looks names up. A plugin named
at several extension points is one instance, so what its PreFilter writes its Reserve reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .events import ClusterEvent
from .interface import (
    BindPlugin, FilterPlugin, PermitPlugin, Plugin, PodGroupPlugin, PostFilterPlugin, PreBindPlugin,
    PreEnqueuePlugin, PreFilterPlugin, ReservePlugin,
)

# The extension points, as a profile's `plugins` names them, and the interface each asks for.
EXTENSION_POINTS: dict[str, type[Plugin]] = {
    "preEnqueue": PreEnqueuePlugin,
    "podGroup": PodGroupPlugin,
    "preFilter": PreFilterPlugin,
    "filter": FilterPlugin,
    "postFilter": PostFilterPlugin,
    "reserve": ReservePlugin,
    "permit": PermitPlugin,
    "preBind": PreBindPlugin,
    "bind": BindPlugin,
}

# name -> factory(args, handle): `args` the plugin's pluginConfig entry ({} when none), `handle`
# what the framework offers every plugin (FrameworkHandle: its filter loop).
Factory = Callable[[Mapping[str, Any], Any], Plugin]
Registry = Mapping[str, Factory]


class ProfileError(ValueError):
    """A profile that names an unknown plugin, or a plugin at a point it does not implement."""


@dataclass(frozen=True)
class Profile:
    pre_enqueue: tuple[PreEnqueuePlugin, ...] = ()
    pod_group: tuple[PodGroupPlugin, ...] = ()
    pre_filter: tuple[PreFilterPlugin, ...] = ()
    filter: tuple[FilterPlugin, ...] = ()
    post_filter: tuple[PostFilterPlugin, ...] = ()
    reserve: tuple[ReservePlugin, ...] = ()
    permit: tuple[PermitPlugin, ...] = ()
    pre_bind: tuple[PreBindPlugin, ...] = ()
    bind: tuple[BindPlugin, ...] = ()

    def plugins(self) -> tuple[Plugin, ...]:
        seen: dict[int, Plugin] = {}
        for point in _FIELDS.values():
            for plugin in getattr(self, point):
                seen.setdefault(id(plugin), plugin)
        return tuple(seen.values())


_FIELDS = {"preEnqueue": "pre_enqueue", "podGroup": "pod_group", "preFilter": "pre_filter", "filter": "filter",
           "postFilter": "post_filter", "reserve": "reserve", "permit": "permit", "preBind": "pre_bind",
           "bind": "bind"}


def build(config: Mapping[str, Any], registry: Registry, handle: Any) -> Profile:
    """The profile `config` names, each plugin made once by its factory with its args."""
    points = config.get("plugins") or {}
    unknown_points = sorted(set(points) - set(EXTENSION_POINTS))
    if unknown_points:
        raise ProfileError(f"unknown extension point(s) {unknown_points}: the points are {list(EXTENSION_POINTS)}")
    args = {entry["name"]: entry.get("args") or {} for entry in config.get("pluginConfig") or ()}
    made: dict[str, Plugin] = {}

    def plugin(name: str, point: str) -> Plugin:
        if name not in made:
            if name not in registry:
                raise ProfileError(f"plugin {name!r} (at {point}) is not registered: the registry has"
                                   f" {sorted(registry)}")
            made[name] = registry[name](args.get(name, {}), handle)
        if not isinstance(made[name], EXTENSION_POINTS[point]):
            raise ProfileError(f"plugin {name!r} does not implement {point}")
        return made[name]

    return Profile(**{_FIELDS[point]: tuple(plugin(name, point) for name in names)
                      for point, names in points.items()})


def events_to_register(profile: Profile) -> dict[str, frozenset[ClusterEvent]]:
    """Each plugin's name -> the cluster events that can undo its refusal (the scheduling
    queue's queueing hints). A plugin that registers none is retried only when the pod changes."""
    return {plugin.name: plugin.events for plugin in profile.plugins()}
