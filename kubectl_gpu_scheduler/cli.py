"""kubectl gpu-scheduler plan | explain | suggest: arguments in, files and API reads, formatted core answers out.

Exit status: 0 every pod is (or would be) placed; 1 at least one would not be; 2 the command could
not answer (usage, unreadable or invalid input, kubeconfig or API errors), with a one-line message.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from importlib import metadata
from typing import Any, Sequence

from gpu_scheduler import plan as core
from gpu_scheduler import suggest as suggesting
from gpu_scheduler.suggest import PACK, SPREAD
from gpu_scheduler.devices import CUDA, DRA, NVIDIA, device_env
from gpu_scheduler.plugins.dynamicresources import allocator as dra
from gpu_scheduler.plugins.dynamicresources.allocator import uses_dra
from gpu_scheduler import ANNOTATION, SCHEDULER_NAME
from gpu_scheduler.framework.runtime import Framework
from gpu_scheduler.plugins.config import DEFAULT_NAMESPACE, SchedulerConfig
from gpu_scheduler.plugins.registry import new_framework
from gpu_scheduler.fit import is_terminal, pool_entry, workload as workload_of
from gpu_scheduler.placement import POOL_UNASSIGNED, NotPlaceable, map_text, pool_of, resolve
from gpu_scheduler.quota import counted as quota_requests_of
from gpu_scheduler.quota import with_quota_requests_of
from gpu_scheduler.schedmap import is_dns_label, is_dns_subdomain

from . import files, output

PROG = "kubectl gpu-scheduler"
SCRIPT = "kubectl-gpu_scheduler"  # the executable kubectl runs for `kubectl gpu-scheduler`
DISTRIBUTION = "gpu-scheduler"
OK, NOT_PLACEABLE, ERROR = 0, 1, 2
POD_TYPES = ("pod", "pods", "po")  # how kubectl names the resource in TYPE/NAME and TYPE NAME
CANNOT_ANSWER = "  2  the command could not answer: usage, invalid input, kubeconfig or API errors"
EXIT_STATUS = f"""exit status:
  0  every pod is (or would be) placed
  1  at least one pod would not be placed
{CANNOT_ANSWER}"""


def version() -> str:
    try:
        return f"v{metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return f"unknown (the {DISTRIBUTION} package is not installed: pip install .)"


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, as the rest of the command's errors
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


TOP_EXAMPLES = f"""examples:
  # where each replica of a StatefulSet goes, before applying it
  {PROG} plan -f check/statefulset.yaml

  # why a pod stays Pending
  {PROG} explain pod/gpu-scheduler-check-2 -n default

{EXIT_STATUS}"""
PLAN_EXAMPLES = f"""examples:
  # every pod a manifest creates: index, name, node, CUDA_VISIBLE_DEVICES
  {PROG} plan -f check/statefulset.yaml

  # add the env the opt-in nvidia mode sets (NVIDIA MODE column)
  {PROG} plan -f check/statefulset.yaml -o wide

  # several files, a directory, stdin; JSON for scripts
  {PROG} plan -f manifests/ -f job.yaml
  cat check/statefulset.yaml | {PROG} plan -f - -o json

  # also what bind would decide now, by its own plugins: node, taints, fit, GPUs held, DRA
  {PROG} plan -f check/statefulset.yaml --cluster --context kind-gpu-scheduler

  # a Deployment's pool: one row per entry, and whether a rollout's surge has entries
  {PROG} plan -f examples/deployment-vllm.yaml --cluster

{EXIT_STATUS}"""
EXPLAIN_EXAMPLES = f"""examples:
  # a pod in the context's namespace
  {PROG} explain gpu-scheduler-check-2

  # named as kubectl names it: pod/NAME, pods/NAME, po/NAME or pod NAME
  {PROG} explain pod/gpu-scheduler-check-2 -n default
  {PROG} explain pod gpu-scheduler-check-2 --namespace=default

  # as YAML, for scripts
  {PROG} explain po/gpu-scheduler-check-2 -o yaml

exit status:
  0  the pod is placed, or bind places it now (or leaves it to another scheduler)
  1  bind keeps the pod Pending: a plugin refuses it
{CANNOT_ANSWER}"""


SUGGEST_EXAMPLES = f"""examples:
  # a map giving each replica 2 GPUs, one replica per node first; the manifest, ready to apply
  {PROG} suggest -f statefulset.yaml --gpus 2 -o yaml | kubectl apply -f -

  # fill a node before the next, and write the map into the file
  {PROG} suggest -f statefulset.yaml --gpus 1 --pack --in-place

  # a Deployment's pool: an entry for each replica and each pod a rollout adds (maxSurge)
  {PROG} suggest -f deployment.yaml --gpus 2

