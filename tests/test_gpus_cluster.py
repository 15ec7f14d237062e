"""`kubectl gpu-scheduler gpus` (issue 45) on the real control plane, run as a user granted
exactly permissions.PLUGIN: each state of a GPU put in place on a node of the test's own (a Node
object without a kubelet, 4 GPUs), and what `gpus -o json` says of it held against what bind did
and wrote (its device records, its Bindings, its FailedScheduling Events) and what `explain` says.

- held: a pinned StatefulSet's pod bound to GPUs 0 and 1;
- shared: two workloads with gpu-scheduler/share-gpus: "true" bound to one GPU; and a GPU at the
  sharing limit (MAX_HOLDERS workloads on bind's record, one with a pod there), which bind refuses
  to one more sharer: shared by MAX_HOLDERS, as bind counts;
- in flight: a device record written (as bind writes it) for a pending pod that bind cannot bind
  (its nodeSelector), within its grace; past the grace the GPU is free, and bind binds there;
- being freed: a high-priority pod preempting a low-priority holder whose termination takes long
  (no kubelet: it stays Terminating), its entry's GPUs nominated for it until a time; once the
  victim is gone the preemptor is bound and holds them;
- free: nothing on the GPU, or only a record of a pod deleted; bind binds a new pod there. Also
  a GPU whose holder finished within its record's grace: bind counts that pod gone and binds
  another workload's pod there at once (no refusal), so gpus must say free, and explain, asked
  while bind is stopped, that bind binds it (explain's Cluster._gone counts a finished pod, and a
  pending pod of ours being deleted, gone, as bind's gone_of does: this case found that it did not).

For each pod that waits, `gpus`'s waiting entry (action, plugin, message) on every GPU its entry
names equals `explain -o json`'s scheduling verdict and bind's FailedScheduling Event for that pod
(its message, and the plugin its gpu-scheduler/plugin annotation names).

Each test but the last runs twice: with the stack's bind alone, and with a second bind instance beside it (its
own process, watches and queue, as Knative's second instance). The states must be the same; and
for each waiting pod the second instance's own answer to that pod's event (result, plugin,
message) must be gpus's; for the free GPU, the second instance alone (the stack's bind stopped
meanwhile) binds the new pod there.

Only the one-shot command is run (`gpus --watch` needs watch verbs that permissions.PLUGIN_WATCH
grants apart). Every wait has a deadline; no fixed sleep.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from gpu_scheduler.fit import SHARE_ANNOTATION, workload
from gpu_scheduler.records import GRACE_SECONDS, MAX_HOLDERS, Record, record_name, workload_key
from test_dra_cluster import admin  # noqa: F401 (a fixture: the situation's)
from test_end_to_end import pod_manifest, statefulset
from test_faults import post_event
from test_pending_reasons_cluster import (  # noqa: F401 (situation: a fixture)
    BIND_NAMESPACE, PLUGIN_ANNOTATION, Pending, binds_event, explained, failed_scheduling, held_at_the_sharing_limit,
    held_by, preempted, situation,
)
from test_plugin_cluster import reader, run  # noqa: F401 (reader: a fixture)
from test_preemption_cluster import play_kubelet, stack_bind_stopped
from test_records_cluster import RECORDS, ready_instance

pytestmark = pytest.mark.controlplane

FREE, HELD, SHARED, IN_FLIGHT, BEING_FREED = "free", "held", "shared", "in-flight", "being-freed"
SECOND = "gpus-second-bind"  # the second instance's identity (HOSTNAME: its Events' reportingInstance)
CLOCK = re.compile(r"\d\d:\d\d:\d\d UTC")


# -- the second bind instance ------------------------------------------------------------------
@pytest.fixture(params=["one bind", "two binds"])
def second(request, stack):
    """None, or a second bind instance (stopped afterwards)."""
    if request.param == "one bind":
        yield None
        return
    instance = ready_instance(stack, HOSTNAME=SECOND)
    yield instance
    instance.stop()


def sees_record(url: str, node: str, device: str) -> bool:
    """The bind instance at `url` has the record of (node, device) in its view (gpu_scheduler_gpus_held)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return any(line.startswith("gpu_scheduler_gpus_held{") and f'node="{node}"' in line
               and f'device="{device}"' in line for line in text.splitlines())


