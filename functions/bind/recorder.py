"""Writes Events and PodScheduled conditions in the background, as client-go's recorder does:
placement never waits on them, and a full queue drops (and counts) rather than blocks. While
this instance has pods to place, they wait behind its Bindings (Recorder: `placing`)."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Callable

import prometheus_client as prom
from kubeapi.errors import APIError

from gpu_scheduler.events import PodRef, event_for, event_name, recount, unscheduled_condition

log = logging.getLogger("bind.recorder")
# A gang's waiting members hear how many of them exist at most this often (event_later): a gang of
# 100 created in 3 s would otherwise rewrite every member's Event at every member's creation.
LATER_SECONDS = 1.5
# While this instance has pods to try or attempts in flight, a write waits until it has none, for
# at most this long after it was asked for, and only while the queue is under DEFER_FILL full:
# the API server's time goes to Bindings first (issue 62: a backlog of pods sharing devices wrote
# two Events per Binding, and the drain took the writes' time), and nothing is dropped for waiting.
DEFER_SECONDS = 2.0
DEFER_FILL = 0.75
DROPPED = prom.Counter("gpu_scheduler_recorder_dropped_total", "Events and conditions not written", ["why"])


_stamp = [-1, ""]  # (second, its RFC 3339 text): Events are stamped to the second


def now() -> str:
    second = int(time.time())
    if _stamp[0] != second:
        _stamp[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))]
    return _stamp[1]


class Recorder:
    def __init__(self, api, instance: str, capacity: int = 1000, remembered: int = 4096,
                 placing: Callable[[], bool] = lambda: False):
        """`placing`: whether this instance has pods to try now or attempts in flight (its
        scheduling queue's); the writes wait behind those placements (DEFER_SECONDS)."""
        self.api = api
        self.instance = instance
        self._placing = placing
        self._hurry = 0  # flushes waiting: nothing waits behind placements meanwhile
        self._hurry_lock = threading.Lock()
        self._queue: queue.Queue[tuple[float, Callable[[], None]] | None] = queue.Queue(capacity)
        self._counts: OrderedDict[str, int] = OrderedDict()  # Event name -> count written
        self._conditions: OrderedDict[str, tuple[str, str]] = OrderedDict()  # pod uid -> written
        self._keyed: OrderedDict[tuple[str, str, str], str] = OrderedDict()  # (uid, reason, key) -> last message
        self._once: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (uid, reason) of each event_once written
        self._once_lock = threading.Lock()
        self._later: dict[str, tuple[float, tuple]] = {}  # pod uid -> (when asked, event_later's arguments)
        self._later_lock = threading.Lock()
        self._later_thread: threading.Thread | None = None
        self._remembered = remembered
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # -- what the placer calls ------------------------------------------------------------
    def event(self, pod: PodRef, kind: str, reason: str, message: str, action: str = "Scheduling",
              annotations: dict[str, str] | None = None, key: str = "", if_changed: bool = False) -> None:
        """One more occurrence of the Event: the same reason and message count up one Event.
        With a `key`, the same reason and key do, and the Event takes the latest message (a gang's
        member: one Event that says what the gang waits for now). `if_changed`: only when the
        message differs from the last one written under that key (a gang's members not attempted
        themselves: counting each up at every attempt of the gang would be N writes an attempt)."""
        with self._later_lock:
            self._later.pop(pod.uid, None)  # what is written now supersedes what waits
        if if_changed and key and self._keyed.get((pod.uid, reason, key)) == message:
            return
        if key:
            self._remember(self._keyed, (pod.uid, reason, key), message)
        self._submit(lambda: self._write_event(pod, kind, reason, message, action, annotations, key))

    def event_once(self, pod: PodRef, kind: str, reason: str, message: str, action: str = "Scheduling") -> None:
        """An Event the pod gets once from this instance, however many attempts it takes (a
        notice: gpu_scheduler/notices.py). Remembered by (pod, reason) as the other Events are, so
        a pod forgotten past `remembered`, or another instance, counts the same Event up rather
        than adding one. Supersedes nothing: what event_later holds for the pod still comes."""
        with self._once_lock:
            if (pod.uid, reason) in self._once:
                return
            self._remember(self._once, (pod.uid, reason), True)
        self._submit(lambda: self._write_event(pod, kind, reason, message, action))

    def event_later(self, pod: PodRef, kind: str, reason: str, message: str, annotations: dict[str, str],
                    key: str, condition: tuple[str, str] | None = None) -> None:
        """A keyed Event written LATER_SECONDS from now at the latest, with the latest message asked
        for meanwhile, and only if it differs from the last one written; dropped when any other
        Event of the pod is written first (the pod bound, or its gang's verdict changed).
        `condition`: the PodScheduled=False (reason, message) to write with it, coalesced alike
        (each write is also a watch event for every bind instance)."""
        with self._later_lock:
            asked = self._later.get(pod.uid, (time.monotonic(), ()))[0]
            self._later[pod.uid] = (asked, (pod, kind, reason, message, annotations, key, condition))
            if self._later_thread is None or not self._later_thread.is_alive():
                self._later_thread = threading.Thread(target=self._write_later, name="event-later", daemon=True)
                self._later_thread.start()

    def _write_later(self) -> None:
        while True:
            time.sleep(LATER_SECONDS / 3)
            now = time.monotonic()
            with self._later_lock:
                due = [uid for uid, (asked, _) in self._later.items() if now - asked >= LATER_SECONDS]
                writes = [self._later.pop(uid)[1] for uid in due]
            for pod, kind, reason, message, annotations, key, condition in writes:
                self.event(pod, kind, reason, message, annotations=annotations, key=key, if_changed=True)
                if condition is not None:
                    self.unschedulable(pod, *condition)

    def unschedulable(self, pod: PodRef, reason: str, message: str) -> None:
        if self._conditions.get(pod.uid) != (reason, message):
            self._submit(lambda: self._write_condition(pod, reason, message))

    def flush(self, timeout: float = 10) -> None:
        """Wait until everything submitted so far is written (tests, shutdown), at once: nothing
        waits behind placements meanwhile."""
        done = threading.Event()
        with self._hurry_lock:
            self._hurry += 1
        try:
            self._submit(done.set)
            done.wait(timeout)
        finally:
            with self._hurry_lock:
                self._hurry -= 1

    def _submit(self, work: Callable[[], None]) -> None:
        # Started on first use, not at import: gunicorn imports the function in its master and
        # forks the worker, and threads do not survive a fork.
        if self._thread is None or not self._thread.is_alive():
            with self._start_lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
                    self._thread.start()
        try:
            self._queue.put_nowait((time.monotonic(), work))
        except queue.Full:
            DROPPED.labels("queue-full").inc()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            asked, work = item
            self._after_placements(asked)
            try:
                work()
            except APIError as error:
                DROPPED.labels(str(error.status) if error.status else "unreachable").inc()
                log.info("event or condition not written", extra={"status": error.status, "detail": error.message})
            except Exception as error:  # the API may be down: the next failure writes again
                DROPPED.labels("unreachable").inc()
                log.info("event or condition not written", extra={"detail": str(error)})

    def _after_placements(self, asked: float) -> None:
        """Wait while this instance is placing, until DEFER_SECONDS after `asked`, unless the
        queue fills (a write dropped for waiting would be lost) or a flush waits."""
        room = self._queue.maxsize * DEFER_FILL
        while self._placing() and not self._hurry and self._queue.qsize() < room:
            left = asked + DEFER_SECONDS - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.02))

    def _remember(self, cache: OrderedDict, key: str, value) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self._remembered:
            cache.popitem(last=False)

    # -- the writes ------------------------------------------------------------------------
    def _write_event(self, pod: PodRef, kind: str, reason: str, message: str, action: str,
                     annotations: dict[str, str] | None = None, key: str = "") -> None:
        name = event_name(pod, reason, key or message)
        stamp = now()
        count = self._counts.get(name)
        if count is None:
            try:
                self.api.create_event(pod.namespace, event_for(pod, kind, reason, message, stamp, self.instance, action,
                                                               annotations, key))
                self._remember(self._counts, name, 1)
                return
            except APIError as error:
                if not error.conflict:
                    raise
            # Created before by another instance, or by us before a restart: count on from it.
            count = self.api.read_event(pod.namespace, name).get("count") or 1
        try:
            changes = {**recount(count + 1, stamp), **({"message": message[:1024]} if key else {})}
            self.api.patch_event(pod.namespace, name, changes)
            self._remember(self._counts, name, count + 1)
        except APIError as error:
            if not error.not_found:
                raise
            self._counts.pop(name, None)  # expired (the API server keeps Events for an hour)
            self._write_event(pod, kind, reason, message, action, annotations, key)

    def _write_condition(self, pod: PodRef, reason: str, message: str) -> None:
        body = unscheduled_condition(reason, message, now())
        body["metadata"] = {"uid": pod.uid}  # a precondition: never touch a re-created pod
        self.api.patch_pod_status(pod.namespace, pod.name, body)
        self._remember(self._conditions, pod.uid, (reason, message))