exit status:
  0  every replica has its N GPUs: the map is printed (or written)
  1  they do not fit: the message says how many GPUs are free, and where
{CANNOT_ANSWER}"""
SUGGEST_FORMATS = ("table", "yaml", "json")
GPUS_FORMATS = ("table", "wide", "json", "yaml", "grid")
GPUS_EXAMPLES = f"""examples:
  # every GPU, who holds it and who waits for it, then free of total per node and per type
  {PROG} gpus

  # the picture: a node per line, a letter per workload, . free
  {PROG} gpus -o grid --watch

  # one node; the GPUs one namespace's pods hold or wait for; JSON for scripts
  {PROG} gpus --node node4
  {PROG} gpus -n team-a -o json

{CANNOT_ANSWER}"""


def parser() -> argparse.ArgumentParser:
    text = {"formatter_class": argparse.RawDescriptionHelpFormatter}
    top = Parser(prog=PROG, description="Where gpu-scheduler puts each pod, before and after applying: the node\n"
                 "and GPUs from the gpu-scheduling-map annotation, and why a pod is not placed.",
                 epilog=TOP_EXAMPLES, **text)
    top.add_argument("--version", action="version", version=f"{SCRIPT} version {version()}",
                     help="print the plugin's version and exit")
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")

    def common(command, formats):
        command.add_argument("-o", "--output", choices=formats, default="table",
                             help=f"output format: {', '.join(formats)} (default: table)")
        command.add_argument("-n", "--namespace", help="namespace (default: the context's, as kubectl)")
        command.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
        command.add_argument("--context", help="kubeconfig context (default: the current context)")
        command.add_argument("--scheduler-namespace", metavar="NAMESPACE",
                             default=os.environ.get("GPU_SCHEDULER_NAMESPACE") or DEFAULT_NAMESPACE,
                             help="bind's namespace, where it keeps its device records (default: GPU_SCHEDULER_NAMESPACE,"
                             " else %(default)s)")
        command.add_argument("--dra-device-class", metavar="CLASS",
                             default=os.environ.get("GPU_SCHEDULER_DRA_DEVICE_CLASS") or dra.DEFAULT_DEVICE_CLASS,
                             help="DRA mode: the DeviceClass of pods that name none, as bind's"
                             " GPU_SCHEDULER_DRA_DEVICE_CLASS (default: that variable, else %(default)s)")
        command.add_argument("--dra-device-rules", metavar="JSON",
                             default=os.environ.get("GPU_SCHEDULER_DRA_DEVICE_RULES") or dra.DEFAULT_RULES_TEXT,
                             help="DRA mode: the rules from a map index to a device, as bind's"
                             " GPU_SCHEDULER_DRA_DEVICE_RULES (default: that variable, else the built-in rules)")
        command.add_argument("--quota", choices=("true", "false"),
                             default=(os.environ.get("GPU_SCHEDULER_QUOTA") or "true").lower(),
                             help="whether pinned GPUs count against ResourceQuotas, as bind's and mutate's"
                             " GPU_SCHEDULER_QUOTA (default: that variable, else %(default)s)")

    plan = commands.add_parser(
        "plan", help="each pod's node and GPUs, from manifests", epilog=PLAN_EXAMPLES, **text,
        description="One row per pod a StatefulSet, Job, JobSet, LeaderWorkerSet or Pod manifest creates,\n"
        "as its controller will create it (a JobSet: one table per replicated job with the map):\n"
        "index, pod name, node and CUDA_VISIBLE_DEVICES; below the table, its gangs and\n"
        "what would keep a pod from being placed and what looks wrong. A Deployment's pods\n"
        "share the map's entries as a pool: one row per entry, then the replicas (and a\n"
        "rollout's maxSurge) that share them. Reads files only, unless --cluster.")
    plan.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                      help="manifest file or directory; - reads stdin; repeatable")
    plan.add_argument("--cluster", action="store_true",
                      help="also say what bind would decide now: its plugins on each pod's node as it is")
    common(plan, output.PLAN_FORMATS)
    explain = commands.add_parser(
        "explain", help="a pod in the cluster: its entry, env, Events, what bind decides", epilog=EXPLAIN_EXAMPLES,
        **text, description="One pod in the cluster: its index and gpu-scheduling-map entry, the device env\n"
        "each container got (and whether it matches the entry), gpu-scheduler's Events, its\n"
        "PodScheduled condition, and what bind's framework decides for it now: bind it, or\n"
        "keep it waiting in bind's queue, refused by which plugin, until which events.")
    explain.add_argument("pod", nargs="+", metavar="POD", help="NAME, pod/NAME (pods/, po/) or pod NAME")
    common(explain, output.EXPLAIN_FORMATS)
    suggest = commands.add_parser(
        "suggest", help="write a gpu-scheduling-map that fits the cluster as it is now", epilog=SUGGEST_EXAMPLES,
        **text, description="A gpu-scheduling-map giving every replica of a StatefulSet, Indexed Job, JobSet\n"
        "replicated job or LeaderWorkerSet (each group on as few nodes as fit) N GPUs on one\n"
        "node (a Deployment: replicas + maxSurge entries of its pool), from the cluster as it\n"
        "is now: Ready, schedulable nodes, their GPUs (in DRA mode their ResourceSlices'\n"
        "devices, one PCIe root per replica where published), less those other workloads hold\n"
        "(pods, bind's device records, DRA claims). Each entry passes bind's own filters now.\n"
        "Prints the placements (or the manifest, -o yaml|json), or says why the replicas do\n"
        "not fit: how many GPUs are free, and where.")
    suggest.add_argument("-f", "--filename", required=True, metavar="FILE",
                         help="the manifest (a StatefulSet, Indexed Job, JobSet, LeaderWorkerSet or Deployment;"
                         " other objects pass through); - reads stdin")
    suggest.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs for each replica, on one node")
    strategy = suggest.add_mutually_exclusive_group()
    strategy.add_argument("--spread", dest="strategy", action="store_const", const=SPREAD,
                          help="one replica per node first, round-robin: fewest replicas per node (the default)")
    strategy.add_argument("--pack", dest="strategy", action="store_const", const=PACK,
                          help="fill a node before the next")
    suggest.set_defaults(strategy=SPREAD)
    suggest.add_argument("--in-place", action="store_true",
                         help="write the map into FILE (rewritten as YAML or JSON: its comments are not kept)")
    common(suggest, SUGGEST_FORMATS)
    gpus_command = commands.add_parser(
        "gpus", help="every GPU of the cluster: its state, who holds it, who waits for it", epilog=GPUS_EXAMPLES,
        **text, description="One row per GPU of every node (nvidia.com/gpu capacity, or the DRA driver's\n"
        "ResourceSlices): its node, index (and UUID where known), type, state (free, held,\n"
        "shared by N workloads, in flight: recorded and not yet bound, being freed for a\n"
        "preemptor until a time), the pods holding it and their workloads, since when, and\n"
        "the pending pods whose entry names it, with the reason bind gives them (explain's).\n"
        "Then free of total per node and per GPU type. The states are bind's own rules,\n"
        "on the same reads as explain.")
    gpus_command.add_argument("--node", help="only this node's GPUs")
    gpus_command.add_argument("--watch", "-w", action="store_true",
                              help="draw again whenever pods, nodes or bind's records change (from watches)")
    common(gpus_command, GPUS_FORMATS)
    gpus_command.set_defaults(namespace_filter=True)
    return top


def pod_named(words: Sequence[str]) -> str:
    """The pod name in NAME, TYPE/NAME or TYPE NAME, TYPE one of kubectl's names for pods."""
    if len(words) == 2:
        kind, name = words
    elif len(words) == 1 and words[0].count("/") > 1:
        raise UsageError("a pod named in TYPE/NAME form has one slash, as in pod/NAME")
    elif len(words) == 1:
        kind, _, name = words[0].rpartition("/")
    else:
        raise UsageError("explain takes one pod: NAME, pod/NAME or pod NAME")
    if (kind or len(words) == 1 and "/" in words[0]) and kind.lower() not in POD_TYPES:
        raise UsageError(f"explain shows pods, not {core.found(kind)}: name one as NAME, pod/NAME or pod NAME")
    if not is_dns_subdomain(name):
        raise UsageError(f"{core.found(name)} is not a pod name (a DNS-1123 subdomain: lowercase letters, digits,"
                         " '-' and '.', at most 253 characters)")
    return name


