"""The scheduling framework's extension points, after kube-scheduler's
(pkg/scheduler/framework/interface.go): PreEnqueue decides whether a pod enters the queue at all;
then one cycle for the pod and the pods scheduled with it (its PodGroup, a gang): PreFilter (its
result names the candidate nodes), Filter (each candidate), PostFilter (only when refused),
Reserve, Permit, PreBind and Bind; Unreserve undoes Reserve when a later phase fails. Every plugin
says what it is (`name`) and which cluster events can undo its refusal (`events`, kube-scheduler's
EventsToRegister), and answers with a typed Status.

Filters are pure functions of the pod and an immutable NodeSnapshot. The I/O of the later phases
goes through the handle the shell passes to each cycle; each plugin declares, in its own module,
the narrow protocol it uses of that handle (its listers and writers), so a new plugin never edits
this file. The framework's own part of the handle is `Cluster` below."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Mapping, Protocol, Sequence

from .events import ClusterEvent
from .snapshot import NodeSnapshot

if TYPE_CHECKING:  # mutate's image has no kubeapi, and imports plugins (NodeAffinity) for their checks
    from kubeapi.errors import APIError
    from ..podinputs import PodInputs

Pod = Mapping[str, Any]


class Code(enum.Enum):
    SUCCESS = "Success"
    # Refused now; a registered cluster event (or the pod changing) may change the answer.
    UNSCHEDULABLE = "Unschedulable"
    # Refused for a reason that evicting pods cannot change (a taint, a selector, a missing node, the
    # pod's map): PostFilter (preemption) does not try; its cluster events still retry the pod.
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    # The API failed, or the cluster changed under the attempt: not a verdict on the pod.
    ERROR = "Error"
    WAIT = "Wait"  # Permit: the pod goes with its PodGroup (a gang member waits for the quorum)
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
    # A SUCCESS of Bind that this attempt did not cause: the pod was bound to this node already
    # (another instance, or an earlier attempt whose answer was lost). Its records stay; no Event.
    already_bound: bool = False

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)

    @property
    def refused(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    @property
    def preemption_may_help(self) -> bool:
        """kube-scheduler's rule: only an Unschedulable refusal runs PostFilter."""
        return self.code is Code.UNSCHEDULABLE


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def unschedulable(plugin: str, message: str, reason: str = "Unschedulable") -> Status:
    return Status(Code.UNSCHEDULABLE, plugin, message, reason)


def unresolvable(plugin: str, message: str, reason: str = "Unschedulable") -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, plugin, message, reason)


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


# CycleState key that the PreFilter plugin choosing the pod's devices writes (MapEntry): the
# devices the pod takes on its node. The shell's cache counts them from assume until the watch
# shows the pod bound, so two attempts of one instance never give one device twice.
DEVICES = "Framework/devices"


# CycleState key: the pod's PodInputs (gpu_scheduler/podinputs.py), written by the framework before
# PreFilter: what every plugin reads of the pod being decided.
POD_INPUTS = "Framework/pod-inputs"


def inputs(state: CycleState, pod: Pod) -> "PodInputs":
    """The pod's inputs as its cycle worked them out (worked out now for a state that has none: a
    test's, or a filter run on its own)."""
    found = state.read(POD_INPUTS)
    if found is None:
        from ..podinputs import PodInputs  # the core's: imports fit, which this module must not import first
        found = PodInputs.of(pod)
        state.write(POD_INPUTS, found)
    return found


# CycleState key: the annotations the pod's Binding writes on it (the devices it is given, a pool
# entry), written by the PreFilter plugin choosing them. The pod is assumed with them, so that the
# cache counts what it holds from assume on, as it will once the watch shows it bound.
BOUND_ANNOTATIONS = "Framework/bound-annotations"


@dataclass(frozen=True)
class Candidate:
    """One place PreFilter offers a pod that may go to any of several (a pool's entries): its node,
    how refusals name it, and what choosing it writes in the cycle state before Filter runs."""

    node: str
    label: str
    writes: Mapping[str, Any]


