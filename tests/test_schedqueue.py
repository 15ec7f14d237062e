"""bind's scheduling queue, alone: the order it offers active pods in. Instances that watch the
same pods must not take a backlog in one order (each pod tried by all of them at once, all but
one losing it to a conflict), yet a pod that became active earlier still comes first."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "functions" / "bind"))

import schedqueue  # noqa: E402
from gpu_scheduler.queueing import ACTIVE_ORDER_WINDOW_SECONDS, active_order  # noqa: E402


def drained(queue) -> list[str]:
    taken = []
    while (uid := queue.pop(timeout=0)) is not None:
        taken.append(uid)
        queue.done(uid, {})
    return taken


def test_two_instances_take_one_backlog_in_orders_of_their_own_and_meet_late():
    uids = [f"pod-{i}" for i in range(300)]
    first, second = schedqueue.SchedulingQueue(), schedqueue.SchedulingQueue()
    for queue in (first, second):
        for uid in uids:
            queue.add(uid)
    one, other = drained(first), drained(second)
    assert sorted(one) == sorted(other) == sorted(uids)  # every pod, once each
    # Each taking the backlog from its own end, they meet on a pod only near its middle: of the
    # first 100 pods each would try, few are the other's first 100 (in one order: all 100).
    assert len(set(one[:100]) & set(other[:100])) < 60
    assert one != uids  # not first in, first out within a window


def test_a_pod_active_in_an_earlier_window_comes_first(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(schedqueue.time, "monotonic", lambda: now[0])
    queue = schedqueue.SchedulingQueue()
    early = [f"early-{i}" for i in range(50)]
    late = [f"late-{i}" for i in range(50)]
    for uid in early:
        queue.add(uid)
    now[0] += ACTIVE_ORDER_WINDOW_SECONDS
    for uid in late:
        queue.add(uid)
    taken = drained(queue)
    assert set(taken[:50]) == set(early) and set(taken[50:]) == set(late)


def test_one_seed_one_order():
    assert active_order(b"a", "uid", 5.0) == active_order(b"a", "uid", 5.2)
    assert active_order(b"a", "uid", 5.0) != active_order(b"b", "uid", 5.0)


def test_a_pod_forgotten_and_added_again_is_offered_once():
    queue = schedqueue.SchedulingQueue(b"seed")
    queue.add("a")
    queue.forget("a")
    queue.add("a")
    queue.add("b")
    assert sorted(drained(queue)) == ["a", "b"]


def test_an_attempts_end_wakes_its_callers_not_the_idle_workers(monkeypatch):
    """Eight workers wait in pop() for a pod; 100 attempts end meanwhile. Each end wakes what waits
    for its outcome, not the workers: with one condition for both, each end woke all eight (twice),
    and each took the lock and the GIL to find nothing to do."""
    import threading
    queue = schedqueue.SchedulingQueue()
    turns = [0]  # times a worker went round pop()'s loop: each turn flushes the unschedulable pods
    flush = queue._flush_unschedulable

    def counted(now):
        turns[0] += 1
        flush(now)
    monkeypatch.setattr(queue, "_flush_unschedulable", counted)
    taken: list[str] = []
    workers = [threading.Thread(target=lambda: taken.append(queue.pop(timeout=30)), daemon=True) for _ in range(8)]
    for worker in workers:
        worker.start()
    while turns[0] < 8:  # each worker in pop(), waiting
        threading.Event().wait(0.001)
    for i in range(100):
        assert queue.claim(f"elsewhere-{i}")
        queue.done(f"elsewhere-{i}", {"result": "Bound"})
        threading.Event().wait(0.002)  # apart, as placements end: what a woken worker would do, it does now
    assert queue.outcome_after("elsewhere-99", None, 1) == {"result": "Bound"}
    for i in range(8):  # then eight pods: each wakes one worker, which takes it
        queue.add(f"pod-{i}")
    for worker in workers:
        worker.join(10)
    assert sorted(taken) == [f"pod-{i}" for i in range(8)]
    assert turns[0] < 8 + 8 * 3, f"{turns[0]} turns of pop()'s loop for 8 pods"
