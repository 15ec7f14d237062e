"""Gangs (issue 27, docs/gangs.md) on the real control plane: a workload annotated
`gpu-scheduler/gang` is bound whole or not at all, and holds no device while it waits.

- a gang one of whose GPUs is held binds nothing, each member saying why in one Event; freed, it
  is bound whole;
- a gang with fewer members than its size binds nothing until the controller creates the rest;
- a member re-created while the rest of its gang is bound is placed alone;
- two gangs overlapping on a GPU, three bind instances: one bound whole, the other not at all and
  holding nothing; the winner deleted, the other bound within 15 s;
- the API server killed while two such gangs are reserved (and again at the next progress, unless
  all is settled by then): each bound whole or not at all 30 s after its return, and an unbound
  gang holds no record;
- bind killed between two Bindings of a gang: another instance binds the rest;
- a malformed annotation refused by mutate at creation.

The test hook GPU_SCHEDULER_TEST_EXIT_AFTER_BINDINGS=<n> (bind's environment, never set outside
these tests; functions/bind/testhooks.py's exit_after_bindings): the process exits at once
(os._exit(17), as with GPU_SCHEDULER_TEST_EXIT_AFTER_RECORD) right after its n-th Binding, a gang's
Bindings being made one at a time while it is set: every record of the gang written, n members
bound, the rest not. Under gunicorn only the worker exits, so the hook first stops its master,
which would start another worker at once; the test reads the zombie worker's exit code, then
kills the instance.

Each test has nodes of its own (test_records_cluster's Node objects, 4 GPUs each, no kubelet), so
that nothing of node1..node4 or of another test touches its gangs; the API server's test has a
stack of its own, as test_faults' has.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client

from gpu_scheduler.records import RECORD_SELECTOR, Record, in_grace
from localcp.stack import LocalStack
from test_end_to_end import pod_manifest, statefulset
from test_records_cluster import RECORDS, own_nodes, ready_instance  # noqa: F401 (own_nodes: a fixture)

GANG = "gpu-scheduler/gang"
PLUGIN = "gpu-scheduler/plugin"
EXIT_AFTER_BINDINGS = "GPU_SCHEDULER_TEST_EXIT_AFTER_BINDINGS"


# -- helpers -------------------------------------------------------------------------------------
def gang_statefulset(namespace: str, name: str, entries: list[str], replicas: int | None = None,
                     gang: str = "true") -> dict:
    """A StatefulSet whose map gives replica i entries[i] (`node:devices`), a gang, its pods
    created all at once (Parallel: OrderedReady never forms a gang)."""
    text = "".join(f"{i}={entry}\n" for i, entry in enumerate(entries))
    manifest = statefulset(namespace, text, replicas=len(entries) if replicas is None else replicas, name=name)
    manifest["spec"]["podManagementPolicy"] = "Parallel"
    manifest["spec"]["template"]["metadata"]["annotations"][GANG] = gang
    return manifest


def members(stack, namespace: str, name: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in stack.pods(namespace, f"app={name}")}


def bound_of(pods: dict[str, dict]) -> dict[str, str]:
    return {n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")}


def failed_scheduling(stack, namespace: str, uid: str) -> list[dict]:
    query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.uid={uid}"})
    events = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events?{query}"))["items"]
    return [e for e in events if e.get("reason") == "FailedScheduling"]


def plugin_of(event: dict) -> str | None:
    return (event["metadata"].get("annotations") or {}).get(PLUGIN)


def scheduled_condition(pod: dict) -> dict | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)


def records(stack) -> list[Record]:
    query = urllib.parse.urlencode({"labelSelector": RECORD_SELECTOR})
    items = json.loads(stack.cp.get(f"{RECORDS}?{query}"))["items"]
    return [r for r in (Record.of(item) for item in items) if r is not None]


def holder_key(namespace: str, name: str) -> str:
    """How a record names a StatefulSet (records.workload_key)."""
    return f"StatefulSet {namespace}/{name}"


def records_naming(stack, namespace: str, name: str) -> list[Record]:
    return [r for r in records(stack) if holder_key(namespace, name) in r.holders]


def describe(stack, namespace: str, *names: str, log: str | None = "bind") -> str:
    """What a failure should show: each member's node and FailedScheduling Events, the records
    naming the gang, and the end of bind's log."""
    lines = []
    for name in names:
        for pod_name, pod in sorted(members(stack, namespace, name).items()):
            events = [f"{plugin_of(e)}: {e['message']} (x{e.get('count')})"
                      for e in failed_scheduling(stack, namespace, pod["metadata"]["uid"])]
            lines.append(f"  {pod_name}: node {pod['spec'].get('nodeName')!r}; FailedScheduling {events}")
        lines.append(f"  records naming {name}: {[(r.node, r.device) for r in records_naming(stack, namespace, name)]}")
    if log:
        lines.append(f"  {log}'s log:")
        lines += [f"    {line[:300]}" for line in stack.cp.log_tail(log, 15).splitlines()]
    return "\n".join(lines)