# -- what gpus says --------------------------------------------------------------------------
def gpus(reader: str, node: str) -> dict:
    """`gpus --node <node> -o json`, as the PLUGIN user."""
    code, out, err = run("gpus", "--node", node, "--kubeconfig", reader, "--scheduler-namespace", BIND_NAMESPACE,
                         "-o", "json")
    assert (code, err) == (0, ""), f"gpus exited {code}: {err.strip()!r}; stdout {out[:300]!r}"
    return json.loads(out)


def states(view: dict) -> dict[str, str]:
    return {g["device"]: g["state"] for g in view["gpus"]}


def rows(view: dict) -> dict[str, dict]:
    return {g["device"]: g for g in view["gpus"]}


def waiting_for(view: dict, pod: str) -> dict[str, dict]:
    """{device: the waiting entry of `pod` (namespace/name)} over the view's GPUs."""
    return {g["device"]: w for g in view["gpus"] for w in g["waiting"] if w["pod"] == pod}


def gpus_until(stack, reader: str, node: str, wanted, timeout: float, what: str) -> dict:
    """gpus's view once `wanted(view)` holds (a dict of states: equal to the view's states)."""
    last: dict = {"gpus": []}

    def check():
        nonlocal last
        last = gpus(reader, node)
        return last if (wanted(last) if callable(wanted) else states(last) == wanted) else None
    try:
        return stack.wait_for(check, timeout, what, interval=0.5)
    except TimeoutError as error:
        raise AssertionError(f"{error}; gpus said: {json.dumps(last['gpus'], indent=1)[:3000]}") from None


def record(stack, node: str, device: str) -> Record | None:
    try:
        return Record.of(json.loads(stack.cp.get(f"{RECORDS}/{record_name(node, device)}")))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def clock_of(stamp: str) -> str:
    """An RFC 3339 time of gpus's as bind's messages give it: HH:MM:SS UTC."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").strftime("%H:%M:%S UTC")


def scheduled_at(pod: dict) -> str | None:
    """When the pod was bound: its PodScheduled condition's (True) transition time, once there."""
    return next((c["lastTransitionTime"] for c in pod["status"].get("conditions") or []
                 if c["type"] == "PodScheduled" and c["status"] == "True"), None)


def agree(s, reader: str, node: str, pending: Pending, devices: list[str], second) -> dict:
    """One waiting pod: bind's FailedScheduling Event (the message `pending` expects), explain's
    verdict and gpus's waiting entry on each of `devices` (its entry's, and no other GPU of the
    node) give one action, plugin and message. With a second instance, its answer to the pod's
    event is that too. gpus's view, as read after explain."""
    event = binds_event(s, pending)
    bind = {"action": "wait", "plugin": (event["metadata"].get("annotations") or {}).get(PLUGIN_ANNOTATION),
            "message": event["message"]}
    said = explained(pending, reader)
    view = gpus(reader, node)
    who = f"{pending.namespace}/{pending.name}"
    listed = {device: {"action": w["action"], "plugin": w["plugin"], "message": w["message"]}
              for device, w in waiting_for(view, who).items()}
    verdicts = {"bind": bind, "explain": {k: said.get(k) for k in ("action", "plugin", "message")},
                "gpus": listed}
    assert verdicts == {"bind": bind, "explain": bind, "gpus": {device: bind for device in devices}}, (
        json.dumps(verdicts, indent=1))
    if second is not None:
        status, body = post_event(second.url, s.live(pending.name, pending.namespace), s.stack.cp.server)
        answer = {"action": "wait" if body.get("result") == "Unschedulable" else body.get("result"),
                  "plugin": body.get("plugin"), "message": body.get("message")}
        assert (status, answer) == (200, bind), f"the second instance answered {status} {body}"
    return view


