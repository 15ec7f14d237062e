"""kubectl gpu-scheduler gpus: every GPU of the cluster, who holds it, who waits for it.

Reads each kind once (nodes, pods, bind's records, DRA slices where served), builds the node
snapshots bind decides on (gpu_scheduler.framework.snapshot.NodeSnapshot), and asks the core
(gpu_scheduler/gpus.py) for each GPU's state with bind's own record rules. A pending pod of ours is
shown on the GPUs its entry names (a pool pod: every entry's) with explain's verdict
(gpu_scheduler.plan.answer on the same framework and reads as `explain`), so `gpus`, `explain`
and bind never disagree. `--watch` redraws when a watch of pods, nodes or bind's records reports
a change (at most every WATCH_SETTLE seconds): no polling.

At 1000 nodes and 20000 pods (bench/gpus.py, docs/performance.md) the cost is in reading and
decoding the pods and in the pending pods' verdicts; the rest is kept small: the cyclic garbage
collector is paused while a view is read, worked out and rendered (decoding 20000 pods otherwise
sets it off hundreds of times, over a heap that only grows: 3 to 5 times the decoding itself),
only the pods that hold a GPU are worked out (the view shows holders, not requests), and the JSON
is written by msgspec where it is installed (json.dumps with indent is the pure-Python encoder)."""
from __future__ import annotations

import gc
import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, TypedDict

import yaml

from gpu_scheduler import SCHEDULER_NAME
from gpu_scheduler import plan as core
from gpu_scheduler.fit import DEVICES_ANNOTATION, NodeInfo, PodInfo, held_devices, is_terminal, shares_gpus, workload
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.gpus import (
    BEING_FREED, FREE, HELD, IN_FLIGHT, SHARED, GpuView, Waiter, gpu_view, only,
)
from gpu_scheduler.podinputs import PodInputs
from gpu_scheduler.records import RECORD_SELECTOR, EntryRecord, Record
from kubeapi.errors import APIError

try:  # msgspec is bind's (functions/bind/requirements.txt), not the plugin's: without it, pods are decoded in full
    import msgspec
    from kubeapi.projection import NODES, POD_METADATA, PODS
except ImportError:  # pragma: no cover - the plugin installed by pip (pyproject's dependencies)
    msgspec, NODES, POD_METADATA, PODS = None, None, None, None

try:  # bind's projection keeps no condition's time ("a pod's times are read by nobody"); a holder's
    # "since" is its PodScheduled condition's lastTransitionTime: PODS with that time kept
    from kubeapi import projection as _projection

    class _TimedCondition(_projection.Condition, total=False):
        lastTransitionTime: Any

    class _TimedPodStatus(_projection.PodStatus, total=False):
        conditions: list[_TimedCondition]

    class _TimedPod(_projection.Pod, total=False):
        status: _TimedPodStatus

    class _TimedPodEvent(_projection.PodEvent, total=False):
        object: _TimedPod

    _TimedPodList = TypedDict("_TimedPodList", {"metadata": Any, "items": list[_TimedPod]}, total=False)
    POD_TIMES = _projection.Decoder(_TimedPod, _TimedPodEvent, _TimedPodList)
except ImportError:  # pragma: no cover - without msgspec: pods decoded in full, times and all
    POD_TIMES = None

from .cluster import or_none
from .output import columns

FORMATS = ("table", "wide", "json", "yaml", "grid")
WATCH_SETTLE = 0.5  # seconds between redraws while changes keep coming
WATCH_SECONDS = 300  # one watch call's length; then it is made again from where it ended
# The grid: one character a GPU. A holder's letter is its workload's (the legend); these are the rest.
GRID_FREE, GRID_IN_FLIGHT, GRID_BEING_FREED, GRID_SHARED = ".", "+", "~", "*"
# ANSI colours for the letters, on a terminal: one per workload, cycling.
COLOURS = (31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96)


OURS = f"spec.schedulerName={SCHEDULER_NAME}"  # the pods the view reads whole (Reads says why)
OTHERS = f"spec.schedulerName!={SCHEDULER_NAME}"
READERS = 8  # calls made at a time: the listings after the records', then the nodes' pods