def connect(args):
    """bind's client, configured as kubectl would be; and the namespace to use."""
    from kubeapi.client import Kube, load_kubectl_configuration
    from kubeapi.kubeconfig import KubeconfigError

    from .cluster import Cluster

    try:
        configuration = load_kubectl_configuration(args.kubeconfig, args.context)
        client = Kube(configuration)
    except KubeconfigError as error:
        raise UsageError(f"kubeconfig: {error}") from None
    args.server = configuration.host  # for a message when it cannot be reached
    return Cluster(client), args.namespace or configuration.namespace


# -- plan ---------------------------------------------------------------------------------------
def _read_workloads(content, namespace: str, where: str, errors: list[str]):
    """The document's workloads (a JobSet's: one per replicated job with the map), up to the first
    object that cannot be read (its error, naming the document, in `errors`)."""
    try:
        for obj in core.objects_in(content):
            yield from core.workloads(obj, namespace)
    except core.ManifestError as error:
        errors.append(f"{where}: {error}")


def _workloads(documents, namespace: str, explicit: bool, errors: list[str]):
    for document in documents:
        where = f"{files.shown(document.source)}: document {document.number}"
        for work in _read_workloads(document.content, namespace, where, errors):
            where_named = f"{where} ({work.title})"
            if explicit and work.namespace != namespace:
                errors.append(f"{where_named}: the namespace of the object ({work.namespace}) does not match"
                              f" --namespace {namespace}")
                continue
            try:
                yield document, core.plan(work)
            except core.ManifestError as error:
                errors.append(f"{where_named}: {error}")


