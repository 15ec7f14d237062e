"""Formatting: one dict per answer (what -o json and -o yaml print: data, the messages aside),
and tables for people, which fit 100 columns for the seed StatefulSet; `-o wide` adds columns."""
from __future__ import annotations

import json
from typing import Any, Mapping

import yaml

from gpu_scheduler.plan import (
    FREE, HELD, RETRIED_ANYWAY, TAKEN, EntryState, Gang, PoolPlan, Rollout, Row, Scheduling, WorkloadPlan, counted,
    pool_counted, pool_workload_name,
)
from gpu_scheduler.quota import quota_text

from .files import shown

PLAN_FORMATS = ("table", "wide", "json", "yaml")
EXPLAIN_FORMATS = ("table", "json", "yaml")


def _notes(notes) -> list[dict[str, str]]:
    return [{"reason": n.reason, "message": n.message} for n in notes]


def _env_text(env: Mapping[str, str], without=("CUDA_DEVICE_ORDER",)) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items() if k not in without)


DECISIONS = {"bind": "bind", "wait": "wait", "nothing": "none"}


def row_dict(row: Row, cluster: Scheduling | None = None) -> dict[str, Any]:
    placeable = row.placeable and (cluster is None or cluster.placeable)
    answer: dict[str, Any] = {
        "index": row.index, "pod": row.pod, "node": row.node or None,
        "devices": list(row.devices),
        "mode": row.mode, "env": {"cuda": dict(row.env), "nvidia": dict(row.nvidia_env)},
        "placeable": placeable, "problems": _notes(row.problems), "warnings": _notes(row.warnings),
        **({"gang": row.gang} if row.gang else {}),
        **({"replica": row.replica} if row.replica is not None else {}),
    }
    if cluster is not None:
        answer["cluster"] = {"decision": DECISIONS[cluster.action], "plugin": cluster.plugin or None,
                             "reason": cluster.reason, "message": cluster.message}
        if row.replica is not None:  # a pool's replica: the node and entry bind gives it now
            answer["cluster"].update(node=cluster.node or None, entry=cluster.entry)
    return answer


def entry_state_dict(state: EntryState) -> dict[str, Any]:
    """An entry of a pool as bind sees it now (plan --cluster, explain of a pending pool pod)."""
    return {"state": state.state, "replica": state.replica, "plugin": state.plugin or None,
            "reason": state.reason or None, "message": state.message or None, "entry": state.entry}


def pool_dict(pool: PoolPlan, states: tuple[EntryState, ...] | None = None) -> dict[str, Any]:
    """A pool: its entries (with `states`, each one's state now), the replicas that share them and
    the rollout's surge."""
    rollout = pool.rollout
    by_entry = {s.entry: s for s in states or ()}
    entries = []
    for entry in pool.entries:
        shown = {"entry": entry.entry, "node": entry.node, "devices": list(entry.devices),
                 "env": {"cuda": dict(entry.env), "nvidia": dict(entry.nvidia_env)}, "usable": entry.usable,
                 "problems": _notes(entry.problems), "warnings": _notes(entry.warnings)}
        if entry.entry in by_entry:
            shown["cluster"] = {k: v for k, v in entry_state_dict(by_entry[entry.entry]).items() if k != "entry"}
        entries.append(shown)
    return {"workload": dict(pool.workload), "replicas": pool.replicas, "podsAtOnce": pool.pods_at_once,
            "usableEntries": pool.usable,
            "rollout": None if rollout is None else {
                "strategy": rollout.strategy, "maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable,
                "written": {"maxSurge": rollout.surge or None, "maxUnavailable": rollout.unavailable or None}},
            "entries": entries}


def _pool_counted(work: dict[str, Any]) -> str:
    pool, rollout = work["pool"], work["pool"]["rollout"]
    resolved = None if rollout is None else Rollout(
        rollout["strategy"], rollout["maxSurge"], rollout["maxUnavailable"], rollout["written"]["maxSurge"] or "",
        rollout["written"]["maxUnavailable"] or "")
    return pool_counted(work["kind"], pool["replicas"], resolved)