def waiting(stack, namespace: str, name: str, count: int, prefix: str, timeout: float = 30) -> dict[str, list[dict]]:
    """The gang's `count` members, each pending with PodScheduled=False (Unschedulable) and a
    FailedScheduling Event whose message starts with `prefix`: those Events by member. Fails at
    once when a member is bound."""
    def check():
        pods = members(stack, namespace, name)
        bound = bound_of(pods)
        assert not bound, (f"{name}: members bound while the gang cannot be complete: {bound}\n"
                           + describe(stack, namespace, name))
        if len(pods) != count:
            return None
        found = {}
        for pod_name, pod in pods.items():
            condition = scheduled_condition(pod)
            if not condition or (condition["status"], condition.get("reason")) != ("False", "Unschedulable"):
                return None
            events = [e for e in failed_scheduling(stack, namespace, pod["metadata"]["uid"])
                      if e["message"].startswith(prefix)]
            if not events:
                return None
            found[pod_name] = events
        return found
    try:
        return stack.wait_for(check, timeout, f"every member of {name} waiting with {prefix!r}", interval=0.3)
    except TimeoutError as timeout_error:
        raise AssertionError(f"{timeout_error}\n{describe(stack, namespace, name)}") from None


def one_gang_event_each(stack, namespace: str, name: str, prefix: str) -> dict[str, dict]:
    """Each member has exactly one Event with the gang's message (counted up, not repeated), and
    every FailedScheduling Event of a member is the Gang plugin's."""
    found = {}
    for pod_name, pod in members(stack, namespace, name).items():
        events = failed_scheduling(stack, namespace, pod["metadata"]["uid"])
        assert {plugin_of(e) for e in events} == {"Gang"}, (pod_name, [(plugin_of(e), e["message"]) for e in events])
        gang = [e for e in events if e["message"].startswith(prefix)]
        assert len(gang) == 1, (pod_name, [e["message"] for e in gang])
        assert gang[0]["type"] == "Warning" and gang[0]["source"].get("component") == "gpu-scheduler"
        found[pod_name] = gang[0]
    return found


def wait_all_bound(stack, namespace: str, name: str, count: int, timeout: float) -> dict[str, dict]:
    def check():
        pods = members(stack, namespace, name)
        return pods if len(pods) == count and len(bound_of(pods)) == count else None
    try:
        return stack.wait_for(check, timeout, f"the {count} members of {name} bound", interval=0.1)
    except TimeoutError as timeout_error:
        raise AssertionError(f"{timeout_error}\n{describe(stack, namespace, name)}") from None


def placed_as_mapped(pods: dict[str, dict], name: str, entries: list[str]) -> None:
    assert ({n: p["spec"]["nodeName"] for n, p in pods.items()} ==
            {f"{name}-{i}": entry.split(":")[0] for i, entry in enumerate(entries)})