def framework(args) -> Framework:
    """bind's framework, with bind's settings as the flags give them."""
    return new_framework(SchedulerConfig(args.scheduler_namespace, args.dra_device_class, _rules(args),
                                         args.quota == "true"))


def read_view(cluster, args, pods=(), pdbs=()) -> core.ReadView:
    """What bind's framework reads, as read now: each node once per group of pods decided on it
    (with their claims), the namespace's pods (`pods`: read lazily, only for a pod's group), and
    the PodDisruptionBudgets."""
    return core.ReadView(lambda node, deciding: cluster.gang_snapshot(node, deciding, args.scheduler_namespace),
                         pods, pdbs)


def _rules(args) -> dict[str, dra.Rule]:
    try:
        return dra.parse_rules(args.dra_device_rules)
    except dra.RuleError as error:
        raise UsageError(f"--dra-device-rules: {error}") from None


def dra_claim(cluster, args, pod: dict[str, Any], index: int | None, placement) -> dict[str, Any]:
    """A DRA-mode pod's ResourceClaim: its name, and with a cluster its state and allocation and,
    while it holds no devices, what bind would allocate (or why it cannot)."""
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
    claim_name = (dra.claim_refs(pod) or [dra.claim_name(name)])[0]
    device_class = dra.device_class(pod, args.dra_device_class)
    answer: dict[str, Any] = {"name": claim_name, "deviceClass": device_class}
    if cluster is None:
        return answer
    answer.update(dra.claim_state(cluster.resource_claim(namespace, claim_name), pod))
    if answer["state"] in (dra.ABSENT, dra.PENDING) and placement is not None and index is not None:
        wanted = dra.wanted_devices(namespace, claim_name, index, placement, device_class, _rules(args),
                                    cluster.resource_slices(), dra.allocated(cluster.resource_claims()))
        if not isinstance(wanted, str):  # why not, if not: the DynamicResources plugin's refusal
            answer["wanted"] = [str(device) for _, device in wanted.requests]
    return answer


def admitted(row: core.Row, cluster) -> dict[str, Any]:
    """The row's pod as bind will see it: named, in DRA mode with the claim entry mutate adds, and
    with the UID of the pod of that name where it exists already (what the pod owns, its claim,
    is then its own)."""
    meta = {**(row.pod_object.get("metadata") or {}), "name": row.pod}
    live = cluster.pod(str(meta.get("namespace") or "default"), row.pod)
    if live is not None and (live.get("metadata") or {}).get("uid"):
        meta["uid"] = live["metadata"]["uid"]
    pod = {**row.pod_object, "metadata": meta}
    if live is not None:  # what the API server counted for quotas is the live pod's, not the manifest's
        pod = with_quota_requests_of(pod, live)
        # and its priority is what admission resolved from its priorityClassName (preemption reads it)
        live_spec = live.get("spec") or {}
        pod["spec"] = {**(pod.get("spec") or {}), **{key: live_spec[key] for key in ("priority", "preemptionPolicy")
                                                     if key in live_spec}}
    if row.mode == DRA and not uses_dra(pod):
        pod_spec = dict(pod.get("spec") or {})
        entry = {"name": dra.POD_CLAIM, "resourceClaimName": dra.claim_name(row.pod)}
        pod_spec["resourceClaims"] = [*(pod_spec.get("resourceClaims") or []), entry]
        pod["spec"] = pod_spec
    return pod