class Reads:
    """Everything `gpus` reads, each kind listed once.

    The pods are not listed whole. A GPU's holders are the pods that carry `gpu-scheduler/devices`
    (bind writes it on its own pods; a pod another workload puts on a node with it holds the GPU
    too, as bind counts it), the records and nominations name gpu-scheduler's pods, and the
    waiting pods are its own: so gpu-scheduler's pods are listed whole (a field selector: the API
    server sends them alone), the others by their metadata alone, and of those only the ones that
    carry the annotation are read whole. The other pods count in the waiting pods' verdicts (fit,
    preemption: what else runs on the node): every pod of each node their entries name is read,
    and no other node's. At 20000 pods that is a fifth of the bytes (bench/gpus.py)."""

    def __init__(self, api, records_namespace: str, keep: Callable[..., None] | None = None):
        """keep: given what was read (nodes, the pods above, the records' namespace, records,
        entries, the slices or None where not served, and every pod of each node the waiting pods
        name), for explain's verdicts to read it rather than the API again."""
        self.api, self.records_namespace, self.keep = api, records_namespace, keep

    def read(self) -> tuple[list[dict], list[dict], list[Record], list[EntryRecord], list[dict]]:
        from concurrent.futures import ThreadPoolExecutor

        api = self.api
        # Records first: a record's pod absent from the pods listed after it is gone (as bind rules).
        leases = [lease for page, _ in api.list_leases(self.records_namespace, RECORD_SELECTOR, paged=False)
                  for lease in page]

        def ours(selector: str) -> list[dict]:
            return [pod for page, _ in api.list_all_pods(POD_TIMES, f"{OURS},{selector}", paged=False) for pod in page]
        with ThreadPoolExecutor(READERS) as pool:
            # Our pending pods first (a few): the nodes their entries name are read while the rest is.
            listed_pending = pool.submit(ours, "spec.nodeName=")
            listed_others = pool.submit(lambda: [p for page, _ in api.list_all_pod_metadata(OTHERS, POD_METADATA, paged=False)
                                                 for p in page])
            listed_nodes = pool.submit(lambda: [n for page, _ in api.list_nodes(NODES, paged=False) for n in page])
            listed_slices = pool.submit(self._slices)
            pending = listed_pending.result()
            # Our bound pods after the pending ones, so that a pod bound in between is in one listing
            # at least (in both, its bound copy is kept).
            listed_bound = pool.submit(ours, "spec.nodeName!=")
            named = sorted(waited_on(waiting_pods(pending))) if self.keep is not None else []
            on_nodes = [pool.submit(api.list_pods, f"spec.nodeName={node}", PODS) for node in named]
            holders = [(meta.get("namespace"), meta.get("name")) for meta in (p.get("metadata") or {}
                                                                               for p in listed_others.result())
                       if DEVICES_ANNOTATION in (meta.get("annotations") or {})]
            others = [pool.submit(or_none, api.read_pod, namespace, name, projection=POD_TIMES)
                      for namespace, name in holders]
            pods_on = {node: listed.result() for node, listed in zip(named, on_nodes)}
            nodes, slices = listed_nodes.result(), listed_slices.result()
            bound = listed_bound.result()
            uids = {(pod.get("metadata") or {}).get("uid") for pod in bound}
            pods = [*(pod for pod in pending if (pod.get("metadata") or {}).get("uid") not in uids), *bound,
                    *(pod for pod in (o.result() for o in others) if pod is not None)]
        records = [r for r in map(Record.of, leases) if r is not None]
        entries = [r for r in map(EntryRecord.of, leases) if r is not None]
        if self.keep is not None:
            self.keep(nodes, pods, self.records_namespace, records, entries, slices, pods_on)
        return nodes, pods, records, entries, slices or []

    def _slices(self) -> list[dict] | None:
        """The DRA driver's ResourceSlices; None where resource.k8s.io/v1 is not served (before 1.34)."""
        try:
            return [s for page, _ in self.api.list_resource_slices() for s in page]
        except APIError as error:
            if not error.not_found:
                raise
            return None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused (what is read here holds no cycles: reference counting
    frees it), and restored as it was."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def scheduled_since(pod: Mapping[str, Any]) -> str:
    """When the pod was bound: its PodScheduled condition's transition time ('' if unknown)."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return str(condition.get("lastTransitionTime") or "")
    return ""


def holder(pod: Mapping[str, Any]) -> PodInfo | None:
    """What the view reads of a pod on a node: the GPUs it holds (fit.held_devices, as bind counts
    them) and whose they are; None when it holds none. Its requests, ports, priority and the rest
    are bind's to weigh, not the view's, and are not worked out (PodInfo.of's cost, 20000 times)."""
    devices = held_devices(pod)
    if not devices:
        return None
    meta = pod.get("metadata") or {}
    return PodInfo(str(meta.get("uid") or ""), f"{meta.get('namespace')}/{meta.get('name')}", {}, (), devices,
                   workload(pod), shares_gpus(pod))


def snapshots(nodes: list[dict], pods: list[dict], records: list[Record], entries: list[EntryRecord],
              slices: list[dict], now: float) -> list[NodeSnapshot]:
    """Each node as the view reads it: the NodeSnapshot bind's framework decides on, whose pods are
    its non-terminal pods that hold GPUs (holder()), with bind's records of its devices and its
    slices. As for bind (functions/bind/cache.py, gone_of), a record's pod is gone unless it is on a
    node and not finished, or one of our pending pods (waiting_pods): a pod that finished within its
    record's grace frees the GPU at once; a preemptor is gone once it is not among `pods`."""
    on: dict[str, list[PodInfo]] = {}
    uids = set()
    alive = {str((p.get("metadata") or {}).get("uid") or "") for p in waiting_pods(pods)}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uids.add(str(meta.get("uid") or ""))
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not is_terminal(pod):
            alive.add(str(meta.get("uid") or ""))
            info = holder(pod)
            if info is not None:
                on.setdefault(node, []).append(info)
    records_on: dict[str, dict[str, Record]] = {}
    for record in records:
        records_on.setdefault(record.node, {})[record.device] = record
    entries_on: dict[str, dict[tuple[str, int], EntryRecord]] = {}
    for entry in entries:
        entries_on.setdefault(entry.node, {})[(entry.pool, entry.entry)] = entry
    slices_on: dict[str, list[dict]] = {}
    for piece in slices:
        node = (piece.get("spec") or {}).get("nodeName")
        if node:
            slices_on.setdefault(node, []).append({"spec": piece.get("spec")})
    gone = frozenset(r.last_uid for r in (*records, *entries) if r.last_uid and r.last_uid not in alive)
    gone |= frozenset(r.nominee_uid for r in records if r.nominee_uid and r.nominee_uid not in uids)
    return [NodeSnapshot(name=_name(node), node=node, info=NodeInfo.of(on.get(_name(node), ())),
                         records=records_on.get(_name(node), {}), gone=gone, now=now,
                         slices=tuple(slices_on.get(_name(node), ())), entries=entries_on.get(_name(node), {}))
            for node in nodes if _name(node)]


def waiting_pods(pods: Iterable[dict]) -> list[dict]:
    """Our pending pods: gpu-scheduler's, not bound, not finished, not being deleted."""
    return [p for p in pods if (p.get("spec") or {}).get("schedulerName") == SCHEDULER_NAME
            and not (p.get("spec") or {}).get("nodeName") and not is_terminal(p)
            and not (p.get("metadata") or {}).get("deletionTimestamp")]


def waited_on(pending: Iterable[dict]) -> set[str]:
    """The nodes the pending pods' entries name (a pool pod's: every entry's)."""
    return {entry.placement.node for pod in pending for entry in PodInputs.of(pod).choice.options}


def waiters(pending: list[dict], answer: Callable[[dict], core.Answer]) -> list[tuple[Waiter, list[tuple[str, str]]]]:
    """Each pending pod with explain's verdict, and the (node, device) pairs its entries name."""
    found = []
    for pod in pending:
        choice = PodInputs.of(pod).choice
        places = [(entry.placement.node, device) for entry in choice.options for device in entry.placement.devices]
        if not places:
            continue  # no entry: it waits for no GPU (explain says why)
        said = answer(pod).scheduling
        meta = pod.get("metadata") or {}
        found.append((Waiter(f"{meta.get('namespace')}/{meta.get('name')}", said.plugin or "", said.message,
                             said.action), places))
    return found


def view_now(reads: Reads, answer_for: Callable[[list[dict]], Callable[[dict], core.Answer]],
             node: str | None = None, namespace: str | None = None) -> GpuView:
    with _collector_paused():
        return _view_now(reads, answer_for, node, namespace)


def _view_now(reads: Reads, answer_for: Callable[[list[dict]], Callable[[dict], core.Answer]],
              node: str | None = None, namespace: str | None = None) -> GpuView:
    nodes, pods, records, entries, slices = reads.read()
    since = {str((p.get("metadata") or {}).get("uid") or ""): scheduled_since(p) for p in pods
             if (p.get("spec") or {}).get("nodeName")}
    pending = waiting_pods(pods)
    view = gpu_view(snapshots(nodes, pods, records, entries, slices, time.time()),
                    waiters(pending, answer_for(pending)) if pending else (), since)
    return only(view, node, namespace) if (node or namespace) else view


# -- output --------------------------------------------------------------------------------------
def as_data(view: GpuView) -> dict[str, Any]:
    def gpu(g) -> dict[str, Any]:
        data: dict[str, Any] = {"node": g.node, "device": g.device, "uuid": g.uuid or None, "type": g.product,
                                "state": g.state, "since": g.since or None,
                                "holders": [{"pod": h.pod, "workload": h.workload, "since": h.since or None}
                                            for h in g.holders],
                                "workloads": list(g.workloads)}
        if g.state == BEING_FREED:
            data.update(nominee=g.nominee, until=g.until)
        if g.state == IN_FLIGHT:
            data.update(recordedFor=g.in_flight_for, graceUntil=g.until)
        data["waiting"] = [{"pod": w.pod, "action": w.action, "plugin": w.plugin or None, "message": w.message}
                           for w in g.waiting]
        return data
    return {"gpus": [gpu(g) for g in view.gpus],
            "nodes": [{"node": c.name, "free": c.free, "total": c.total} for c in view.nodes],
            "types": [{"type": c.name, "free": c.free, "total": c.total} for c in view.types],
            "legend": dict(view.legend)}


def _state_text(gpu) -> str:
    if gpu.state == SHARED:
        return f"shared by {len(gpu.workloads)}"
    if gpu.state == BEING_FREED:
        return f"being freed for {gpu.nominee} until {gpu.until}"
    if gpu.state == IN_FLIGHT:
        return f"in flight (recorded for {gpu.in_flight_for}, not bound yet)"
    if gpu.state == HELD and len(gpu.holders) > 1:  # one workload's pods whose map shares the GPU
        return f"held ({len(gpu.holders)} pods)"
    return gpu.state


def table(view: GpuView, wide: bool = False) -> str:
    header = ["NODE", "GPU", "TYPE", "STATE", "HOLDERS", "WORKLOADS", "SINCE", "WAITING"]
    if wide:
        header.insert(2, "UUID")
    rows = []
    for g in view.gpus:
        waiting = ", ".join(w.pod for w in g.waiting) or "-"
        row = [g.node, g.device, g.product, _state_text(g), ", ".join(h.pod for h in g.holders) or "-",
               ", ".join(g.workloads) or "-", g.since or "-", waiting]
        if wide:
            row.insert(2, g.uuid or "-")
        rows.append(row)
    text = columns(header, rows) if rows else "no GPUs: no node advertises nvidia.com/gpu\n"
    text += "\n" + summary(view)
    refusals = {(w.pod, w.message) for g in view.gpus for w in g.waiting if w.action != "bind"}
    if wide and refusals:
        text += "\nWaiting:\n" + "".join(f"  {pod}: {message}\n" for pod, message in sorted(refusals))
    return text


def summary(view: GpuView) -> str:
    nodes = "  ".join(f"{c.name} {c.free}/{c.total}" for c in view.nodes)
    types = "  ".join(f"{c.name} {c.free}/{c.total}" for c in view.types)
    free, total = sum(c.free for c in view.nodes), sum(c.total for c in view.nodes)
    return f"free {free} of {total}\nfree by node: {nodes or '-'}\nfree by type: {types or '-'}\n"


def grid(view: GpuView, colour: bool = False) -> str:
    """A node per line, a character per GPU: the holding workload's letter, `.` free, `*` shared,
    `+` in flight, `~` being freed; the legend below."""
    colours = {workload: COLOURS[i % len(COLOURS)] for i, workload in enumerate(view.legend)}
    by_node: dict[str, list] = {}
    for g in view.gpus:
        by_node.setdefault(g.node, []).append(g)
    width = max((len(n) for n in by_node), default=4)
    lines = []
    for node, gpus in by_node.items():
        cells = []
        for g in gpus:
            if g.state == FREE:
                cell = GRID_FREE
            elif g.state == SHARED:
                cell = GRID_SHARED
            elif g.state == IN_FLIGHT:
                cell = GRID_IN_FLIGHT
            elif g.state == BEING_FREED:
                cell = GRID_BEING_FREED
            else:
                cell = view.legend.get(g.workloads[0], "?") if g.workloads else "?"
            if colour and g.state == HELD and g.workloads:
                cell = f"\x1b[{colours[g.workloads[0]]}m{cell}\x1b[0m"
            cells.append(cell)
        free = sum(g.state == FREE for g in gpus)
        several = ", ".join(f"GPU {g.device}: {len(g.holders)} pods" for g in gpus if len(g.holders) > 1)
        lines.append(f"{node.ljust(width)}  {' '.join(cells)}   {free}/{len(gpus)} free" + (f"   ({several})" if several else ""))
    legend = [f"  {letter}  {workload}" for workload, letter in view.legend.items()]
    keys = f"  {GRID_FREE} free   {GRID_SHARED} shared by several workloads   {GRID_IN_FLIGHT} in flight (recorded, not yet bound)   {GRID_BEING_FREED} being freed for a preemptor"
    return "\n".join([*lines, "", *legend, keys, ""]) if lines else "no GPUs: no node advertises nvidia.com/gpu\n"


def render(view: GpuView, form: str, tty: bool = False) -> str:
    with _collector_paused():
        return _render(view, form, tty)


def _render(view: GpuView, form: str, tty: bool) -> str:
    if form == "json":
        if msgspec is not None:  # the same text as json.dumps(indent=2), but for non-ASCII (UTF-8, not \\u escapes)
            return msgspec.json.format(msgspec.json.encode(as_data(view)), indent=2).decode() + "\n"
        return json.dumps(as_data(view), indent=2) + "\n"
    if form == "yaml":
        return yaml.safe_dump(as_data(view), sort_keys=False, width=1000)
    if form == "grid":
        return grid(view, colour=tty and not os.environ.get("NO_COLOR"))
    return table(view, wide=form == "wide")


# -- --watch -------------------------------------------------------------------------------------
class WatchRefused(Exception):
    """The API server refused a watch for good (403: no `watch` grant): the message names the fix."""


def watch(api, records_namespace: str, draw: Callable[[], None], stop: threading.Event) -> None:
    """Draw, then draw again each time a watch of pods, nodes or bind's records reports a change
    (changes that keep coming are drawn at most every WATCH_SETTLE seconds), until `stop`. A watch
    the API server refuses for good ends it with WatchRefused; one it drops is made again."""
    changed = threading.Event()
    refused: list[str] = []

    def follow(what: str, list_pages, watch_from):
        version = ""
        while not stop.is_set():
            try:
                if not version:
                    for _, version in list_pages():
                        pass
                for kind, _obj, _size in watch_from(version):
                    if kind == "ERROR":  # 410: too old; list again
                        version = ""
                        break
                    if kind != "BOOKMARK":
                        changed.set()
            except APIError as error:
                if error.status in (401, 403) and not error.transient:
                    refused.append(f"the API server refused to watch {what} ({error.message}): grant `watch` on"
                                   f" pods, nodes and Leases in {records_namespace} (permissions.PLUGIN_WATCH), or"
                                   " run gpus without --watch")
                    changed.set()
                    return
                version = ""
                stop.wait(1.0)
    follows = [
        ("pods", lambda: api.list_all_pods(projection=PODS),
         lambda v: api.watch_all_pods(v, WATCH_SECONDS, projection=PODS)),
        ("nodes", api.list_nodes, lambda v: api.watch_nodes(v, WATCH_SECONDS)),
        (f"Leases in {records_namespace}", lambda: api.list_leases(records_namespace, RECORD_SELECTOR),
         lambda v: api.watch_leases(records_namespace, RECORD_SELECTOR, v, WATCH_SECONDS)),
    ]
    for what, list_pages, watch_from in follows:
        threading.Thread(target=follow, args=(what, list_pages, watch_from), daemon=True).start()
    draw()
    while not stop.is_set():
        if changed.wait(1.0):
            if refused:
                stop.set()
                raise WatchRefused(refused[0])
            stop.wait(WATCH_SETTLE)
            changed.clear()
            draw()
