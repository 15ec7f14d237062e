"""kubectl gpu-scheduler plan | explain: arguments in, files and API reads, formatted core answers out.

Exit status: 0 every pod is (or would be) placed; 1 at least one would not be; 2 the command could
not answer (usage, unreadable or invalid input, kubeconfig or API errors), with a one-line message.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from gpu_scheduler import plan as core
from gpu_scheduler.devices import CUDA, NVIDIA, device_env
from gpu_scheduler import ANNOTATION
from gpu_scheduler.placement import NotPlaceable, map_text, resolve

from . import files, output

PROG = "kubectl gpu-scheduler"
OK, NOT_PLACEABLE, ERROR = 0, 1, 2


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, as the rest of the command's errors
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def parser() -> argparse.ArgumentParser:
    top = Parser(prog=PROG, description="Where gpu-scheduler puts each replica, before and after applying.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser)

    def common(command):
        command.add_argument("-o", "--output", choices=output.FORMATS, default="table")
        command.add_argument("-n", "--namespace", help="namespace (default: the context's, as kubectl)")
        command.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
        command.add_argument("--context", help="kubeconfig context (default: the current context)")

    plan = commands.add_parser("plan", help="each replica's node and env, from a manifest",
                               description="One row per pod a StatefulSet, Job or Pod manifest creates: "
                               "index, pod name, node, CUDA_VISIBLE_DEVICES and the env nvidia mode sets.")
    plan.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                      help="manifest file or directory; - reads stdin; repeatable")
    plan.add_argument("--cluster", action="store_true",
                      help="also say what bind would decide now (node, readiness, taints, GPU capacity)")
    common(plan)
    explain = commands.add_parser("explain", help="a pod in the cluster: its entry, env, Events, next resync")
    explain.add_argument("pod", metavar="POD")
    common(explain)
    return top


def connect(args):
    """bind's client, configured as kubectl would be; and the namespace to use."""
    from kubeapi.client import Kube, load_kubectl_configuration
    from kubernetes.config import ConfigException

    from .cluster import Cluster

    try:
        configuration, namespace = load_kubectl_configuration(args.kubeconfig, args.context)
    except (ConfigException, OSError, ValueError, TypeError) as error:
        raise UsageError(f"kubeconfig: {error}") from None
    return Cluster(Kube(configuration)), args.namespace or namespace


# -- plan ---------------------------------------------------------------------------------------
def _workloads(documents, namespace: str, explicit: bool, errors: list[str]):
    for document in documents:
        where = f"{files.shown(document.source)}: document {document.number}"
        try:
            for obj in core.objects_in(document.content):
                work = core.workload(obj, namespace)
                if work is None:
                    continue
                where_named = f"{where} ({work.kind} {work.namespace}/{work.name})"
                if explicit and work.namespace != namespace:
                    errors.append(f"{where_named}: the namespace of the object ({work.namespace}) does not match"
                                  f" --namespace {namespace}")
                    continue
                try:
                    yield document, core.plan(work)
                except core.ManifestError as error:
                    errors.append(f"{where_named}: {error}")
        except core.ManifestError as error:
            errors.append(f"{where}: {error}")


def _cluster_check(cluster, row: core.Row) -> core.Note | None:
    """What bind would decide for the row's pod now; None: it would bind (or the row has no node)."""
    if not row.node:
        return None
    node = cluster.node(row.node)
    problem = core.bind_problem(row.pod_object, node, row.placement, cluster.pods_on(row.node) if node else ())
    return core.Note(core.UNSCHEDULABLE, problem) if problem else None


def run_plan(args, stdin) -> tuple[dict[str, Any], list[str]]:
    cluster, namespace = connect(args) if args.cluster else (None, args.namespace or "default")
    errors: list[str] = []
    workloads = []
    for document, plan in _workloads(files.read(args.filename, stdin), namespace, bool(args.namespace), errors):
        rows = [output.row_dict(row, _cluster_check(cluster, row), True) if cluster else output.row_dict(row)
                for row in plan.rows]
        workloads.append(output.workload_dict(document.source, document.number, plan, rows))
    if not workloads and not errors:
        errors.append(f"{', '.join(args.filename)}: no Pod, StatefulSet or Job with the gpu-scheduling-map annotation")
    return {"workloads": workloads, "placeable": all(w["placeable"] for w in workloads)}, errors