# -- held ------------------------------------------------------------------------------------
def test_held_by_a_pinned_statefulset(stack, reader, second, situation):
    s, ns = situation, situation.namespace
    node = s.node()
    s.apply(statefulset(ns, f"0={node}:0,1\n", replicas=1, name="team-a"))
    stack.wait_bound(ns, 1, "app=team-a")
    since = stack.wait_for(lambda: scheduled_at(s.live("team-a-0")), 20, "team-a-0's PodScheduled condition")
    team_b = s.apply(statefulset(ns, f"0={node}:1,2\n", replicas=1, name="team-b"))
    pending = Pending(ns, "team-b-0", team_b,
                      re.compile(re.escape(f"GPU 1 on {node} is held by {ns}/team-a-0 (") + ".*"))

    view = agree(s, reader, node, pending, ["1", "2"], second)
    assert states(view) == {"0": HELD, "1": HELD, "2": FREE, "3": FREE}, view["gpus"]
    key = f"StatefulSet {ns}/team-a"
    for device in ("0", "1"):
        row = rows(view)[device]
        assert (row["holders"], row["workloads"], row["since"]) == (
            [{"pod": f"{ns}/team-a-0", "workload": key, "since": since}], [key], since), row
        written = record(stack, node, device)  # bind's record says the same
        assert written is not None and (written.holders, written.last_pod) == ((key,), f"{ns}/team-a-0"), written
    assert record(stack, node, "2") is None and record(stack, node, "3") is None
    assert view["nodes"] == [{"node": node, "free": 2, "total": 4}]

    # the table, wide: the row and the refusal
    code, out, _ = run("gpus", "--node", node, "--kubeconfig", reader, "--scheduler-namespace", BIND_NAMESPACE,
                       "-o", "wide")
    line = next(line for line in out.splitlines() if line.startswith(node) and f" {ns}/team-a-0 " in line
                and line.split()[1] == "1")
    assert code == 0 and " held " in line and line.rstrip().endswith(f"{ns}/team-b-0"), out
    assert f"  {ns}/team-b-0: {pending_message(view, ns, 'team-b-0')}\n" in out, out
    assert f"free by node: {node} 2/4" in out, out


def pending_message(view: dict, ns: str, name: str) -> str:
    return next(iter(waiting_for(view, f"{ns}/{name}").values()))["message"]


# -- shared ----------------------------------------------------------------------------------
def sharer(ns: str, name: str, entry: str) -> dict:
    manifest = statefulset(ns, f"0={entry}\n", replicas=1, name=name)
    manifest["spec"]["template"]["metadata"]["annotations"][SHARE_ANNOTATION] = "true"
    return manifest


def test_shared_by_two_workloads(stack, reader, second, situation):
    s, ns = situation, situation.namespace
    node = s.node()
    s.apply(sharer(ns, "share-a", f"{node}:2"))
    s.apply(sharer(ns, "share-b", f"{node}:2"))
    stack.wait_bound(ns, 2)
    solo = s.apply(statefulset(ns, f"0={node}:2,3\n", replicas=1, name="solo"))  # does not share
    pending = Pending(ns, "solo-0", solo,
                      re.compile(re.escape(f"GPU 2 on {node} is held by {ns}/share-") + "[ab]-0 .*"))

    view = agree(s, reader, node, pending, ["2", "3"], second)
    assert states(view) == {"0": FREE, "1": FREE, "2": SHARED, "3": FREE}, view["gpus"]
    row = rows(view)["2"]
    keys = {f"StatefulSet {ns}/share-a", f"StatefulSet {ns}/share-b"}
    assert set(row["workloads"]) == keys and len(row["workloads"]) == 2, row
    bound_at = {f"{ns}/{name}": scheduled_at(s.live(name)) for name in ("share-a-0", "share-b-0")}
    assert {h["pod"]: h["since"] for h in row["holders"]} == bound_at, row
    assert row["since"] == min(bound_at.values()), row
    written = record(stack, node, "2")
    assert written is not None and set(written.holders) == keys and written.shares, written
    code, out, _ = run("gpus", "--node", node, "--kubeconfig", reader, "--scheduler-namespace", BIND_NAMESPACE)
    assert code == 0 and "shared by 2" in out, out