def admitted_pool(plan: core.WorkloadPlan, cluster) -> list[dict[str, Any]]:
    """A pool's replicas as bind will see them: the workload's live pods (not finished, not being
    deleted) are the first replicas, a bound one as it is (it holds its entry), a pending one as
    the manifest makes it with the live pod's name and UID (as a StatefulSet's pod of the same
    name is itself); the other replicas are new pods, named by plan."""
    pods = [dict(row.pod_object) for row in plan.rows]
    if not pods:
        return []
    key = workload_of(pods[0])
    live = [p for p in cluster.pods_in(plan.work.namespace)
            if workload_of(p) == key and not is_terminal(p) and not (p.get("metadata") or {}).get("deletionTimestamp")]
    if plan.work.kind == "Pod":  # a bare pod of a pool is itself, by its name: the others of its map are not it
        live = [p for p in live if (p.get("metadata") or {}).get("name") == pods[0]["metadata"].get("name")]
    live.sort(key=lambda p: (pool_entry(p) is None, pool_entry(p) or 0, str((p.get("metadata") or {}).get("name"))))
    admitted_pods = []
    for pod, existing in zip(pods, [*live, *[None] * len(pods)]):
        if existing is not None and (existing.get("spec") or {}).get("nodeName"):
            pod = json.loads(json.dumps(existing))
        elif existing is not None:
            meta = {**pod["metadata"], "name": existing["metadata"].get("name"), "uid": existing["metadata"].get("uid")}
            pod = with_quota_requests_of({**pod, "metadata": meta}, existing)
            live_spec = existing.get("spec") or {}
            pod["spec"] = {**(pod.get("spec") or {}), **{key: live_spec[key] for key in ("priority", "preemptionPolicy")
                                                         if key in live_spec}}
        admitted_pods.append(pod)
    return admitted_pods


def _dra_row(cluster, args, row: core.Row) -> dict[str, Any] | None:
    if row.mode != DRA or not row.node or not row.placeable:
        return None
    pod = {**row.pod_object, "metadata": {**(row.pod_object.get("metadata") or {}), "name": row.pod}}
    return dra_claim(cluster, args, pod, row.index, row.placement)


def _decided_with(work: core.Workload) -> Any:
    """Which workloads' pods a workload's are decided with: a JobSet's replicated jobs, together."""
    return ("JobSet", work.namespace, work.name) if work.kind == "JobSet" else id(work)


def run_plan(args, stdin) -> tuple[dict[str, Any], list[str]]:
    _rules(args)  # refused before anything is read, as bind refuses them at start
    cluster, namespace = connect(args) if args.cluster else (None, args.namespace or "default")
    errors: list[str] = []
    workloads = []
    plans = list(_workloads(files.read(args.filename, stdin), namespace, bool(args.namespace), errors))
    admitted_pods = [(admitted_pool(plan, cluster) if plan.pool else [admitted(row, cluster) for row in plan.rows])
                     if cluster else [] for _, plan in plans]
    # A JobSet's replicated jobs are one workload and one gang: each is decided with the others' pods.
    together: dict[Any, list] = {}
    for (_, plan), pods in zip(plans, admitted_pods):
        together.setdefault(_decided_with(plan.work), []).extend(pods)
    for (document, plan), pods in zip(plans, admitted_pods):
        others = together[_decided_with(plan.work)]
        fw, view = (framework(args), read_view(cluster, args, others, cluster.pdbs())) if cluster else (None, None)
        states = None
        if plan.pool and cluster:  # a pool's replicas, one after another, each on what the earlier ones took
            pooled = core.pool_answers(pods, fw, view)
            answers, states = list(pooled.answers), pooled.entries
        else:
            answers = [core.answer(pod, fw, view) for pod in pods]  # a gang's: its pods are the manifest's
        decided = [a.scheduling for a in answers]
        decided_gangs = tuple({a.gang.name: a.gang for a in answers if a.gang is not None}.values())
        gang = decided_gangs[0] if decided_gangs else plan.gang
        rows = []
        for position, row in enumerate(plan.rows):
            claim = _dra_row(cluster, args, row)
            answer = output.row_dict(row, decided[position]) if cluster else output.row_dict(row)
            if claim is not None:
                answer["claim"] = claim
            rows.append(answer)
        workload = output.workload_dict(document.source, document.number, plan, rows, gang, decided_gangs, states)
        if cluster and args.quota == "true":
            workload["quota"] = cluster.gpu_quotas(plan.work.namespace)
        workloads.append(workload)
    if not workloads and not errors:
        errors.append(f"{', '.join(args.filename)}: no Pod, StatefulSet, Job, JobSet, LeaderWorkerSet or Deployment"
                      " with the gpu-scheduling-map annotation")
    return {"workloads": workloads, "placeable": all(w["placeable"] for w in workloads)}, errors


