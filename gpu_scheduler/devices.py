"""Which environment makes a container see the right GPUs, and what deserves a warning.

The rule: CUDA_VISIBLE_DEVICES indexes are host indexes only when the container sees every GPU
of the node (no device plugin allocation, NVIDIA_VISIBLE_DEVICES=all, the usual default of GPU
node images). CUDA numbers devices fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so that is
always set: then index N is the GPU `nvidia-smi` shows as N.

Opt-in `nvidia` mode, for runtimes that honour NVIDIA_VISIBLE_DEVICES from the pod (the NVIDIA
container toolkit with accept-nvidia-visible-devices-envvar-when-unprivileged): the runtime
exposes only the listed devices, and inside the container they are 0..k-1.

Opt-in `dra` mode (gpu_scheduler/plugins/dynamicresources/allocator.py): the pod's ResourceClaim holds exactly its devices, and
the DRA driver exposes those only, renumbered from 0 as NVIDIA's runtime does: 0..k-1 as in
`nvidia` mode, and no NVIDIA_VISIBLE_DEVICES (the driver's CDI spec sets what it needs).
"""
from __future__ import annotations

from typing import Any, Mapping

from .placement import ORDINALS_ANNOTATION, Resolved, metadata, spec
from .schedmap import MAP_CACHE_BYTES, BoundedCache, Placement, claims_cost, parse_map, shown

CUDA, NVIDIA, DRA = "cuda", "nvidia", "dra"
MODES = (CUDA, NVIDIA, DRA)
# Per-pod choice of mode; the function's DEVICE_ENV_MODE sets the default.
MODE_ANNOTATION = "gpu-scheduler/device-env"
GPU_RESOURCE = "nvidia.com/gpu"
ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class ModeError(ValueError):
    pass


SHOWN = 5  # devices a warning names; the rest are counted


def device_mode(pod: Mapping[str, Any], default: str = CUDA) -> str:
    annotations = metadata(pod).get("annotations")
    mode = annotations.get(MODE_ANNOTATION, default) if isinstance(annotations, Mapping) else default
    if mode not in MODES:
        raise ModeError(f"annotation {MODE_ANNOTATION} is {shown(mode)}; expected one of {', '.join(MODES)}")
    return mode


def device_env(placement: Placement, mode: str = CUDA) -> dict[str, str]:
    """The variables to set; values come only from the parsed map (digits, commas, UUIDs)."""
    inside = ",".join(str(i) for i in range(len(placement.devices)))
    if mode == DRA:
        return {"CUDA_VISIBLE_DEVICES": inside, **ORDER}
    if mode == NVIDIA:
        return {"NVIDIA_VISIBLE_DEVICES": placement.visible_devices, "CUDA_VISIBLE_DEVICES": inside, **ORDER}
    return {"CUDA_VISIBLE_DEVICES": placement.visible_devices, **ORDER}


def _annotation_ref(key: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}


def pool_device_env(mode: str = CUDA) -> dict[str, Any]:
    """A pool pod's variables: its entry is chosen by bind when it binds the pod, so each names the
    annotation the Binding writes (an EnvVar's `valueFrom`), which the kubelet reads when it starts
    the container. Plain values (CUDA_DEVICE_ORDER) stay strings."""
    from .fit import DEVICES_ANNOTATION  # fit imports this module's neighbours; no cycle at call time
    if mode == NVIDIA:
        return {"NVIDIA_VISIBLE_DEVICES": _annotation_ref(DEVICES_ANNOTATION),
                "CUDA_VISIBLE_DEVICES": _annotation_ref(ORDINALS_ANNOTATION), **ORDER}
    if mode == DRA:  # the driver exposes the claim's devices only, from 0
        return {"CUDA_VISIBLE_DEVICES": _annotation_ref(ORDINALS_ANNOTATION), **ORDER}
    return {"CUDA_VISIBLE_DEVICES": _annotation_ref(DEVICES_ANNOTATION), **ORDER}


def requests_gpus(pod: Mapping[str, Any]) -> bool:
    for field in ("initContainers", "containers"):
        containers = spec(pod).get(field)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for kind in ("limits", "requests"):
                amounts = resources.get(kind)
                if isinstance(amounts, Mapping) and GPU_RESOURCE in amounts:
                    return True
    return False


def compute_claims(map_text: str) -> Mapping[tuple[str, str], tuple[int, ...]]:
    """{(node, device): the pod indexes a map gives it}, from the map's text."""
    claims: dict[tuple[str, str], list[int]] = {}
    for index, placement in sorted(parse_map(map_text).items()):
        for device in placement.devices:
            claims.setdefault((placement.node, device), []).append(index)
    return {key: tuple(indexes) for key, indexes in claims.items()}


# {(node, device): indexes given it}, once per map rather than once per pod; bounded in bytes like
# the parsed maps it is built from (schedmap.BoundedCache).
_claims: BoundedCache[str, Mapping[tuple[str, str], tuple[int, ...]]] = BoundedCache(
    compute_claims, claims_cost, max_bytes=MAP_CACHE_BYTES, max_entries=64)


def shared_devices(resolved: Resolved) -> dict[str, list[int]]:
    """{device: other pod indexes of the same map given it on the same node}."""
    mine = resolved.placement
    claims = _claims(resolved.map_text)
    shared = {device: [i for i in claims[(mine.node, device)] if i != resolved.index] for device in mine.devices}
    return {device: indexes for device, indexes in sorted(shared.items()) if indexes}


def device_warnings(pod: Mapping[str, Any], resolved: Resolved) -> list[tuple[str, str]]:
    """(Event reason, message) for each thing an operator should know; placement still proceeds."""
    warnings = []
    shared = shared_devices(resolved)
    if shared:
        listed = "; ".join(f"device {d} also to index {', '.join(map(str, i[:SHOWN]))}"
                           + (f" and {len(i) - SHOWN} more" if len(i) > SHOWN else "")
                           for d, i in list(shared.items())[:SHOWN])
        if len(shared) > SHOWN:
            listed += f"; and {len(shared) - SHOWN} more shared devices"
        warnings.append(("SharedDevices", f"pod index {resolved.index} shares GPUs on {resolved.placement.node}: {listed}"))
    if requests_gpus(pod):
        warnings.append(("GPUResourceRequested",
                         f"the pod also requests {GPU_RESOURCE}: the device plugin then exposes only its own"
                         " allocation, renumbered from 0, so the map's device indexes may not mean host GPUs"))
    return warnings