def test_shared_at_the_sharing_limit(stack, reader, second, situation):
    """MAX_HOLDERS workloads share GPU 1 by bind's record (one of them with a pod on the node, the
    others lines of the record: their pods gone, say): bind refuses one more sharer, saying the GPU
    is shared by MAX_HOLDERS workloads already; gpus says shared by those MAX_HOLDERS workloads."""
    s, ns = situation, situation.namespace
    pending = held_at_the_sharing_limit(s)
    node = s.live("sharer-0")["spec"]["nodeName"]
    view = agree(s, reader, node, pending, ["1"], second)
    written = record(stack, node, "1")
    row = rows(view)["1"]
    assert states(view) == {"0": FREE, "1": SHARED, "2": FREE, "3": FREE}, row
    assert (row["workloads"], [h["pod"] for h in row["holders"]]) == (list(written.holders), [f"{ns}/sharer-0"]), row
    assert len(row["workloads"]) == MAX_HOLDERS


# -- in flight -------------------------------------------------------------------------------
def test_in_flight_a_record_for_a_pod_bind_cannot_bind(stack, reader, second, situation):
    """The record another instance wrote for its pod just before binding it (or dying): that pod
    pending (its selector keeps it so here). Within the grace: in flight, and a pod of another
    workload mapped to it waits; past it: free, and bind binds that pod there."""
    s, ns = situation, situation.namespace
    node = s.node()
    other = pod_manifest(ns, "other-0", f"0={node}:1\n")
    other["spec"]["nodeSelector"] = {"zone": "b"}
    s.apply(other)
    selector = Pending(ns, "other-0", other, re.compile(r"node\(s\) didn't match .*"))
    binds_event(s, selector)
    key = workload_key(workload(other))
    s.record(node, "1", [key], False, s.live("other-0"))  # seen by the stack's bind before it returns
    if second is not None:
        stack.wait_for(lambda: sees_record(second.url, node, "1"), 20, "the second instance seeing the record")
    written = record(stack, node, "1")
    w = s.apply(pod_manifest(ns, "w-0", f"0={node}:1,2\n"))
    pending = Pending(ns, "w-0", w, re.compile(
        re.escape(f"GPU 1 on {node} was given to {ns}/other-0 ({key}) at {clock_of(rfc3339(written.written))};"
                  f" it is free again {GRACE_SECONDS} s after that"
                  f" ({clock_of(rfc3339(written.written + GRACE_SECONDS))})"
                  " unless that pod is bound")))

    view = agree(s, reader, node, pending, ["1", "2"], second)
    print(f"compared {time.monotonic() - s.recorded:.1f} s after the record was written (grace {GRACE_SECONDS} s)")
    assert time.monotonic() - s.recorded < GRACE_SECONDS, "too slow for the record's grace: nothing compared"
    assert states(view) == {"0": FREE, "1": IN_FLIGHT, "2": FREE, "3": FREE}, view["gpus"]
    row = rows(view)["1"]
    assert (row["recordedFor"], row["graceUntil"], row["workloads"], row["holders"], row["since"]) == (
        f"{ns}/other-0", rfc3339(written.written + GRACE_SECONDS), [key], [], rfc3339(written.written)), row
    # the pod the record was written for waits too, for its selector: on GPU 1, as bind and explain say
    agree(s, reader, node, selector, ["1"], second)
    assert time.monotonic() - s.recorded < GRACE_SECONDS, "too slow for the record's grace: nothing compared"

    # past the grace the record counts for nothing: free (or w-0's already, if bind tried it again),
    # and once bind tries w-0 again, it binds it there
    past = gpus_until(stack, reader, node, lambda v: states(v)["1"] != IN_FLIGHT, GRACE_SECONDS + 20,
                      "GPU 1 no longer in flight")
    assert states(past)["1"] in (FREE, HELD), past["gpus"]
    stack.ping()
    view = gpus_until(stack, reader, node, {"0": FREE, "1": HELD, "2": HELD, "3": FREE}, 30, "w-0 holding GPUs 1 and 2")
    assert [h["pod"] for h in rows(view)["1"]["holders"]] == [f"{ns}/w-0"]
    assert s.live("w-0")["spec"].get("nodeName") == node
    assert record(stack, node, "1").last_pod == f"{ns}/w-0"