def workload_dict(source: str, document: int, plan: WorkloadPlan, rows: list[dict[str, Any]],
                  gang: Gang | None = None, gangs: tuple[Gang, ...] = (),
                  states: tuple[EntryState, ...] | None = None) -> dict[str, Any]:
    """`gang`, `gangs`: the plan's gangs as decided on the cluster (plan --cluster), else the plan's
    own. "gang" is the first; "gangs", where a workload forms several (a LeaderWorkerSet's groups),
    all of them. A pool's ("pool"): its entries, with `states` each one's state now (--cluster)."""
    work = plan.work
    answer = {"source": source, "document": document, "kind": work.kind, "namespace": work.namespace,
              "name": work.name, "replicas": work.replicas, "indexed": work.indexed,
              "ordinalsStart": work.ordinals_start, "placeable": all(r["placeable"] for r in rows),
              "pods": rows, "warnings": _notes(plan.warnings)}
    if plan.pool is not None:
        answer["pool"] = pool_dict(plan.pool, states)
    if work.kind in ("JobSet", "LeaderWorkerSet"):
        answer.update({"replicatedJob": work.part} if work.part else {})
        answer.update(groups=work.groups, groupSize=work.group_size)
    if plan.index_source:
        answer["indexSource"] = plan.index_source
    if plan.template_counts:
        answer["templateCounts"] = {"requests": dict(plan.template_counts), "exact": plan.template_counts_exact}
    decided = {g.name: g for g in ((gang,) if gang else ()) + tuple(gangs)}
    every = [decided.get(g.name, g) for g in plan.gangs] or ([gang] if gang else [])
    every += [g for g in decided.values() if g.name not in {e.name for e in every}]
    if every:
        answer["gang"] = gang_dict(every[0])
        if len(every) > 1:
            answer["gangs"] = [gang_dict(g) for g in every]
        answer["placeable"] = answer["placeable"] and all(g.verdict is None or g.verdict.placeable for g in every)
    return answer


# How plan names the index source of a JobSet's or a LeaderWorkerSet's pods (podindex.INDEX_SOURCES).
INDEX_SOURCES = {"JobSet": "JobSet (job-index × completions + completion index)",
                 "LeaderWorkerSet": "LeaderWorkerSet (group-index × size + worker-index, the leader worker 0)"}


def workload_title(work: Mapping[str, Any]) -> str:
    """A workload (as workload_dict gives it) for people: "JobSet team/train, replicated job workers"."""
    part = f", replicated job {work['replicatedJob']}" if work.get("replicatedJob") else ""
    return f"{work['kind']} {work['namespace']}/{work['name']}{part}"


def gang_dict(gang: Gang) -> dict[str, Any]:
    """A gang as data: its members and their states, and bind's verdict on it (None: not decided)."""
    verdict = gang.verdict
    return {"name": gang.name, "size": gang.size, "bound": list(gang.bound), "missing": gang.missing,
            "members": [{"name": m.name, "state": m.state, "node": m.node or None, "plugin": m.plugin or None,
                         "message": m.message or None} for m in gang.members],
            "verdict": None if verdict is None else {"plugin": verdict.plugin or None, "reason": verdict.reason,
                                                     "message": verdict.message}}


def _listed(names: list[str]) -> str:
    """Members in a line: both of two, else the first and the last (-o json lists them all)."""
    return ", ".join(names) if len(names) <= 2 else f"{names[0]} ... {names[-1]}"


def gang_lines(gang: dict[str, Any], indent: str = "  ") -> list[str]:
    """A gang for people: who its members are, and (decided) each one's state and bind's verdict."""
    short = [m["name"].split("/", 1)[-1] for m in gang["members"]]
    missing = f", {gang['missing']} missing" if gang["missing"] else ""
    bound = f", {len(gang['bound'])} bound" if gang["bound"] else ""
    lines = [f"{indent}gang {gang['name']}: {gang['size']} members, bound together or none{bound}{missing}:"
             f" {_listed(short) or '<none>'}"]
    for member in gang["members"]:
        if member["state"] == "refused":
            lines.append(f"{indent}  member {member['name'].split('/', 1)[-1]} refused by {member['plugin']}:"
                         f" {member['message']}")
    verdict = gang["verdict"]
    if verdict is not None:
        lines.append(f"{indent}gang not placeable now: {verdict['message']}" if verdict["reason"] != "Bind" else
                     f"{indent}gang placeable now: {verdict['message']}")
    return lines