# -- explain ------------------------------------------------------------------------------------
def _event(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": event.get("type"), "reason": event.get("reason"), "count": event.get("count") or 1,
            "lastTimestamp": event.get("lastTimestamp") or event.get("eventTime") or None,
            "message": event.get("message")}


def run_explain(args) -> dict[str, Any]:
    name = pod_named(args.pod)
    _rules(args)
    cluster, namespace = connect(args)
    pod = cluster.pod(namespace, name)
    if pod is None:
        raise UsageError(f'pods "{name}" not found in namespace {namespace}')
    answer: dict[str, Any] = {"namespace": namespace, "name": name,
                              "node": (pod.get("spec") or {}).get("nodeName") or None}
    node_name, env, placement, pool = None, core.device_env_of(pod), None, None
    try:
        if map_text(pod) is None:
            raise NotPlaceable("NoAnnotation", f"the pod has no {ANNOTATION} annotation")
        pool = pool_of(pod)
        if pool is not None:  # a pool pod: the entry bind gave it, or none yet
            answer["pool"] = {"workload": core.pool_workload(pod), "entries": len(pool.entries), "entry": None}
        resolved = resolve(pod)
        placement = resolved.placement
        node_name = placement.node
        answer.update(index=None if resolved.pooled else resolved.index,
                      entry=f"{resolved.index}={placement.node}:{placement.visible_devices}")
        if resolved.pooled:
            answer["pool"]["entry"] = resolved.index
        modes = (DRA,) if uses_dra(pod) else (CUDA, NVIDIA)  # a pod with the claim entry was admitted in dra
        wanted = [(mode, device_env(placement, mode)) for mode in modes]
        given = [e for e in env.values() if e]
        matching = [mode for mode, values in wanted if given and all(e == values for e in env.values())]
        if resolved.pooled:  # read from the annotations its Binding wrote: the mode mutate gave it, if they match
            matching = [mode for mode in [core.pool_env_mode(pod)] if mode in matching]
        answer["envCheck"] = {"matches": bool(matching), "mode": matching[0] if matching else None}
    except NotPlaceable as why:
        answer.update(index=None, entry=None)
        if why.reason == POOL_UNASSIGNED:  # not bound yet: its containers read the annotations bind will write
            mode = core.pool_env_mode(pod)
            answer["envCheck"] = {"matches": mode is not None, "mode": mode}
        else:
            answer["problem"] = {"reason": why.reason, "message": why.message}
    answer["env"] = env
    refs = core.device_env_refs(pod)
    if refs:
        answer["envFrom"] = refs
    answer["podScheduled"] = core.pod_scheduled(pod)
    answer["events"] = [_event(e) for e in core.scheduler_events(cluster.events(pod))]
    namespace_pods = core.Lazy(lambda: cluster.pods_in(namespace))  # read only for a pod's group
    fw, view = framework(args), read_view(cluster, args, namespace_pods, cluster.pdbs())
    said = core.answer(pod, fw, view)
    decided = said.scheduling
    if pool is not None and answer["pool"]["entry"] is None and said.gang is None and not node_name:
        # pending: each entry as bind sees it now (the one it would take, if any)
        given = {decided.entry: None} if decided.entry is not None else {}
        answer["pool"]["entryStates"] = [output.entry_state_dict(e) for e in core.entry_states(pod, fw, view, given)]
    if said.gang is not None:
        answer["gang"] = output.gang_dict(said.gang)
    answer["scheduling"] = {"action": decided.action, "node": decided.node or None, "plugin": decided.plugin or None,
                            "reason": decided.reason, "message": decided.message,
                            "retriedOn": list(decided.retried_on),
                            **({"entry": decided.entry} if decided.entry is not None else {}),
                            **({"preemption": decided.preemption} if decided.preemption else {})}
    answer["placeable"] = decided.placeable
    if uses_dra(pod):
        answer["claim"] = dra_claim(cluster, args, pod, answer.get("index"), placement if node_name else None)
    if args.quota == "true":
        answer["quota"] = cluster.gpu_quotas(namespace)
        answer["counted"] = {k: str(v) for k, v in quota_requests_of(pod).items()}
    return answer