# -- being freed -----------------------------------------------------------------------------
def test_being_freed_for_a_preemptor(stack, reader, second, situation):
    """urgent-0 (priority 1000) maps GPUs 1 and 2 and preempts batch-0 (priority 10), GPU 1's
    holder, which stays Terminating (no kubelet): both GPUs are being freed for urgent-0 until a
    time. other-0 (default priority) maps GPU 2 and waits. The victim gone, urgent-0 holds both."""
    s, ns = situation, situation.namespace
    node, urgent = preempted(s, "{node}:1,2")
    stack.ping()  # urgent-0 tried again now: the victim terminating
    urgent_waits = Pending(ns, "urgent-0", urgent, re.compile(held_by(s, node, "1", "batch-0") + re.escape(
        f"; preemption: {ns}/batch-0 terminating on {node}; the pod is placed once they are gone")))
    other = s.apply(pod_manifest(ns, "other-0", f"0={node}:2\n"))
    other_waits = Pending(ns, "other-0", other, re.compile(re.escape(
        f"GPU 2 on {node} is being freed for {ns}/urgent-0 (priority 1000), which preempted its holder, until ")
        + CLOCK.pattern))

    agree(s, reader, node, urgent_waits, ["1", "2"], second)
    view = agree(s, reader, node, other_waits, ["2"], second)
    assert states(view) == {"0": FREE, "1": BEING_FREED, "2": BEING_FREED, "3": FREE}, view["gpus"]
    one, two = rows(view)["1"], rows(view)["2"]
    batch = f"StatefulSet {ns}/batch"
    assert ([h["pod"] for h in one["holders"]], one["workloads"]) == ([f"{ns}/batch-0"], [batch]), one
    assert (two["holders"], two["workloads"]) == ([], []), two
    for row in (one, two):
        written = record(stack, node, row["device"])
        assert (row["nominee"], row["until"]) == (f"{ns}/urgent-0", rfc3339(written.nominated_until)), (row, written)
        assert written.nominee == f"{ns}/urgent-0"
    message = pending_message(view, ns, "other-0")
    assert message.endswith(f"until {clock_of(two['until'])}"), (message, two["until"])
    assert [w["pod"] for w in one["waiting"]] == [f"{ns}/urgent-0"]
    assert sorted(w["pod"] for w in two["waiting"]) == [f"{ns}/other-0", f"{ns}/urgent-0"]

    # the victim gone (the test plays its kubelet): urgent-0 bound, holding both
    play_kubelet(stack, ns, "batch-0")
    view = gpus_until(stack, reader, node, lambda v: states(v) == {"0": FREE, "1": HELD, "2": HELD, "3": FREE}
                      and all([h["pod"] for h in rows(v)[d]["holders"]] == [f"{ns}/urgent-0"] for d in "12"),
                      45, "urgent-0 holding GPUs 1 and 2")
    assert s.live("urgent-0")["spec"].get("nodeName") == node
    assert not record(stack, node, "2").nominee, "the nomination outlived the binding"