def render(answer: dict[str, Any], form: str, table) -> str:
    if form == "json":
        return json.dumps(answer, indent=2) + "\n"
    if form == "yaml":
        return yaml.safe_dump(answer, sort_keys=False, allow_unicode=True, width=1000)
    return table(answer, wide=True) if form == "wide" else table(answer)


def columns(header: list[str], rows: list[list[str]]) -> str:
    cells = [["<none>" if c is None else str(c) for c in line] for line in [header, *rows]]
    widths = [max(len(c) for c in column) for column in zip(*cells)]
    lines = ["   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    return "\n".join(lines) + "\n"


def plan_table(answer: dict[str, Any], wide: bool = False) -> str:
    """One table per workload; `wide` adds the env the opt-in nvidia mode would set."""
    out = []
    for work in answer["workloads"]:
        if work.get("pool"):
            out += _pool_lines(work, wide)
            continue
        where = shown(work["source"])
        how = counted(work["kind"], work["indexed"], work["replicas"], work["ordinalsStart"], work.get("groups"),
                      work.get("groupSize"))
        if work["kind"] in INDEX_SOURCES and work.get("indexSource"):
            how += f"; index: {INDEX_SOURCES.get(work['indexSource'], work['indexSource'])}"
        out.append(f"{workload_title(work)} ({where}, document {work['document']}; {how})\n")
        checked = any("cluster" in p for p in work["pods"])
        gangs = work.get("gangs") or ([work["gang"]] if work.get("gang") else [])
        grouped = len(gangs) > 1  # a column says which gang each pod is in
        header = ["INDEX", "POD", "NODE", "CUDA_VISIBLE_DEVICES", *(["NVIDIA MODE"] if wide else []),
                  *(["GANG"] if grouped else []), "STATUS"]
        lines = []
        for pod in work["pods"]:
            status = ",".join(p["reason"] for p in pod["problems"]) or "ok"
            if checked:
                status = {"bind": "bind now", "none": status}.get(
                    pod["cluster"]["decision"], f"{pod['cluster'].get('plugin')} now")
            nvidia = [_env_text(pod["env"]["nvidia"]) or "<none>"] if wide else []
            gang_column = [pod.get("gang") or "<none>"] if grouped else []
            lines.append(["-" if pod["index"] is None else str(pod["index"]), pod["pod"], pod["node"] or "<none>",
                          ",".join(pod["devices"]) or "<none>", *nvidia, *gang_column, status])
        out.append(columns(header, lines))
        gang_refusals = {g["verdict"]["message"] for g in gangs if g["verdict"] and g["verdict"]["reason"] != "Bind"}
        for pod in work["pods"]:
            who = f"pod {pod['pod']}"
            for problem in pod["problems"]:
                out.append(f"  not placed: {who}: {problem['message']}\n")
            if pod.get("cluster", {}).get("decision") == "wait" and pod["cluster"]["message"] not in gang_refusals:
                out.append(f"  not placed now: {who}: {pod['cluster']['message']}\n")
            for warning in pod["warnings"]:
                out.append(f"  warning: {who}: {warning['message']}\n")
            if pod.get("claim"):
                out.append(f"  claim: {who}: {claim_text(pod['claim'], work['namespace'])}\n")
        out += workload_footer(work, gangs)
    return "".join(out).rstrip("\n") + "\n"


def _entry_status(entry: dict[str, Any]) -> str:
    """An entry's STATUS: its problems; with --cluster, which replica bind gives it now, who holds
    it, free, or the plugin refusing it."""
    state = entry.get("cluster")
    if state is None:
        return ",".join(p["reason"] for p in entry["problems"]) or "ok"
    if state["state"] == TAKEN:
        return f"bind now: replica {state['replica']}" if state["replica"] is not None else "bind now"
    if state["state"] == FREE:
        return "free"
    if state["state"] == HELD:
        return (state["message"] or "held") + (f" (replica {state['replica']})" if state["replica"] is not None else "")
    return f"{state['plugin']} now"


def _pool_lines(work: dict[str, Any], wide: bool) -> list[str]:
    """A pool: one row per entry (ENTRY, NODE, CUDA_VISIBLE_DEVICES, STATUS), then the replicas
    that share them, and what keeps a replica or a rollout from an entry."""
    pool = work["pool"]
    out = [f"{workload_title(work)} ({shown(work['source'])}, document {work['document']}; {_pool_counted(work)})\n"]
    header = ["ENTRY", "NODE", "CUDA_VISIBLE_DEVICES", *(["NVIDIA MODE"] if wide else []), "STATUS"]
    lines = [[str(e["entry"]), e["node"], ",".join(e["devices"]),
              *([_env_text(e["env"]["nvidia"]) or "<none>"] if wide else []), _entry_status(e)]
             for e in pool["entries"]]
    out.append(columns(header, lines))
    replicas, pods = pool["replicas"], work["pods"]
    names = pods[0]["pod"] if pods else f"{work['name']}-*"
    count = len(pool["entries"])
    if replicas is None:
        who = f"its pods ({names})"
    else:
        who = f"{replicas} replica{'s' if replicas != 1 else ''} ({names})"
        if pool["podsAtOnce"] and pool["podsAtOnce"] > replicas:
            who += f", {pool['podsAtOnce']} pods during a rollout,"
    out.append(f"  {who} share {'this entry' if count == 1 else f'these {count} entries'}: each pod takes the first"
               " free one when bind binds it\n")
    if pool["workload"].get("kind") and pool["workload"]["kind"] != work["kind"]:
        out.append(f"  the pool is {pool_workload_name(pool['workload'])}'s\n")
    for entry in pool["entries"]:
        for problem in entry["problems"]:
            out.append(f"  entry {entry['entry']} never given: {problem['message']}\n")
        state = entry.get("cluster")
        if state and state["state"] not in (TAKEN, FREE, HELD):
            out.append(f"  entry {entry['entry']} refused now by {state['plugin']}: {state['message']}\n")
        for warning in entry["warnings"]:
            out.append(f"  warning: {warning['message']}\n")
    gangs = work.get("gangs") or ([work["gang"]] if work.get("gang") else [])
    gang_refusals = {g["verdict"]["message"] for g in gangs if g["verdict"] and g["verdict"]["reason"] != "Bind"}
    said: set[tuple[str, str]] = set()
    waiting: dict[str, list[str]] = {}  # a refusal -> the replicas it refuses (the same for many)
    for pod in pods:
        who = f"replica {pod['replica']}" if pod.get("replica") is not None else f"pod {pod['pod']}"
        for problem in pod["problems"]:
            if problem["reason"] != "NoPoolEntry" and (problem["reason"], problem["message"]) in said:
                continue  # the template's problem: said once
            said.add((problem["reason"], problem["message"]))
            out.append(f"  not placed: {who if problem['reason'] == 'NoPoolEntry' else 'every pod'}:"
                       f" {problem['message'].removeprefix(who + ': ')}\n")
        if pod.get("cluster", {}).get("decision") == "wait" and pod["cluster"]["message"] not in gang_refusals:
            waiting.setdefault(pod["cluster"]["message"], []).append(str(pod.get("replica", pod["pod"])))
    for message, who in waiting.items():
        names = f"replica {who[0]}" if len(who) == 1 else f"replicas {', '.join(who)}"
        out.append(f"  not placed now: {names}: {message}\n")
    out += workload_footer(work, gangs)
    return out


def workload_footer(work: dict[str, Any], gangs) -> list[str]:
    """The lines below a workload's table, an indexed one's or a pool's alike: its gangs, warnings,
    quotas and what Kueue counts per pod; then a blank line."""
    out = []
    for gang in gangs:
        out += [line + "\n" for line in gang_lines(gang)]
    for warning in work["warnings"]:
        out.append(f"  warning: {warning['message']}\n")
    out += [f"  quota: {quota_text(q)}\n" for q in work.get("quota", ())]
    if work.get("templateCounts"):
        requested = ", ".join(f"{k}: {v}" for k, v in sorted(work["templateCounts"]["requests"].items()))
        how = "every entry's" if work["templateCounts"]["exact"] else "the largest entry's: an upper bound"
        out.append(f"  Kueue counts {requested} per pod ({how})\n")
    out.append("\n")
    return out


def claim_text(claim: dict[str, Any], namespace: str) -> str:
    """A DRA-mode pod's ResourceClaim in one line: name, class, state, devices."""
    text = f"ResourceClaim {namespace}/{claim['name']} (DeviceClass {claim['deviceClass']})"
    if "state" not in claim:
        return text
    text += f": {claim['state']}"
    if claim["devices"]:
        text += f" on {claim['node'] or '<no single node>'}: {', '.join(claim['devices'])}"
    if claim["reservedFor"]:
        text += f"; reserved for {', '.join(claim['reservedFor'])}"
    if claim.get("wanted"):
        text += f"; bind would allocate {', '.join(claim['wanted'])}"
    if claim.get("problem"):
        text += f"; bind cannot allocate: {claim['problem']}"
    return text


def explain_table(answer: dict[str, Any]) -> str:
    lines = [f"Pod:            {answer['namespace']}/{answer['name']}"]
    if answer.get("index") is not None:
        lines.append(f"Index:          {answer['index']}")
    pool = answer.get("pool")
    if pool:
        count = f"{pool['entries']} entr{'y' if pool['entries'] == 1 else 'ies'}"
        lines.append(f"Pool:           {pool_workload_name(pool['workload'])}'s pods share the map's {count}; "
                     + (f"this pod holds entry {pool['entry']}" if pool["entry"] is not None else
                        "this pod holds none yet: bind gives it the first free one when it binds it"))
    lines.append(f"Map entry:      {answer.get('entry') or '<none>'}")
    if answer.get("problem"):
        lines.append(f"                {answer['problem']['reason']}: {answer['problem']['message']}")
    lines.append(f"Node:           {answer.get('node') or '<none> (Pending)'}")
    lines.append("Device env:")
    refs = answer.get("envFrom") or {}
    for container, env in answer["env"].items():
        values = " ".join(f"{k}={'<not written yet>' if v is None and k in refs.get(container, {}) else v}"
                          + (f" (from {refs[container][k]})" if k in refs.get(container, {}) else "")
                          for k, v in env.items())
        lines.append(f"  {container}: {values or '<none>'}")
    check = answer.get("envCheck")
    if check and pool and pool["entry"] is None:
        lines.append(f"  read from the annotations bind's Binding writes ({check['mode']} mode)"
                     if check["matches"] else "  not read from the annotations bind's Binding writes: the pod was"
                     " admitted without the webhook, and will not see its entry's GPUs")
    elif check:
        lines.append(f"  matches the map entry ({check['mode']} mode)" if check["matches"] else
                     "  differs from the map entry: the pod was admitted without the webhook, or the map"
                     " changed after it was created")
    if pool and pool.get("entryStates"):
        table = columns(["ENTRY", "STATE", "WHY"],
                        [[str(e["entry"]), "bind now" if e["state"] == TAKEN else e["state"],
                          f"{e['plugin']}: {e['message']}" if e["state"] not in (TAKEN, FREE) else ""]
                         for e in pool["entryStates"]])
        lines.append("Pool entries now:")
        lines += ["  " + line for line in table.splitlines()]
    if answer.get("claim"):
        lines.append(f"DRA claim:      {claim_text(answer['claim'], answer['namespace'])}")
    condition = answer.get("podScheduled")
    if condition:
        detail = ", ".join(filter(None, (condition.get("reason"), condition.get("message"))))
        lines.append(f"PodScheduled:   {condition.get('status') or '<none>'}" + (f" ({detail})" if detail else ""))
    else:
        lines.append("PodScheduled:   <none>")
    events = answer["events"]
    lines.append("Events (gpu-scheduler):" + ("" if events else " <none>"))
    if events:
        table = columns(["TYPE", "REASON", "COUNT", "LAST SEEN", "MESSAGE"],
                        [[e["type"], e["reason"], str(e["count"]), e["lastTimestamp"] or "<unknown>", e["message"]]
                         for e in events])
        lines += ["  " + line for line in table.splitlines()]
    gang = answer.get("gang")
    if gang:
        missing = f", {gang['missing']} missing" if gang["missing"] else ""
        lines.append(f"Gang:           {gang['name']} ({gang['size']} members bound together or none;"
                     f" {len(gang['bound'])} bound{missing})")
        table = columns(["MEMBER", "STATE", "NODE", "WHY"],
                        [[m["name"], m["state"], m["node"] or "<none>",
                          f"{m['plugin']}: {m['message']}" if m["state"] == "refused" else ""]
                         for m in gang["members"]])
        lines += ["  " + line for line in table.splitlines()]
        verdict = gang["verdict"]
        if verdict["message"] != answer["scheduling"]["message"]:
            lines.append(f"  the gang: {verdict['message']}" if verdict["reason"] == "Bind" else
                         f"  the gang waits, refused by {verdict['plugin']}: {verdict['message']}")
    if "quota" in answer:
        counted_as = ", ".join(f"{k}: {v}" for k, v in answer["counted"].items()) or "nothing"
        lines.append(f"Quota:          the pod requests {counted_as}")
        lines += [f"  {quota_text(q)}" for q in answer["quota"]] or ["  no ResourceQuota of the namespace bounds GPUs"]
    decided = answer["scheduling"]
    if decided["action"] == "wait":
        lines.append(f"Scheduling:     waits in bind's queue, refused by {decided['plugin']}: {decided['message']}")
        on = ", ".join([*decided["retriedOn"], "a change of the pod"])
        lines.append(f"                tried again on {on}, {RETRIED_ANYWAY}")
        if decided.get("preemption"):
            lines.append(f"Preemption:     {decided['preemption']}")
    else:
        lines.append(f"Scheduling:     {decided['action']}: {decided['message']}")
    return "\n".join(lines) + "\n"


# -- suggest --------------------------------------------------------------------------------------
class _ManifestDumper(yaml.SafeDumper):
    """YAML as people write manifests: a multi-line string (the map) as a literal block."""


def _text(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _text)


def manifest_text(objects: list[Any], form: str) -> str:
    """The manifest's documents, as YAML (`---` between them) or JSON (one object, or a List)."""
    if form == "json":
        value = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(value, indent=2) + "\n"
    return yaml.dump_all(objects, Dumper=_ManifestDumper, sort_keys=False, allow_unicode=True, width=1000)


def suggest_table(results, edited: str | None = None) -> str:
    """Each workload's replicas, node and devices, then its map as the annotation carries it."""
    out = []
    for result in results:
        work = result.work
        out.append(f"{work.title} ({work.counted};"
                   f" {result.gpus} GPU{'s' if result.gpus != 1 else ''} each)\n")
        if work.pool:  # a pool's entries: one for each pod its rollout runs at once
            out.append(columns(["ENTRY", "NODE", "DEVICES"],
                               [[str(c.index), c.node, ",".join(c.devices)] for c in result.choices]))
            count = len(result.choices)
            surge = count - (work.replicas or 0)
            out.append(f"{count} entr{'y' if count == 1 else 'ies'}: one for each of the {work.replicas} replicas"
                       + (f" and the {surge} more a rollout adds (maxSurge)" if surge > 0 else "")
                       + "; each pod takes the first free one when bind binds it\n")
        else:
            out.append(columns(["INDEX", "POD", "NODE", "DEVICES"],
                               [[str(c.index), c.pod, c.node, ",".join(c.devices)] for c in result.choices]))
        out.append("gpu-scheduling-map:\n" + "".join(f"  {line}\n" for line in result.map_text.splitlines()))
    if edited:
        out.append(f"written to {shown(edited)}\n")
    return "".join(out)