@dataclass(frozen=True)
class Candidates:
    """The places a pod may take, in the order to try them: the first that passes every filter is
    the pod's. When none does, the refusal says `none_fits`, each candidate's reason, and `fix`."""

    options: tuple[Candidate, ...]
    none_fits: str
    fix: str = ""


@dataclass(frozen=True)
class PreFilterResult:
    """PreFilter's answer (kube-scheduler's PreFilterResult and Status in one value): the status,
    and the nodes the pod may go to (None: any; the runtime intersects every plugin's). A plugin
    that chooses among places (a pool's entries) names them in `candidates`: the framework tries
    them in order, on the nodes every plugin allows."""

    status: Status = SUCCESS
    node_names: frozenset[str] | None = None
    candidates: Candidates | None = None


ANY_NODE_RESULT = PreFilterResult()


@dataclass(frozen=True)
class PodGroup:
    """The pods scheduled together with a pod in one cycle (a gang; kube-scheduler's PodGroup):
    its pending members in index order, the pod among them, and the names of those bound already,
    which count toward `min_count`. A pod that belongs to no group is a group of one."""

    name: str  # as users see it: <namespace>/<controller name>
    min_count: int
    pending: tuple[Mapping[str, Any], ...] = ()
    bound: tuple[str, ...] = ()
    plugin: str = ""  # the PodGroup plugin that formed it; '' for a pod alone
    # Each pending member's PodInputs, in the order of `pending`: worked out once, when the group
    # is formed (the PodGroup plugin reads its members through them), and read by their cycle.
    pending_inputs: tuple["PodInputs", ...] = ()

    @property
    def alone(self) -> bool:
        return not self.plugin


class PermitStage(enum.Enum):
    """Where the cycle asks a group's quorum: after Filter (enough placeable, nothing reserved yet:
    a group that cannot complete holds nothing while it waits) and after Reserve (enough reserved)."""

    FILTERED = "filtered"
    RESERVED = "reserved"


class Plugin:
    name: ClassVar[str] = ""
    events: ClassVar[frozenset[ClusterEvent]] = frozenset()


class PreEnqueuePlugin(Plugin):
    """Before the queue: a pod refused here is not tried at all (kube-scheduler's PreEnqueue),
    holds nothing and gets no Event; the cycle never sees it."""

    def pre_enqueue(self, pod: Pod) -> Status:
        raise NotImplementedError


class PodGroupPlugin(Plugin):
    """Which pods go through the cycle with `pod`, and how many of them must be placed together;
    None: the pod goes alone. `cluster` offers the plugin's listers (its own protocol). The pod is
    read through its PodInputs, worked out once by the framework."""

    def pod_group(self, pod: Pod, mine: "PodInputs", cluster: Any) -> PodGroup | None:
        """`mine`: the pod's inputs. The group gives each pending member's (PodGroup.pending_inputs)."""
        raise NotImplementedError

    def group_name(self, mine: "PodInputs") -> str | None:
        """The name of the group of the pod whose inputs are `mine`, without forming it (no I/O): the
        key its cycle is serialized on. None: the pod goes alone."""
        raise NotImplementedError


class PreFilterPlugin(Plugin):
    def pre_filter(self, state: CycleState, pod: Pod) -> PreFilterResult:
        raise NotImplementedError


class FilterPlugin(Plugin):
    def filter(self, state: CycleState, pod: Pod, node: NodeSnapshot) -> Status:
        raise NotImplementedError


@dataclass(frozen=True)
class Refusal:
    """One pod refused on its node, as PostFilter sees it: the state its filters left, and why."""

    pod: Pod
    state: CycleState
    node: NodeSnapshot
    status: Status


