"""bind's Event recorder waits behind the instance's placements (functions/bind/recorder.py:
DEFER_SECONDS): while pods are to be tried, an Event is written once none is, or DEFER_SECONDS
after it was asked for, or at once when the queue is filling or a flush waits. Over a fake API:
what is under test is the recorder's order of writes, not the API server."""
from __future__ import annotations

import sys
import threading

import pytest

from conftest import REPO
from gpu_scheduler.events import PodRef

sys.path.insert(0, str(REPO / "functions" / "bind"))
import recorder as recorder_module  # noqa: E402
from recorder import Recorder  # noqa: E402

POD = PodRef("ns", "p-0", "uid-0")


class EventsAPI:
    """Takes Events; each one written sets `written`."""

    def __init__(self):
        self.events: list[dict] = []
        self.conditions: list[dict] = []
        self.written = threading.Event()

    def create_event(self, namespace: str, event: dict) -> dict:
        self.events.append(event)
        self.written.set()
        return event

    def patch_pod_status(self, namespace: str, name: str, patch: dict) -> dict:
        self.conditions.append(patch)
        return patch


@pytest.fixture
def placing():
    flag = threading.Event()
    flag.set()
    return flag


def test_an_event_waits_while_the_instance_is_placing_and_is_written_once_it_is_not(placing, monkeypatch):
    monkeypatch.setattr(recorder_module, "DEFER_SECONDS", 30.0)
    api = EventsAPI()
    recorder = Recorder(api, "bind-a", placing=placing.is_set)
    recorder.event(POD, "Normal", "Scheduled", "assigned")
    # A negative check, bounded: the deferral is 30 s, so a write within 0.3 s is the old order
    assert not api.written.wait(0.3), "written while the instance still had pods to place"
    placing.clear()
    assert api.written.wait(5), "not written once the instance had nothing left to place"
    assert api.events[0]["reason"] == "Scheduled"


def test_an_event_waits_at_most_defer_seconds(placing, monkeypatch):
    monkeypatch.setattr(recorder_module, "DEFER_SECONDS", 0.2)
    api = EventsAPI()
    recorder = Recorder(api, "bind-a", placing=placing.is_set)  # placing throughout
    recorder.event(POD, "Normal", "Scheduled", "assigned")
    assert api.written.wait(5), "an Event waited past DEFER_SECONDS"


def test_a_filling_queue_is_written_at_once_rather_than_dropped(placing, monkeypatch):
    monkeypatch.setattr(recorder_module, "DEFER_SECONDS", 30.0)
    api = EventsAPI()
    recorder = Recorder(api, "bind-a", capacity=8, placing=placing.is_set)
    for i in range(8):
        recorder.event(PodRef("ns", f"p-{i}", f"uid-{i}"), "Normal", "Scheduled", "assigned")
    assert api.written.wait(5), "a queue three quarters full still waited behind placements"


def test_a_flush_writes_everything_at_once_while_placing(placing, monkeypatch):
    monkeypatch.setattr(recorder_module, "DEFER_SECONDS", 30.0)
    api = EventsAPI()
    recorder = Recorder(api, "bind-a", placing=placing.is_set)
    recorder.event(POD, "Normal", "Scheduled", "assigned")
    recorder.unschedulable(PodRef("ns", "p-1", "uid-1"), "Unschedulable", "no")  # a condition: another write
    recorder.flush(timeout=5)
    assert [e["reason"] for e in api.events] == ["Scheduled"] and len(api.conditions) == 1


def test_without_placing_nothing_waits():
    api = EventsAPI()
    recorder = Recorder(api, "bind-a")  # the default: never placing
    recorder.event(POD, "Normal", "Scheduled", "assigned")
    assert api.written.wait(5)
