"""The scheduling framework's extension points, after kube-scheduler's
(pkg/scheduler/framework/interface.go): a pod goes through PreFilter, Filter (its one map node),
PostFilter (only when refused), Reserve, Permit, PreBind and Bind; Unreserve undoes Reserve when a
later phase fails. Every plugin says what it is (`name`) and which cluster events can undo its
refusal (`events`, kube-scheduler's EventsToRegister), and answers with a typed Status.

Filters are pure functions of the pod and an immutable NodeSnapshot. The phases after Filter do
their I/O through a Cluster handle the shell implements (kube-scheduler's framework.Handle)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol, Sequence

from .events import ClusterEvent
from .snapshot import NodeSnapshot

if TYPE_CHECKING:  # mutate's image has no kubeapi, and imports plugins (NodeAffinity) for their checks
    from kubeapi.errors import APIError

Pod = Mapping[str, Any]


class Code(enum.Enum):
    SUCCESS = "Success"
    # Refused now; a registered cluster event (or the pod changing) may change the answer.
    UNSCHEDULABLE = "Unschedulable"
    # Refused for a reason only the pod itself can change (its map, its index, its claim entry).
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    # The API failed, or the cluster changed under the attempt: not a verdict on the pod.
    ERROR = "Error"
    WAIT = "Wait"  # Permit: hold the pod until its peers are ready (gangs)
    SKIP = "Skip"  # the plugin has nothing to say for this pod


# What an ERROR came to, for the queue and the caller: try again after the backoff (RETRY), or
# a refusal from the API that only an operator fixes (API_ERROR, e.g. missing RBAC or namespace).
RETRY = "Retry"
API_ERROR = "APIError"


@dataclass(frozen=True)
class Status:
    code: Code = Code.SUCCESS
    plugin: str = ""
    message: str = ""
    # For a refusal: the reason users see on the pod (PodScheduled's reason, or the map problem,
    # such as NoMapEntry). For an ERROR: RETRY or API_ERROR, or what a Binding 409 turned out to be.
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)

    @property
    def refused(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNRESOLVABLE)


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def unschedulable(plugin: str, message: str, reason: str = "Unschedulable") -> Status:
    return Status(Code.UNSCHEDULABLE, plugin, message, reason)


def unresolvable(plugin: str, message: str, reason: str = "Unschedulable") -> Status:
    return Status(Code.UNRESOLVABLE, plugin, message, reason)


def error(plugin: str, message: str, reason: str = RETRY) -> Status:
    return Status(Code.ERROR, plugin, message, reason)


def api_failure(plugin: str, doing: str, failure: "APIError") -> Status:
    """An ERROR status for a failed API call: RETRY when trying again as it is can help, else
    API_ERROR with what an operator must fix. A 404 for a namespace is a configuration error, never
    "the pod is gone"."""
    said = f"{doing}: " if doing else ""
    if failure.transient:
        return error(plugin, f"{said}{failure.message}")
    namespace = failure.namespace_missing()
    if namespace:
        return error(plugin, f"{said}namespace {namespace!r} does not exist: create it (kubectl create namespace"
                             f" {namespace}), or set GPU_SCHEDULER_NAMESPACE to the namespace bind keeps its records in",
                     API_ERROR)
    return error(plugin, f"{said}{failure.message}", API_ERROR)


class CycleState:
    """What one attempt's plugins pass on to their later phases (kube-scheduler's CycleState):
    written by PreFilter and Filter, read by Reserve, PreBind and Bind. One per attempt."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def read(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def clone(self) -> "CycleState":
        """A copy to run the filters again on (preemption's trials), leaving this one as it is."""
        copy = CycleState()
        copy._data = dict(self._data)
        return copy


class Plugin:
    name: ClassVar[str] = ""
    events: ClassVar[frozenset[ClusterEvent]] = frozenset()


class PreFilterPlugin(Plugin):
    def pre_filter(self, state: CycleState, pod: Pod) -> Status:
        raise NotImplementedError


class FilterPlugin(Plugin):
    def filter(self, state: CycleState, pod: Pod, node: NodeSnapshot) -> Status:
        raise NotImplementedError


class PostFilterPlugin(Plugin):
    """After a refusal: may make the pod placeable later (preemption), never binds it now."""

    def post_filter(self, state: CycleState, pod: Pod, node: NodeSnapshot, refusal: Status,
                    cluster: "Cluster") -> Status:
        raise NotImplementedError

    def post_filter_gang(self, refused: "Sequence[tuple[CycleState, Pod, NodeSnapshot, Status]]",
                         cluster: "Cluster") -> "tuple[Status, int | None]":
        """A gang's refused members (each with its decision's state, node and refusal), all acted
        for or none: the status, and the index of the member nothing here can help (the gang waits
        on its events). SKIP: the plugin does nothing for gangs."""
        return SKIP, None


class ReservePlugin(Plugin):
    def reserve(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: "Cluster") -> Status:
        raise NotImplementedError

    def unreserve(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: "Cluster") -> None:
        raise NotImplementedError


class PermitPlugin(Plugin):
    def permit(self, state: CycleState, pod: Pod, node: NodeSnapshot) -> Status:
        raise NotImplementedError


class PreBindPlugin(Plugin):
    def pre_bind(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: "Cluster") -> Status:
        raise NotImplementedError


class BindPlugin(Plugin):
    def bind(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: "Cluster") -> Status:
        raise NotImplementedError


class Cluster(Protocol):
    """The I/O the phases after Filter ask of the shell. Every call raises kubeapi.errors.APIError
    on failure; reads of something absent return None."""

    def snapshot(self, node: str) -> NodeSnapshot: ...
    def assume(self, pod: Pod, node: NodeSnapshot, devices: tuple[str, ...]) -> bool: ...
    def forget(self, pod: Pod, node: str) -> None: ...
    def each(self, calls: "Sequence[Callable[[], Status]]") -> "list[Status]":
        """Each call's Status, in order; concurrently where the shell can (a gang's Bindings)."""
    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...
    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...
    def read_record(self, node: str, device: str) -> Any: ...
    def create_record(self, body: Mapping[str, Any]) -> Any: ...
    def update_record(self, name: str, body: Mapping[str, Any]) -> Any: ...
    def delete_record(self, name: str, resource_version: str) -> None: ...
    def read_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...
    def create_claim(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def update_claim(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def update_claim_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    # Preemption (plugins/defaultpreemption.py)
    def pdbs(self, node: NodeSnapshot) -> Sequence[Mapping[str, Any]]:
        """The PodDisruptionBudgets of the namespaces of the node's pods."""
    def members_of(self, workload: tuple[str, ...]) -> Sequence[tuple[str, Any]]:
        """(node, fit.PodInfo) of each bound pod of the workload (a gang's members)."""
    def nominate(self, pod: Pod, node: str) -> None: ...
    def evict(self, namespace: str, name: str, uid: str) -> None: ...
    def mark_preempted(self, namespace: str, name: str, uid: str, reason: str, condition_message: str,
                       event_message: str) -> None:
        """After its eviction: the victim's DisruptionTarget condition, then its Preempted Event."""