class PostFilterPlugin(Plugin):
    """After a refusal: may make the group placeable later (preemption), never binds it now.
    `select` is the pure choice on the snapshots (what explain and plan show); `post_filter` acts
    on it. Both take every refused member of the group: all are helped, or none."""

    def select(self, group: PodGroup, refused: Sequence[Refusal], cluster: Any) -> "PostFilterResult":
        raise NotImplementedError

    def post_filter(self, group: PodGroup, refused: Sequence[Refusal], cluster: Any) -> "PostFilterResult":
        raise NotImplementedError


@dataclass(frozen=True)
class PostFilterResult:
    """What PostFilter came to: `status` SUCCESS (it acted: victims evicted), UNSCHEDULABLE (nothing
    done, `status.message` says why, '' to add nothing), ERROR (an API failure: the attempt's);
    `outcome`: its short result for the metrics (Preempted, None, Waiting, Lost, Error); `blocked`:
    the index in `refused` of the member nothing can help (its events are the ones to wait on)."""

    status: Status
    outcome: str = ""
    blocked: int | None = None
    # explain's words where they differ from the Event's (who *would* be preempted)
    explained: str = ""


class ReservePlugin(Plugin):
    def reserve(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: Any) -> Status:
        raise NotImplementedError

    def assume(self, state: CycleState, pod: Pod, node: NodeSnapshot) -> NodeSnapshot:
        """What Reserve would hold, on a snapshot (a dry run places one pod after another on it:
        suggest). By default Reserve holds nothing that the snapshot's pods do not show."""
        return node

    def unreserve(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: Any) -> None:
        raise NotImplementedError


class PermitPlugin(Plugin):
    def permit(self, state: CycleState, pod: Pod, node: NodeSnapshot) -> Status:
        """One pod: SUCCESS, SKIP, a refusal, or WAIT (it goes with its group: see permit_group)."""
        raise NotImplementedError

    def permit_group(self, group: PodGroup, stage: PermitStage, ready: int, waits_on: str = "",
                     refusal: Status | None = None) -> Status:
        """The group's quorum at `stage`: `ready` members placeable (FILTERED) or reserved
        (RESERVED), bound ones not counted; `waits_on` and `refusal`: the first member refused and
        why. SKIP: this plugin does not decide for the group."""
        return SKIP


class PreBindPlugin(Plugin):
    def pre_bind(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: Any) -> Status:
        raise NotImplementedError


class BindPlugin(Plugin):
    def bind(self, state: CycleState, pod: Pod, node: NodeSnapshot, cluster: Any) -> Status:
        raise NotImplementedError


class Cluster(Protocol):
    """The framework's own part of the handle a shell passes to each cycle: node snapshots, the
    cache's assume and forget, and a way to run calls side by side. Each plugin declares the rest
    of what it asks (listers, writers) as a protocol in its own module; the shell's handle
    implements them all. Every call raises kubeapi.errors.APIError on failure."""

    def snapshot(self, node: str) -> NodeSnapshot: ...
    def assume(self, pod: Pod, node: NodeSnapshot, devices: tuple[str, ...]) -> bool: ...
    def forget(self, pod: Pod, node: str) -> None: ...
    def each(self, calls: "Sequence[Callable[[], Status]]") -> "list[Status]":
        """Each call's Status, in order; concurrently where the shell can (a gang's Bindings)."""
    def group_lock(self, group: str) -> ContextManager[Any]:
        """Held while a group's cycle runs: one attempt per group at a time in this shell."""
    def assumed(self, pod: Pod) -> bool:
        """The shell is binding the pod, or has bound it and its watch has not shown it yet."""
    def group_formed(self, pods: Sequence[Pod]) -> None:
        """The pods this cycle decides, before their snapshots are taken (what the shell reads for them)."""


class FilterRunner(Protocol):
    """The framework's filter loop, as PostFilter runs it again on trial snapshots."""

    def __call__(self, state: CycleState, pod: Pod, node: NodeSnapshot) -> Status: ...
