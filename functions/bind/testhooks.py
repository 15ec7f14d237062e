"""Test hooks, off the placing path: handles that end the process at a chosen write, so that the
tests can kill bind between two writes (tests/test_records_cluster.py, tests/test_gang_cluster.py).
Placer.from_environment injects one only when BindConfig asks (variables the tests set, never
set outside them); the placing code never asks whether a hook is on."""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Mapping

from config import BindConfig
from handle import AttemptHandle

HOOK_EXIT_CODE = 17


class ExitBeforeBinding(AttemptHandle):
    """exit_after_record: the process ends where the Binding would be written, after the records
    (and, in DRA mode, the claim)."""

    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        os._exit(HOOK_EXIT_CODE)


def exit_after_bindings(limit: int) -> Callable[..., AttemptHandle]:
    """exit_after_bindings: the process ends after `limit` Bindings, in the middle of a gang's
    (written one after the other, so that the n-th is the last)."""
    written = [0]
    lock = threading.Lock()

    class ExitAfterBindings(AttemptHandle):
        def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
            super().bind(namespace, name, body)
            with lock:
                written[0] += 1
                if written[0] >= limit:
                    os._exit(HOOK_EXIT_CODE)

    def make(*args: Any, **kwargs: Any) -> AttemptHandle:
        return ExitAfterBindings(*args, **{**kwargs, "pool": None})
    return make


def handle_type(config: BindConfig) -> Callable[..., AttemptHandle]:
    """The handle bind's attempts use: AttemptHandle, unless a test hook is asked for."""
    if config.exit_after_record:
        return ExitBeforeBinding
    if config.exit_after_bindings:
        return exit_after_bindings(config.exit_after_bindings)
    return AttemptHandle