# -- free ------------------------------------------------------------------------------------
def test_free_and_bind_binds_there(stack, reader, second, situation):
    """A node of the test's own: every GPU free, including GPU 0, whose record names a pod since
    deleted (bind frees it at once). A new pod mapped to GPUs 0 and 3 is bound there; with two
    instances, by the second alone."""
    s, ns = situation, situation.namespace
    node = s.node()
    view = gpus(reader, node)
    assert states(view) == {d: FREE for d in "0123"}, view["gpus"]
    assert all(not g["holders"] and not g["waiting"] for g in view["gpus"]), view["gpus"]
    assert (view["nodes"], view["types"]) == ([{"node": node, "free": 4, "total": 4}],
                                             [{"type": "unknown", "free": 4, "total": 4}])

    gone = s.apply(pod_manifest(ns, "gone-0", f"0=nowhere-{s.uniq}:0\n"))  # never bound (its node does not exist)
    s.stack.wait_for(lambda: s.live("gone-0"), 20, "gone-0 created")
    body = s.live("gone-0")
    stack.cp.kubectl("delete", "pod", "-n", ns, "gone-0", "--grace-period=0", "--force")
    stack.wait_for(lambda: s.live("gone-0") is None, 20, "gone-0 deleted")
    s.record(node, "0", [workload_key(workload(gone))], False, body)
    if second is not None:
        stack.wait_for(lambda: sees_record(second.url, node, "0"), 20, "the second instance seeing the record")
    view = gpus(reader, node)
    assert states(view) == {d: FREE for d in "0123"}, view["gpus"]
    assert view["nodes"] == [{"node": node, "free": 4, "total": 4}]

    probe = pod_manifest(ns, "probe-0", f"0={node}:0,3\n")
    if second is None:
        s.apply(probe)
        stack.wait_bound(ns, 1)
    else:
        with stack_bind_stopped(stack):
            s.apply(probe)
            stack.wait_bound(ns, 1, timeout=30)
        # bind's recorder writes the Scheduled Event after the Binding, in the background: wait for it.
        events = stack.wait_for(lambda: [e for e in stack.api.list_namespaced_event(
            ns, field_selector="reason=Scheduled").items if e.involved_object.name == "probe-0"], 20,
            "probe-0's Scheduled Event")
        assert [e.reporting_instance for e in events] == [SECOND], [(e.reporting_instance, e.message) for e in events]
    probe_uid = s.live("probe-0")["metadata"]["uid"]
    assert [e["message"] for e in failed_scheduling(stack, ns, probe_uid)] == []  # bound at once, never refused
    view = gpus_until(stack, reader, node, {"0": HELD, "1": FREE, "2": FREE, "3": HELD}, 20, "probe-0 holding 0 and 3")
    assert all([h["pod"] for h in rows(view)[d]["holders"]] == [f"{ns}/probe-0"] for d in "03")
    assert record(stack, node, "0").last_pod == f"{ns}/probe-0"
    assert view["nodes"] == [{"node": node, "free": 2, "total": 4}]




def test_free_once_its_holder_finished_within_its_records_grace(stack, reader, situation):
    """A pod bound to GPUs 0 and 1 finishes (Succeeded, as a short Job's would) within its record's
    grace: bind counts the record's pod gone (functions/bind/cache.py, gone_of: neither on a node
    unfinished nor pending), so both GPUs are free at once, not in flight. With bind stopped, a pod
    of another workload mapped to GPU 0 is one explain and gpus say bind binds now; bind, resumed,
    binds it at once and never refuses it."""
    s, ns = situation, situation.namespace
    node = s.node()
    s.apply(pod_manifest(ns, "done-0", f"0={node}:0,1\n"))
    stack.wait_bound(ns, 1)
    stack.api.patch_namespaced_pod_status("done-0", ns, {"status": {"phase": "Succeeded"}})
    written = record(stack, node, "0")
    assert written is not None and written.last_pod == f"{ns}/done-0"
    view = gpus(reader, node)
    assert time.time() - written.written < GRACE_SECONDS, "too slow: the record's grace ended before gpus read it"
    assert states(view) == {d: FREE for d in "0123"}, view["gpus"]
    assert view["nodes"] == [{"node": node, "free": 4, "total": 4}]

    with stack_bind_stopped(stack):
        w = s.apply(pod_manifest(ns, "w-0", f"0={node}:0\n# another workload\n"))
        stack.wait_for(lambda: s.live("w-0"), 10, "w-0 created")
        said = explained(Pending(ns, "w-0", w, ""), reader)
        listed = waiting_for(gpus(reader, node), f"{ns}/w-0")
        asked_in_grace = time.time() - written.written < GRACE_SECONDS
    stack.wait_for(lambda: s.live("w-0")["spec"].get("nodeName") == node, 10, "w-0 bound at once")
    assert [e["message"] for e in failed_scheduling(stack, ns, s.live("w-0")["metadata"]["uid"])] == []
    assert asked_in_grace, "too slow: the record's grace ended before explain and gpus were asked"
    verdict = {k: said.get(k) for k in ("action", "plugin", "message")}
    assert verdict["action"] == "bind", f"bind bound w-0 at once; explain said {said}"
    assert {d: {k: w_[k] for k in ("action", "plugin", "message")} for d, w_ in listed.items()} == {"0": verdict}
