"""Formatting: one dict per answer (what -o json and -o yaml print), and tables for people."""
from __future__ import annotations

import json
from typing import Any, Mapping

import yaml

from gpu_scheduler.plan import Note, Row, WorkloadPlan

from .files import shown

FORMATS = ("table", "json", "yaml")


def _notes(notes) -> list[dict[str, str]]:
    return [{"reason": n.reason, "message": n.message} for n in notes]


def _env_text(env: Mapping[str, str], without=("CUDA_DEVICE_ORDER",)) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items() if k not in without)


def row_dict(row: Row, cluster: Note | None = None, checked: bool = False) -> dict[str, Any]:
    placeable = row.placeable and cluster is None
    answer: dict[str, Any] = {
        "index": row.index, "pod": row.pod, "node": row.node or None,
        "CUDA_VISIBLE_DEVICES": ",".join(row.devices) or None,
        "mode": row.mode, "env": {"cuda": dict(row.env), "nvidia": dict(row.nvidia_env)},
        "placeable": placeable, "problems": _notes(row.problems), "warnings": _notes(row.warnings),
    }
    if checked:
        answer["cluster"] = ({"decision": "wait", **_notes([cluster])[0]} if cluster
                             else {"decision": "bind" if row.placeable else "none"})
    return answer


def workload_dict(source: str, document: int, plan: WorkloadPlan, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"source": source, "document": document, "kind": plan.kind, "namespace": plan.namespace,
            "name": plan.name, "replicas": plan.replicas, "placeable": all(r["placeable"] for r in rows),
            "pods": rows, "warnings": _notes(plan.warnings)}


def render(answer: dict[str, Any], form: str, table) -> str:
    if form == "json":
        return json.dumps(answer, indent=2) + "\n"
    if form == "yaml":
        return yaml.safe_dump(answer, sort_keys=False, allow_unicode=True, width=1000)
    return table(answer)


def columns(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["   ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *rows]]
    return "\n".join(lines) + "\n"


def plan_table(answer: dict[str, Any]) -> str:
    out = []
    for work in answer["workloads"]:
        where = shown(work["source"])
        out.append(f"{work['kind']} {work['namespace']}/{work['name']} ({where}, document {work['document']};"
                   f" {work['replicas']})\n")
        checked = any("cluster" in p for p in work["pods"])
        header = ["INDEX", "POD", "NODE", "CUDA_VISIBLE_DEVICES", "NVIDIA MODE", "STATUS"]
        lines = []
        for pod in work["pods"]:
            status = ",".join(p["reason"] for p in pod["problems"]) or "ok"
            if checked:
                status = {"bind": "bind now", "none": status}.get(
                    pod["cluster"]["decision"], f"{pod['cluster'].get('reason')} now")
            lines.append(["-" if pod["index"] is None else str(pod["index"]), pod["pod"], pod["node"] or "<none>",
                          pod["CUDA_VISIBLE_DEVICES"] or "<none>", _env_text(pod["env"]["nvidia"]) or "<none>", status])
        out.append(columns(header, lines))
        for pod in work["pods"]:
            who = f"pod {pod['pod']}"
            for problem in pod["problems"]:
                out.append(f"  not placed: {who}: {problem['message']}\n")
            if pod.get("cluster", {}).get("decision") == "wait":
                out.append(f"  not placed now: {who}: {pod['cluster']['message']}\n")
            for warning in pod["warnings"]:
                out.append(f"  warning: {who}: {warning['message']}\n")
        for warning in work["warnings"]:
            out.append(f"  warning: {warning['message']}\n")
        out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def explain_table(answer: dict[str, Any]) -> str:
    lines = [f"Pod:            {answer['namespace']}/{answer['name']}"]
    if answer.get("index") is not None:
        lines.append(f"Index:          {answer['index']}")
    lines.append(f"Map entry:      {answer.get('entry') or '<none>'}")
    if answer.get("problem"):
        lines.append(f"                {answer['problem']['reason']}: {answer['problem']['message']}")
    lines.append(f"Node:           {answer.get('node') or '<none> (Pending)'}")
    lines.append("Device env:")
    for container, env in answer["env"].items():
        lines.append(f"  {container}: {_env_text(env, ()) or '<none>'}")
    if answer.get("env_check"):
        lines.append(f"  {answer['env_check']}")
    condition = answer.get("podScheduled")
    if condition:
        detail = ", ".join(filter(None, (condition.get("reason"), condition.get("message"))))
        lines.append(f"PodScheduled:   {condition.get('status')}" + (f" ({detail})" if detail else ""))
    else:
        lines.append("PodScheduled:   <none>")
    events = answer["events"]
    lines.append("Events (gpu-scheduler):" + ("" if events else " <none>"))
    if events:
        table = columns(["TYPE", "REASON", "COUNT", "LAST SEEN", "MESSAGE"],
                        [[e["type"], e["reason"], str(e["count"]), e["lastTimestamp"], e["message"]] for e in events])
        lines += ["  " + line for line in table.splitlines()]
    nxt = answer["nextResync"]
    lines.append(f"Next resync:    {nxt['action']}: {nxt['message']}")
    return "\n".join(lines) + "\n"