def delete_workload(stack, namespace: str, name: str) -> None:
    """The StatefulSet and its pods, gone from the API server when this returns."""
    client.AppsV1Api(stack.api_client).delete_namespaced_stateful_set(
        name, namespace, body=client.V1DeleteOptions(propagation_policy="Orphan"))
    stack.wait_for(lambda: not client.AppsV1Api(stack.api_client).list_namespaced_stateful_set(
        namespace, field_selector=f"metadata.name={name}").items, 20, f"StatefulSet {name} deleted")
    stack.api.delete_collection_namespaced_pod(namespace, label_selector=f"app={name}", grace_period_seconds=0)
    stack.wait_for(lambda: not members(stack, namespace, name), 20, f"the pods of {name} deleted")


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (zombies included: a child is listed until reaped)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            own, rest = stat.read_text().split(" ", 1)
        except OSError:
            continue  # gone meanwhile
        if int(rest.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: its parent
            found.add(int(own))
    return found


def exit_code(pid: int) -> int | None:
    """The exit code of a zombie process (/proc/<pid>/stat's exit_code, as waitpid reports it);
    None while it runs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[-1]) >> 8 if fields[0] == "Z" else None


def kill_instance(server) -> None:
    """A bind instance (conftest's FunctionServer: gunicorn's master and its worker) killed at
    once, its master stopped first so that it starts no other worker. Not stop(): a worker
    draining after SIGTERM goes on placing pods meanwhile."""
    master = server.process.pid
    os.kill(master, signal.SIGSTOP)
    for child in children(master):
        os.kill(child, signal.SIGKILL)
    server.process.kill()
    server.process.wait(timeout=10)


def create_at_once(stack, manifests: list[dict]) -> None:
    barrier = threading.Barrier(len(manifests))

    def create(manifest):
        barrier.wait()
        stack.apply(manifest)
    with ThreadPoolExecutor(len(manifests)) as pool:
        list(pool.map(create, manifests))


# -- 1. a GPU held: nothing bound, one Event each, nothing held; freed: bound whole ---------------
def test_a_gang_whose_gpu_is_held_binds_no_member_until_the_gpu_is_freed(stack, namespace, own_nodes):
    a, b = own_nodes(2)
    stack.apply(pod_manifest(namespace, "holder-0", f"0={b}:3\n"))  # another workload, no gang
    stack.wait_bound(namespace, 1, timeout=30)
    entries = [f"{a}:0", f"{a}:1", f"{b}:0", f"{b}:1", f"{b}:3"]
    stack.apply(gang_statefulset(namespace, "train", entries))

    prefix = f"gang {namespace}/train: 4 of 5 members placeable; member train-4: "
    waiting(stack, namespace, "train", 5, prefix)
    # Tried again (a ping: every pending pod at once), the Events are counted up, not repeated.
    stack.ping()

    def counted_up():
        return any(e["count"] >= 2 and e["message"].startswith(prefix) for pod in members(stack, namespace, "train").values()
                   for e in failed_scheduling(stack, namespace, pod["metadata"]["uid"]))
    stack.wait_for(counted_up, 20, "a repeated refusal counted up")
    events = one_gang_event_each(stack, namespace, "train", prefix)
    assert sorted(events) == [f"train-{i}" for i in range(5)]
    for pod_name, event in events.items():
        assert f"{namespace}/holder-0" in event["message"], (pod_name, event["message"])
        assert plugin_of(event) == "Gang"
    assert not bound_of(members(stack, namespace, "train"))
    # Nothing held while it waits: no record names the gang's workload.
    try:
        stack.wait_for(lambda: not records_naming(stack, namespace, "train"), 10, "no record naming the gang")
    except TimeoutError:
        raise AssertionError("records held by a waiting gang:\n" + describe(stack, namespace, "train")) from None

    stack.cp.kubectl("delete", "pod", "-n", namespace, "holder-0", "--grace-period=0", "--force")
    placed_as_mapped(wait_all_bound(stack, namespace, "train", 5, timeout=30), "train", entries)


# -- 2. fewer members than the gang: nothing bound until the controller creates the rest ----------
@pytest.mark.parametrize("gang", ["3", "true"])
def test_a_gang_with_fewer_members_than_its_size_binds_none_until_scaled(stack, namespace, own_nodes, gang):
    """One member, then two (the controller slow, say): each waiting member's Event says what the
    gang waits for now, the earlier member's too; the third: all bound."""
    [a] = own_nodes(1)
    entries = [f"{a}:0", f"{a}:1", f"{a}:2"]
    stack.apply(gang_statefulset(namespace, "small", entries, replicas=1, gang=gang))
    waiting(stack, namespace, "small", 1, f"gang {namespace}/small: 1 of 3 members exist")
    stack.cp.kubectl("scale", "statefulset", "small", "-n", namespace, "--replicas=2")
    prefix = f"gang {namespace}/small: 2 of 3 members exist"
    waiting(stack, namespace, "small", 2, prefix)
    one_gang_event_each(stack, namespace, "small", prefix)
    assert not records_naming(stack, namespace, "small")

    stack.cp.kubectl("scale", "statefulset", "small", "-n", namespace, "--replicas=3")
    placed_as_mapped(wait_all_bound(stack, namespace, "small", 3, timeout=30), "small", entries)


# -- 3. (issue point 4) once bound, a re-created member is placed alone ----------------------------
def test_a_member_re_created_while_the_rest_of_its_gang_is_bound_is_placed_alone(stack, namespace, own_nodes):
    [a] = own_nodes(1)
    entries = [f"{a}:0", f"{a}:1", f"{a}:2"]
    stack.apply(gang_statefulset(namespace, "ring", entries, replicas=2))
    # A gang, not three pods: nothing bound while a member is missing (what each member's Event
    # says then is test_a_gang_with_fewer_members_than_its_size_binds_none_until_scaled's).
    waiting(stack, namespace, "ring", 2, f"gang {namespace}/ring: ")
    stack.cp.kubectl("scale", "statefulset", "ring", "-n", namespace, "--replicas=3")
    before = wait_all_bound(stack, namespace, "ring", 3, timeout=30)

    old_uid = before["ring-1"]["metadata"]["uid"]
    stack.cp.kubectl("delete", "pod", "-n", namespace, "ring-1", "--grace-period=0", "--force")
    after = wait_all_bound(stack, namespace, "ring", 3, timeout=30)  # the controller re-creates it; bound alone
    new = after["ring-1"]
    assert new["metadata"]["uid"] != old_uid
    placed_as_mapped(after, "ring", entries)
    for other in ("ring-0", "ring-2"):  # the others stayed as they were
        assert after[other]["metadata"]["uid"] == before[other]["metadata"]["uid"]
    assert failed_scheduling(stack, namespace, new["metadata"]["uid"]) == [], describe(stack, namespace, "ring")


# -- 4. three instances, two gangs overlapping on one GPU ------------------------------------------
def test_two_gangs_overlapping_on_a_gpu_one_bound_whole_the_other_not_at_all(stack, namespace, own_nodes):
    a, b = own_nodes(2)
    gangs = {"north": [f"{a}:0", f"{a}:1", f"{a}:2", f"{b}:0"],
             "south": [f"{b}:0", f"{b}:1", f"{b}:2", f"{b}:3"]}  # both want GPU 0 of b
    others = [ready_instance(stack), ready_instance(stack)]  # three instances with the stack's own
    try:
        create_at_once(stack, [gang_statefulset(namespace, name, entries) for name, entries in gangs.items()])

        def settled():
            pods = {name: members(stack, namespace, name) for name in gangs}
            bound = {name: bound_of(pods[name]) for name in gangs}
            assert not all(bound.values()), "both gangs have members bound:\n" + describe(stack, namespace, *gangs)
            if any(len(pods[name]) != len(gangs[name]) for name in gangs):
                return None
            for winner, loser in (("north", "south"), ("south", "north")):
                if len(bound[winner]) == len(gangs[winner]) and not bound[loser]:
                    waits = all(any(e["message"].startswith(f"gang {namespace}/{loser}: ")
                                    for e in failed_scheduling(stack, namespace, p["metadata"]["uid"]))
                                for p in pods[loser].values())
                    if waits and not records_naming(stack, namespace, loser):
                        return winner, loser
            return None
        try:
            winner, loser = stack.wait_for(settled, 45, "one gang bound whole, the other waiting", interval=0.2)
        except TimeoutError as timeout_error:
            raise AssertionError(f"{timeout_error}\n{describe(stack, namespace, *gangs)}") from None
        placed_as_mapped(members(stack, namespace, winner), winner, gangs[winner])
        one_gang_event_each(stack, namespace, loser, f"gang {namespace}/{loser}: ")

        delete_workload(stack, namespace, winner)
        deleted = time.monotonic()
        pods = wait_all_bound(stack, namespace, loser, 4, timeout=15)
        print(f"{loser} bound whole {time.monotonic() - deleted:.1f} s after {winner} was deleted")
        placed_as_mapped(pods, loser, gangs[loser])
    finally:
        for server in others:
            server.stop()


# -- 5. the API server killed while two gangs are reserved -----------------------------------------
@pytest.mark.controlplane  # its own stack, not the `stack` fixture
def test_the_api_server_killed_while_gangs_are_reserved_leaves_each_bound_whole_or_not_at_all():
    """Two 8-member gangs overlapping on GPU 3 of node2 (the last device of one in the global
    order, the first of the other) on the stack's node1..node4. kube-apiserver is killed (SIGKILL)
    as soon as the first record of either is written, and again at the next progress after its
    return (a record or a Binding) unless all is settled. The event source is held: what is tested
    is bind's own recovery."""
    gangs = {"east": [f"node1:{d}" for d in range(4)] + [f"node2:{d}" for d in range(4)],
             "west": ["node2:3"] + [f"node3:{d}" for d in range(4)] + [f"node4:{d}" for d in range(3)]}
    with LocalStack() as own:
        own.source.paused = True
        namespace = own.create_namespace("gang-outage")
        total = sum(map(len, gangs.values()))

        def progress():
            return ({(n, d) for n in gangs for d in bound_of(members(own, namespace, n))},
                    {(r.node, r.device, r.holders) for r in records(own)})

        def restart(why: str) -> float:
            apiserver = own.cp.processes["kube-apiserver"]
            apiserver.kill()
            apiserver.wait()
            print(f"kube-apiserver killed {why}")
            own.cp.start_apiserver()  # returns once /readyz answers ok
            return time.monotonic()

        def settled():
            now = time.time()
            counts = {name: len(bound_of(members(own, namespace, name))) for name in gangs}
            if not all(counts[name] in (0, len(entries)) for name, entries in gangs.items()):
                return None
            if not any(counts[name] == len(entries) for name, entries in gangs.items()):
                return None
            for name in gangs:  # an unbound gang holds no record
                if counts[name] == 0 and any(in_grace(r, now) for r in records_naming(own, namespace, name)):
                    return None
            return counts

        # Every member exists before bind looks (it is stopped meanwhile): the race is bind's,
        # not the StatefulSet controller's, which backs off after an outage.
        group = own.cp.processes["bind"].pid
        os.killpg(group, signal.SIGSTOP)
        try:
            create_at_once(own, [gang_statefulset(namespace, name, entries) for name, entries in gangs.items()])
            own.wait_for(lambda: sum(len(members(own, namespace, n)) for n in gangs) == total, 60, "every member created")
        finally:
            os.killpg(group, signal.SIGCONT)
        first = own.wait_for(lambda: records(own) or None, 60, "the first record of a gang", interval=0.01)
        returned = restart(f"with {len(first)} record(s) written")
        seen = progress()
        try:
            own.wait_for(lambda: settled() or progress() != seen, 15, "progress after the return", interval=0.01)
        except TimeoutError:
            pass  # nothing moved: no second restart
        if not settled():
            bound, held = progress()
            returned = restart(f"again, with {len(bound)} member(s) bound and {len(held)} record(s)")

        try:
            counts = own.wait_for(settled, max(0.0, returned + 30 - time.monotonic()), "each gang whole or none",
                                  interval=0.2)
        except TimeoutError as timeout_error:
            raise AssertionError(f"30 s after the API server's return, {timeout_error}:\n"
                                 + describe(own, namespace, *gangs)) from None
        print(f"settled {time.monotonic() - returned:.1f} s after the return: {counts}")
        assert sorted(counts.values()) == [0, 8]


# -- 6. bind killed between two Bindings of a gang ---------------------------------------------------
def test_bind_killed_between_two_bindings_of_a_gang_the_next_instance_binds_the_rest(stack, namespace, own_nodes):
    """An instance with the exit hook (see the module) binds one member and dies; the stack's own
    bind, stopped meanwhile so that only the dying instance sees the gang, takes over and binds the
    rest: the records name the gang's workload, so they are its own."""
    [a] = own_nodes(1)
    entries = [f"{a}:{d}" for d in range(4)]
    group = stack.cp.processes["bind"].pid
    os.killpg(group, signal.SIGSTOP)
    try:
        dying = ready_instance(stack, **{EXIT_AFTER_BINDINGS: "1"})
        try:
            [worker] = children(dying.process.pid)  # functions-framework's gunicorn: one worker
            stack.apply(gang_statefulset(namespace, "relay", entries))

            def exited():
                assert len(bound_of(members(stack, namespace, "relay"))) < len(entries), (
                    f"the instance bound the whole gang without exiting:\n{dying.output()[-3000:]}")
                return exit_code(worker) is not None
            # The hook stops the master before the worker exits (no other worker starts): the
            # worker stays a zombie until the instance is killed.
            stack.wait_for(exited, 30, "the instance's worker exiting after a Binding", interval=0.02)
            assert exit_code(worker) == 17, dying.output()[-3000:]
        finally:
            kill_instance(dying)
        bound = bound_of(members(stack, namespace, "relay"))
        assert len(bound) == 1, f"bound when the instance died: {bound}\n{dying.output()[-3000:]}"
        assert ({(r.node, r.device) for r in records_naming(stack, namespace, "relay")} ==
                {(a, str(d)) for d in range(4)}), (
            f"the gang's records, all written before its first Binding; bound: {bound}\n{dying.output()[-6000:]}")
    finally:
        os.killpg(group, signal.SIGCONT)
    resumed = time.monotonic()
    placed_as_mapped(wait_all_bound(stack, namespace, "relay", 4, timeout=30), "relay", entries)
    print(f"the rest bound {time.monotonic() - resumed:.1f} s after the stack's bind resumed")


# -- mutate refuses a malformed annotation ----------------------------------------------------------
@pytest.mark.parametrize("value", ["many", "0", "6"])
def test_a_malformed_gang_annotation_is_refused_at_creation(stack, namespace, value):
    manifest = pod_manifest(namespace, "w-0", "".join(f"{i}=node{i % 4 + 1}:{i // 4}\n" for i in range(5)))
    manifest["metadata"]["annotations"][GANG] = value
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, result.stdout
    assert 'admission webhook "mutate.gpu-scheduler.local" denied the request' in result.stderr, result.stderr
    assert GANG in result.stderr, result.stderr
    assert stack.pods(namespace) == []