# -- suggest ------------------------------------------------------------------------------------
SUGGESTED_WITH_MAP = (*core.UNINDEXED_KINDS, "JobSet", "LeaderWorkerSet")  # suggest reads them as if mapped


def _suggested_workloads(documents, namespace: str, explicit: bool) -> list[tuple[Any, core.Workload]]:
    """(the object, its workload) for each StatefulSet, Job, JobSet replicated job and LeaderWorkerSet of the
    documents; UsageError at the first object that cannot be read, naming file and document."""
    found = []
    for document in documents:
        where = f"{files.shown(document.source)}: document {document.number}"
        try:
            for obj in core.objects_in(document.content):
                if obj.get("kind") not in ("StatefulSet", "Job", "Pod", *SUGGESTED_WITH_MAP):
                    continue
                works = (core.workloads(obj, namespace) if obj.get("kind") in ("StatefulSet", "Job", "Pod")
                         else core.workloads(_with_map(obj), namespace))
                for work in works:
                    if explicit and work.namespace != namespace:
                        raise UsageError(f"{where} ({work.title}): the namespace of the object ({work.namespace})"
                                         f" does not match --namespace {namespace}")
                    found.append((obj, work))
        except core.ManifestError as error:
            raise UsageError(f"{where}: {error}") from None
    return found


def _templates(obj: Any) -> list[Any]:
    """The pod templates suggest writes a map on, in `obj` (a JobSet's: those of its replicated jobs
    whose pods gpu-scheduler places, or that carry a map; if none does, all, so that suggest names
    the fix)."""
    kind = obj.get("kind")
    if kind == "JobSet":
        jobs = suggesting.template_at(obj, ("spec", "replicatedJobs"))
        templates = [suggesting.template_at(job, suggesting.JOBSET_TEMPLATE_PATH)
                     for job in (jobs if isinstance(jobs, list) else [])]
        ours = [t for t in templates if isinstance(t, dict) and (
            isinstance(t.get("spec"), dict) and t["spec"].get("schedulerName") == SCHEDULER_NAME
            or map_text(t) is not None)]
        return ours or templates
    if kind == "LeaderWorkerSet":
        return [suggesting.template_at(obj, path) for path in suggesting.TEMPLATE_PATHS[kind]]
    template: Any = obj
    for key in core.UNINDEXED_KINDS.get(kind, ()):
        template = template.get(key) if isinstance(template, dict) else None
    return [template]


def _with_map(obj: Any) -> Any:
    """A workload as if its pod templates had a map, so that suggest names it (and, for an
    unindexed one, why no map fits it)."""
    copy = json.loads(json.dumps(obj))
    for template in _templates(copy):
        _with_empty_map(template)
    return copy


def _with_empty_map(template: Any) -> None:
    if isinstance(template, dict):
        meta = template.setdefault("metadata", {}) if isinstance(template.get("metadata", {}), dict) else None
        if meta is not None:
            annotations = meta.setdefault("annotations", {})
            if isinstance(annotations, dict):
                annotations.setdefault(ANNOTATION, "")


def run_suggest(args, stdin) -> tuple[list, list, str]:
    """(the documents, the choices or the shortfalls, the file's format) for suggest."""
    _rules(args)
    if args.in_place and args.filename == "-":
        raise UsageError("--in-place edits a file: give -f FILE, not stdin")
    if args.gpus < 1:
        raise UsageError(f"--gpus {args.gpus}: each replica needs at least 1 GPU; give --gpus 1 or more")
    documents = files.read([args.filename], stdin)
    cluster, namespace = connect(args)  # the kubeconfig only: the API is read once the request is sound
    found = _suggested_workloads(documents, namespace, bool(args.namespace))
    if not found:
        raise UsageError(f"{files.shown(args.filename)}: no StatefulSet, Indexed Job, JobSet, LeaderWorkerSet or"
                         f" Deployment to place (suggest writes the map of {suggesting.PLACED})")
    works = [work for _, work in found]
    try:
        for work in works:
            suggesting.check(work, args.gpus)
        config = SchedulerConfig(args.scheduler_namespace, args.dra_device_class, _rules(args), args.quota == "true")
        # A DRA-mode replica, if any, so that the snapshots hold the nodes' slices and every claim's devices.
        first = next((w for w in works if suggesting.dra_mode(w)), works[0])
        sample = suggesting.candidate_pod(first, suggesting.placed_indexes(first)[0], "")
        snapshots = [cluster.snapshot(name, sample, args.scheduler_namespace) for name in cluster.nodes()]
        results = suggesting.suggest(works, args.gpus, args.strategy, snapshots, framework(args), config)
    except suggesting.SuggestError as error:
        raise UsageError(str(error)) from None
    for (obj, _), result in zip(found, results):
        if isinstance(result, suggesting.Placed):
            suggesting.annotate(obj, result.map_text, result.work.part)
    return documents, results, "json" if args.filename.endswith(".json") else "yaml"


