"""bind's scheduling queue, as kube-scheduler's: pods to try now (active), pods waiting out a
backoff after a transient failure, and unschedulable pods waiting for a cluster event that can
undo their refusal (gpu_scheduler.queueing decides which). One attempt per pod at a time in this
instance: the event path and the workers both claim a pod before placing it, and a caller that
finds it claimed waits for that attempt's outcome. The I/O side of bind; the decisions are in
gpu_scheduler/queueing.py."""
from __future__ import annotations

import heapq
import itertools
import os
import random
import threading
import time
from collections import OrderedDict
from typing import Any

from gpu_scheduler.queueing import (UNSCHEDULABLE_FLUSH_SECONDS, Refused, active_order, backoff_seconds, jittered,
                                    requeues)
from metrics import PENDING_PODS

MAX_OUTCOMES = 4096  # the last outcome per pod, for callers waiting on an attempt


class SchedulingQueue:
    def __init__(self, seed: bytes | None = None):
        """`seed`: what orders this queue's active pods (active_order); by default random, so no
        two instances (nor two processes of one host name) share an order."""
        # One lock, two conditions: workers wait in pop() for a pod to try, callers in
        # outcome_after() for an attempt's end. Apart, an attempt's end wakes its callers only, not
        # every worker (8 threads, each waking, taking the lock and the GIL, and going back to sleep:
        # two such herds per placement were a tenth of bind's CPU per placement, issue 62).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._outcome_ready = threading.Condition(lock)
        self._seed = os.urandom(16) if seed is None else seed
        # (window, this instance's order, sequence, uid): a heap; a pod taken out of the active
        # set meanwhile is left in it, skipped when popped
        self._active: list[tuple[int, bytes, int, str]] = []
        self._in_active: set[str] = set()
        self._backoff: list[tuple[float, int, str]] = []  # (ready at, sequence, uid)
        self._backoff_at: dict[str, float] = {}
        self._unschedulable: dict[str, tuple[Refused, float]] = {}  # uid -> (why, since)
        self._attempts: dict[str, int] = {}
        self._in_flight: set[str] = set()
        self._again: set[str] = set()  # changed while in flight: try once more after
        # kube-scheduler's moveRequestCycle: cluster events so far, and the count when each pod's
        # attempt began. A pod refused by an attempt that began before the last event goes to the
        # backoff queue, not to wait for an event that has already come.
        self._moves = 0
        self._began: dict[str, int] = {}
        self._outcomes: OrderedDict[str, tuple[int, dict[str, Any]]] = OrderedDict()
        self._done_count = itertools.count()
        self._seq = itertools.count()
        self._gauges()

    # -- what the views and the event path call ------------------------------------------------
    def add(self, uid: str) -> None:
        """The pod is new, changed, or found again (a listing): try it now."""
        with self._cond:
            if uid in self._in_flight:
                self._again.add(uid)
                return
            self._unschedulable.pop(uid, None)
            self._backoff_at.pop(uid, None)
            self._activate(uid)

    def forget(self, uid: str) -> None:
        """Bound, deleted, or not ours: nothing more to do."""
        with self._cond:
            self._unschedulable.pop(uid, None)
            self._backoff_at.pop(uid, None)
            self._again.discard(uid)
            self._attempts.pop(uid, None)
            if uid in self._in_active:
                self._in_active.discard(uid)  # left in the heap, skipped when popped

    def cluster_event(self, event: tuple[str, str], node: str) -> None:
        """A cluster event on `node`: the unschedulable pods whose refusal it may undo move on,
        to the active queue or, while their backoff lasts, to the backoff queue."""
        with self._cond:
            self._moves += 1
            moved = [uid for uid, (refused, _) in self._unschedulable.items() if requeues(refused, event, node)]
            for uid in moved:
                del self._unschedulable[uid]
                self._after_backoff(uid)

    def claim(self, uid: str) -> bool:
        """Take the pod for one attempt in this thread; False when an attempt is running."""
        with self._cond:
            if uid in self._in_flight:
                return False
            self._in_flight.add(uid)
            self._began[uid] = self._moves
            self._in_active.discard(uid)
            self._unschedulable.pop(uid, None)
            self._backoff_at.pop(uid, None)
            self._attempts[uid] = self._attempts.get(uid, 0) + 1
            return True

    def moves(self) -> int:
        """The cluster events so far: what settle's `began` is."""
        with self._cond:
            return self._moves

    def settle(self, uid: str, began: int, outcome: dict[str, Any], refused: Refused | None = None,
               retry: bool = False, jitter: bool = False) -> None:
        """Another pod's attempt, begun at moves() `began`, decided this one too (a gang's
        members): `outcome` is this pod's, and it waits as that attempt says, as if tried, unless an
        attempt at it is running (that one decides). A pod forgotten meanwhile stays forgotten."""
        with self._cond:
            if uid in self._in_flight:
                return
            self._record(uid, outcome)
            if uid not in self._attempts and uid not in self._in_active:
                return
            self._in_active.discard(uid)  # left in the heap, skipped when popped
            self._backoff_at.pop(uid, None)
            self._unschedulable.pop(uid, None)
            if refused is not None and began < self._moves:  # an event came during the attempt
                refused, retry = None, True
            if refused is not None:
                self._unschedulable[uid] = (refused, time.monotonic())
            elif retry:
                self._attempts[uid] = self._attempts.get(uid, 0) + 1
                self._after_backoff(uid, jitter)
            else:
                self._attempts.pop(uid, None)

    def done(self, uid: str, outcome: dict[str, Any], refused: Refused | None = None, retry: bool = False,
             jitter: bool = False) -> None:
        """The attempt ended: `refused` waits for an event, `retry` for its backoff (`jitter`: a
        random part of it, so that gangs racing for a GPU do not meet again), else forgotten."""
        with self._cond:
            self._in_flight.discard(uid)
            if self._began.pop(uid, self._moves) < self._moves and refused is not None:
                refused, retry = None, True  # an event came during the attempt: it may undo the refusal
            self._record(uid, outcome)
            if uid in self._again:
                self._again.discard(uid)
                self._activate(uid)
            elif refused is not None:
                self._unschedulable[uid] = (refused, time.monotonic())
            elif retry:
                self._after_backoff(uid, jitter)
            else:
                self._attempts.pop(uid, None)

    def outcome_after(self, uid: str, mark: int | None, timeout: float) -> dict[str, Any] | None:
        """The outcome of the attempt of `uid` that ends after `mark` (mark(): before it began)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                entry = self._outcomes.get(uid)
                if entry is not None and (mark is None or entry[0] >= mark):
                    return entry[1]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._outcome_ready.wait(left)

    def mark(self) -> int:
        """A point in time for outcome_after: outcomes recorded from now on."""
        with self._cond:
            return next(self._done_count) + 1

    # -- what the workers call -----------------------------------------------------------------
    def pop(self, timeout: float = 1.0) -> str | None:
        """The next pod to try, claimed; None after `timeout` with nothing due."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._backoff and self._backoff[0][0] <= now:
                    _, _, uid = heapq.heappop(self._backoff)
                    if self._backoff_at.get(uid) is not None and self._backoff_at[uid] <= now:
                        del self._backoff_at[uid]
                        self._activate(uid)
                self._flush_unschedulable(now)
                while self._active:
                    uid = heapq.heappop(self._active)[3]
                    if uid in self._in_active:
                        self._in_active.discard(uid)
                        self._in_flight.add(uid)
                        self._began[uid] = self._moves
                        self._attempts[uid] = self._attempts.get(uid, 0) + 1
                        return uid
                wait = deadline - now
                if self._backoff:
                    wait = min(wait, self._backoff[0][0] - now)
                if wait <= 0 and now >= deadline:
                    return None
                self._cond.wait(max(0.01, min(wait, 1.0)))

    # -- inside the lock ----------------------------------------------------------------------
    def _record(self, uid: str, outcome: dict[str, Any]) -> None:
        self._outcomes[uid] = (next(self._done_count), outcome)
        self._outcomes.move_to_end(uid)
        while len(self._outcomes) > MAX_OUTCOMES:
            self._outcomes.popitem(last=False)
        self._outcome_ready.notify_all()

    def _activate(self, uid: str) -> None:
        if uid not in self._in_active:
            self._in_active.add(uid)
            heapq.heappush(self._active, (*active_order(self._seed, uid, time.monotonic()), next(self._seq), uid))
        self._cond.notify()

    def _after_backoff(self, uid: str, jitter: bool = False) -> None:
        seconds = backoff_seconds(self._attempts.get(uid, 1))
        ready = time.monotonic() + (jittered(seconds, random.random()) if jitter else seconds)
        self._backoff_at[uid] = ready
        heapq.heappush(self._backoff, (ready, next(self._seq), uid))
        self._cond.notify()

    def _flush_unschedulable(self, now: float) -> None:
        stale = [uid for uid, (_, since) in self._unschedulable.items() if now - since >= UNSCHEDULABLE_FLUSH_SECONDS]
        for uid in stale:
            del self._unschedulable[uid]
            self._activate(uid)

    def _gauges(self) -> None:
        """The pending-pod gauges read the queue when scraped, not at each move: a placement moves
        a pod several times, and setting three gauges at each move cost more than the move."""
        PENDING_PODS.labels("active").set_function(lambda: len(self._in_active))
        PENDING_PODS.labels("backoff").set_function(lambda: len(self._backoff_at))
        PENDING_PODS.labels("unschedulable").set_function(lambda: len(self._unschedulable))

    def placing(self) -> bool:
        """Whether a pod is to be tried now or an attempt is in flight (read without the lock:
        a hint for the Event recorder, which waits behind placements)."""
        return bool(self._in_active or self._in_flight)

    def sizes(self) -> dict[str, int]:
        with self._cond:
            return {"active": len(self._in_active), "backoff": len(self._backoff_at),
                    "unschedulable": len(self._unschedulable), "in_flight": len(self._in_flight)}
