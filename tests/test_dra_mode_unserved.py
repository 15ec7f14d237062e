"""Device env mode dra on an API server that does not serve resource.k8s.io/v1 (before Kubernetes
1.34, or with the group turned off): bind reads DEVICE_ENV_MODE, says in one log line and in its
readiness which version it needs and how to fix it, and stays up, not ready. Here: the setting, the
words, and the DRA watches over scripted listings (functions/bind/informers.py); bind as a whole,
over a fake API, is in test_placer.py, and on a real API server with the group off in
test_dra_mode_unserved_cluster.py."""
from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from conftest import REPO
from kubeapi.errors import APIError

sys.path.insert(0, str(REPO / "functions" / "bind"))
import informers  # noqa: E402
from config import BindConfig, ConfigError, dra_mode_unserved  # noqa: E402
from informers import Informer, Requirement  # noqa: E402

NOT_SERVED = APIError(404, "the server could not find the requested resource")


# -- the setting ---------------------------------------------------------------------------------
def test_bind_reads_the_install_s_device_env_mode_as_mutate_does():
    assert BindConfig.from_environment({}).device_mode == "cuda"
    assert BindConfig.from_environment({"DEVICE_ENV_MODE": "dra"}).device_mode == "dra"
    with pytest.raises(ConfigError, match="DEVICE_ENV_MODE: 'rocm': expected one of cuda, nvidia, dra"):
        BindConfig.from_environment({"DEVICE_ENV_MODE": "rocm"})
    with pytest.raises(ConfigError, match="DEVICE_ENV_MODE dra needs GPU_SCHEDULER_DRA on"):
        BindConfig.from_environment({"DEVICE_ENV_MODE": "dra", "GPU_SCHEDULER_DRA": "false"})


# -- the words -----------------------------------------------------------------------------------
V1_33 = {"major": "1", "minor": "33", "gitVersion": "v1.33.4"}


def test_an_older_api_server_is_named_with_the_version_dra_mode_needs_and_both_fixes():
    said = dra_mode_unserved(V1_33)
    assert said == ("device env mode dra (DEVICE_ENV_MODE) needs resource.k8s.io/v1 (Kubernetes 1.34 or newer); this"
                    " API server is v1.33.4 and does not serve it: set the chart's deviceEnvMode to cuda or nvidia"
                    " (DEVICE_ENV_MODE of bind and mutate), or upgrade to 1.34 or newer")
    assert "is v1.32.1 and" in dra_mode_unserved({"major": "1", "minor": "32+", "gitVersion": "v1.32.1"})


def test_a_newer_api_server_emulating_an_older_one_is_too_old_all_the_same():
    """kube-apiserver --emulated-version=1.33 serves what 1.33 serves: its /version says so."""
    said = dra_mode_unserved({"major": "1", "minor": "34", "emulationMajor": "1", "emulationMinor": "33",
                              "gitVersion": "v1.34.0"})
    assert "this API server is v1.34.0, emulating 1.33, and does not serve it" in said
    assert said.endswith("or upgrade to 1.34 or newer")


def test_a_new_enough_api_server_with_the_group_turned_off_is_told_to_turn_it_on():
    said = dra_mode_unserved({"major": "1", "minor": "34", "emulationMajor": "1", "emulationMinor": "34",
                              "gitVersion": "v1.34.0"})
    assert "this API server is v1.34.0 but does not serve it" in said and "upgrade" not in said
    assert said.endswith("or turn it on in kube-apiserver (--runtime-config=resource.k8s.io/v1=true, feature gate"
                         " DynamicResourceAllocation)")
    assert "is v1.35.2-gke.100 but" in dra_mode_unserved({"gitVersion": "v1.35.2-gke.100"})  # no major, minor


@pytest.mark.parametrize("version, named", [
    ({}, "(its version could not be read)"), ({"gitVersion": 7}, "(its version could not be read)"),
    ({"gitVersion": "unknown"}, "is unknown"), ({"gitVersion": "v1\n33 \"x\""}, "is 'v1\\n33 \"x\"'")])
def test_a_version_that_cannot_be_read_still_gets_the_requirement_and_the_fixes(version, named):
    said = dra_mode_unserved(version)
    assert f"; this API server {named} and does not serve it" in said
    assert "resource.k8s.io/v1 (Kubernetes 1.34 or newer)" in said and said.endswith("or upgrade to 1.34 or newer")


# -- the watches ---------------------------------------------------------------------------------
def scripted(listings: list) -> tuple:
    listings = list(listings)

    def list_pages():
        if not listings:  # the script is over: stay here (a daemon thread), never spin
            threading.Event().wait()
        answer = listings.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield from answer

    def watch(version, seconds):
        threading.Event().wait()
        yield from ()

    return list_pages, watch


def required_informer(name: str, listings: list, requirement: Requirement) -> Informer:
    list_pages, watch = scripted(listings)
    return Informer(name, list_pages, watch, lambda pages: [list(p) for p in pages], lambda kind, obj: None,
                    optional=True, required=requirement)


def wait_until(condition, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_required_kind_not_served_is_never_synced_and_says_why_once_for_all_its_watches(monkeypatch, caplog):
    """Both DRA watches find the API missing: neither is synced (bind is not ready), each has the
    requirement's words as its problem, and the API server's version is read and logged once."""
    monkeypatch.setattr(informers, "NOT_SERVED_RETRY_SECONDS", 0.02)
    reads = []
    requirement = Requirement(lambda: reads.append(1) or dra_mode_unserved(V1_33))
    made = [required_informer(name, [NOT_SERVED] * 3, requirement) for name in ("resourceslices", "resourceclaims")]
    with caplog.at_level(logging.INFO, logger="bind"):
        for informer in made:
            threading.Thread(target=informer._run, daemon=True).start()
        assert wait_until(lambda: all(i.problem for i in made))
        time.sleep(0.1)  # each looks again, finds it missing again
    assert not any(i.synced.is_set() for i in made) and not any(i.served for i in made)
    assert {i.problem for i in made} == {dra_mode_unserved(V1_33)}
    assert len(reads) == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [f"not ready: {dra_mode_unserved(V1_33)}"]
    assert not any(r.exc_info for r in caplog.records), "no traceback"


def test_a_required_kind_served_later_is_listed_and_ready(monkeypatch):
    """The API server upgraded (or the group turned on) while bind waits: the next look lists it."""
    monkeypatch.setattr(informers, "NOT_SERVED_RETRY_SECONDS", 0.02)
    informer = required_informer("resourceslices", [NOT_SERVED, [([], "7")]],
                                 Requirement(lambda: dra_mode_unserved(V1_33)))
    threading.Thread(target=informer._run, daemon=True).start()
    assert informer.synced.wait(5)
    assert informer.served and informer.problem == "" and informer.version == "7"


def test_other_failures_of_a_required_kind_are_retried_as_any_listing_is(monkeypatch):
    """Only a 404 means "not served": a 503 is an outage, backed off and listed again."""
    monkeypatch.setattr(informers, "FIRST_RETRY_SECONDS", 0.01)
    explained = []
    informer = required_informer("resourceclaims", [APIError(503, "unavailable"), [([], "9")]],
                                 Requirement(lambda: explained.append(1) or "never"))
    threading.Thread(target=informer._run, daemon=True).start()
    assert informer.synced.wait(5) and explained == []
