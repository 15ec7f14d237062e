"""bind's list-and-watch (functions/bind/informers.py) over scripted listings and watches: what
reaches the view, where the next watch starts, and what makes it list again. The real behaviour
(an API server killed and restarted, a watch ended by the server) is in test_faults and
test_records_cluster."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "functions" / "bind"))
import informers  # noqa: E402
from informers import Informer, WatchGone  # noqa: E402


def pod(name: str, version: str) -> dict:
    return {"metadata": {"name": name, "resourceVersion": version}}


class View:
    def __init__(self):
        self.listings: list[list[str]] = []
        self.changes: list[tuple[str, str]] = []

    def replace(self, pages):
        self.listings.append([p["metadata"]["name"] for items in pages for p in items])

    def apply(self, kind, obj):
        self.changes.append((kind, obj["metadata"]["name"]))


def informer(view: View, listings, watches) -> Informer:
    listings, watches = list(listings), list(watches)
    calls = {"watch_from": []}

    def list_pages():
        if not listings:  # the script is over: stay here (a daemon thread), never spin
            threading.Event().wait()
        answer = listings.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield from answer

    def watch(version, seconds):
        calls["watch_from"].append(version)
        answer = watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield from answer
    made = Informer("pods", list_pages, watch, view.replace, view.apply)
    made.calls = calls
    return made


def test_a_paged_listing_is_one_replace_at_the_first_pages_version_and_marks_it_synced():
    view = View()
    made = informer(view, [[([pod("a", "5")], "10"), ([pod("b", "6")], "10")]], [])
    assert not made.synced.is_set()
    assert made._list_once() == "10"
    assert view.listings == [["a", "b"]] and made.synced.is_set() and made.version == "10"


def test_a_watch_applies_changes_and_continues_from_the_last_version_bookmarks_included():
    view = View()
    events = [("ADDED", pod("c", "11"), 1), ("BOOKMARK", pod("", "15"), 1), ("DELETED", pod("c", "16"), 1)]
    made = informer(view, [], [events])
    assert made._follow("10") == "16"
    assert view.changes == [("ADDED", "c"), ("DELETED", "c")]  # a bookmark moves the version only
    assert made.version == "16" and made.calls["watch_from"] == ["10"]


def test_an_error_event_ends_the_watch_for_a_new_listing():
    made = informer(View(), [], [[("ERROR", {"message": "too old resource version", "code": 410}, 1)]])
    with pytest.raises(WatchGone, match="too old"):
        made._follow("10")


def test_a_watch_that_ends_at_once_with_nothing_is_a_failure_not_a_loop():
    made = informer(View(), [], [[]])
    with pytest.raises(ConnectionError):
        made._follow("10")


def test_a_failed_listing_is_retried_with_backoff_and_then_relisted_whole(monkeypatch):
    monkeypatch.setattr(informers, "FIRST_RETRY_SECONDS", 0.01)
    view = View()
    gone = [("ERROR", {"message": "gone"}, 1)]
    made = informer(view, [ConnectionRefusedError("down"), [([pod("a", "5")], "20")], [([pod("b", "6")], "30")]],
                    [gone, gone])
    thread = threading.Thread(target=made._run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    # the second watch is asked for after the second listing: wait for both, not the listing alone
    while (len(view.listings) < 2 or len(made.calls["watch_from"]) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert view.listings[:2] == [["a"], ["b"]]  # the outage, then a listing after each 410
    assert made.calls["watch_from"][:2] == ["20", "30"]


def test_an_optional_kind_the_api_server_does_not_serve_is_an_empty_synced_view_until_it_is(monkeypatch):
    """DRA's kinds on an API server before 1.34 (404): bind is ready with no slices and no claims,
    rather than never ready, and lists again later in case the API is turned on."""
    from kubeapi.errors import APIError

    monkeypatch.setattr(informers, "NOT_SERVED_RETRY_SECONDS", 0.05)
    view = View()
    made = informer(view, [APIError(404, 'the server could not find the requested resource'), [([pod("a", "5")], "20")]], [[("ERROR", {"message": "x"}, 1)]])
    made.optional = True
    thread = threading.Thread(target=made._run, daemon=True)
    thread.start()
    assert made.synced.wait(5)
    assert view.listings[0] == [] and made.served is False
    deadline = time.monotonic() + 5
    while len(view.listings) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert view.listings[1] == ["a"] and made.served is True


def test_a_404_of_a_kind_bind_needs_is_retried_as_any_failure(monkeypatch):
    from kubeapi.errors import APIError

    monkeypatch.setattr(informers, "FIRST_RETRY_SECONDS", 0.01)
    view = View()
    made = informer(view, [APIError(404, 'the server could not find the requested resource'), [([pod("a", "5")], "20")]], [[("ERROR", {"message": "x"}, 1)]])
    thread = threading.Thread(target=made._run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not view.listings and time.monotonic() < deadline:
        time.sleep(0.01)
    assert view.listings[0] == ["a"] and made.served is True  # never an empty view for pods or nodes