# -- main ---------------------------------------------------------------------------------------
def _say(text: str, stream) -> None:
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def main(argv: Sequence[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    args = None
    try:
        with contextlib.redirect_stdout(stdout):  # --help and --version, to the caller's stream
            args = parser().parse_args(argv)
        if args.namespace is not None and not is_dns_label(args.namespace):
            raise UsageError(f"-n/--namespace: {core.found(args.namespace)} is not a namespace name"
                             " (a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters)")
        if args.command == "suggest":
            documents, results, form = run_suggest(args, stdin)
            short = [r for r in results if isinstance(r, suggesting.Shortfall)]
            if short:
                for result in short:
                    _say(f"error: {result.message}\n", stderr)
                return NOT_PLACEABLE
            objects = [d.content for d in documents if d.content is not None]
            if args.in_place:
                text = output.manifest_text(objects, form)
                with open(args.filename, "w", encoding="utf-8") as written:
                    written.write(text)
            if args.output == "table" or args.in_place:
                _say(output.suggest_table(results, args.filename if args.in_place else None), stdout)
            else:
                _say(output.manifest_text(objects, args.output), stdout)
            return OK
        if args.command == "plan":
            answer, errors = run_plan(args, stdin)
            if answer["workloads"]:
                _say(output.render(answer, args.output, output.plan_table), stdout)
            for error in errors:
                _say(f"error: {error}\n", stderr)
            return ERROR if errors else (OK if answer["placeable"] else NOT_PLACEABLE)
        if args.command == "gpus":
            return run_gpus(args, stdout)
        answer = run_explain(args)
        _say(output.render(answer, args.output, output.explain_table), stdout)
        return OK if answer["placeable"] else NOT_PLACEABLE
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else OK
    except (UsageError, files.InputError) as error:
        _say(f"error: {error}\n", stderr)
        return ERROR
    except Exception as error:  # API errors, and anything unforeseen: one line, never a traceback
        _say(f"error: {_api_problem(error, getattr(args, 'server', None))}\n", stderr)
        return ERROR


def run_gpus(args, stdout) -> int:
    """`gpus`: the view once, or (--watch) drawn again on every change until interrupted."""
    import threading

    from . import gpus

    cluster, _ = connect(args)
    fw = framework(args)

    def answer_for(pending):
        pdbs = cluster.pdbs()

        def answer(pod):
            namespace = (pod.get("metadata") or {}).get("namespace") or "default"
            return core.answer(pod, fw, read_view(cluster, args, core.Lazy(lambda: cluster.pods_in(namespace)), pdbs))
        return answer

    reads = gpus.Reads(cluster.api, args.scheduler_namespace, cluster.keep)
    tty = hasattr(stdout, "isatty") and stdout.isatty()

    def draw_now() -> str:
        cluster.forget()  # every draw reads the cluster anew
        return gpus.render(gpus.view_now(reads, answer_for, args.node, args.namespace), args.output, tty)
    if not args.watch:
        _say(draw_now(), stdout)
        return OK
    stop = threading.Event()

    def draw():
        text = draw_now()
        _say(("\x1b[H\x1b[2J" if tty else "") + text + ("" if tty else "\n"), stdout)
    try:
        gpus.watch(cluster.api, args.scheduler_namespace, draw, stop)
    except gpus.WatchRefused as refused:
        raise UsageError(f"gpus --watch: {refused}") from None
    except KeyboardInterrupt:
        stop.set()
    return OK


def _api_problem(error: Exception, server: str | None) -> str:
    from kubeapi.errors import APIError

    if isinstance(error, APIError):
        return error.message if not error.status else f"the Kubernetes API answered {error.status}: {error.message}"
    return f"unexpected {type(error).__name__}: {error}"