# -- explain ------------------------------------------------------------------------------------
def _event(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": event.get("type"), "reason": event.get("reason"), "count": event.get("count") or 1,
            "lastTimestamp": event.get("lastTimestamp") or event.get("eventTime") or "",
            "message": event.get("message")}


def run_explain(args) -> dict[str, Any]:
    cluster, namespace = connect(args)
    pod = cluster.pod(namespace, args.pod)
    if pod is None:
        raise UsageError(f'pods "{args.pod}" not found in namespace {namespace}')
    answer: dict[str, Any] = {"namespace": namespace, "name": args.pod,
                              "node": (pod.get("spec") or {}).get("nodeName") or None}
    node_name, env = None, core.device_env_of(pod)
    try:
        if map_text(pod) is None:
            raise NotPlaceable("NoAnnotation", f"the pod has no {ANNOTATION} annotation")
        resolved = resolve(pod)
        placement = resolved.placement
        node_name = placement.node
        answer.update(index=resolved.index, entry=f"{resolved.index}={placement.node}:{placement.visible_devices}")
        wanted = [(mode, device_env(placement, mode)) for mode in (CUDA, NVIDIA)]
        given = [e for e in env.values() if e]
        matching = [mode for mode, values in wanted if given and all(e == values for e in env.values())]
        answer["env_check"] = (f"matches the map entry ({matching[0]} mode)" if matching else
                               "differs from the map entry: the pod was admitted without the webhook, or the map"
                               " changed after it was created")
    except NotPlaceable as why:
        answer.update(index=None, entry=None, problem={"reason": why.reason, "message": why.message})
    answer["env"] = env
    answer["podScheduled"] = core.pod_scheduled(pod)
    answer["events"] = [_event(e) for e in core.scheduler_events(cluster.events(pod))]
    unbound = not answer["node"]
    node = cluster.node(node_name) if node_name and unbound else None
    pods_on = cluster.pods_on(node_name) if node is not None else ()
    nxt = core.next_resync(pod, node, pods_on)
    answer["nextResync"] = {"action": nxt.action, "node": nxt.node or None, "reason": nxt.reason,
                            "message": nxt.message}
    answer["placeable"] = nxt.placeable
    return answer


# -- main ---------------------------------------------------------------------------------------
def _say(text: str, stream) -> None:
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def main(argv: Sequence[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        args = parser().parse_args(argv)
        if args.command == "plan":
            answer, errors = run_plan(args, stdin)
            if answer["workloads"]:
                _say(output.render(answer, args.output, output.plan_table), stdout)
            for error in errors:
                _say(f"error: {error}\n", stderr)
            return ERROR if errors else (OK if answer["placeable"] else NOT_PLACEABLE)
        answer = run_explain(args)
        _say(output.render(answer, args.output, output.explain_table), stdout)
        return OK if answer["placeable"] else NOT_PLACEABLE
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else OK
    except (UsageError, files.InputError) as error:
        _say(f"error: {error}\n", stderr)
        return ERROR
    except Exception as error:  # API errors, and anything unforeseen: one line, never a traceback
        _say(f"error: {_api_problem(error)}\n", stderr)
        return ERROR


def _api_problem(error: Exception) -> str:
    import json

    import urllib3
    from kubernetes.client.exceptions import ApiException

    if isinstance(error, ApiException):
        try:
            message = json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            message = error.reason
        return f"the Kubernetes API answered {error.status}: {message}"
    if isinstance(error, urllib3.exceptions.HTTPError):
        return f"cannot reach the Kubernetes API: {error}"
    return f"unexpected {type(error).__name__}: {error}"
