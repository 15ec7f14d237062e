"""Test hooks, off the placing path: handles that end the process at a chosen write, so that the
tests can kill bind between two writes (tests/test_records_cluster.py, tests/test_gang_cluster.py).
Placer.from_environment injects one only when BindConfig asks (variables the tests set, never
set outside them); the placing code never asks whether a hook is on."""
from __future__ import annotations

import os
import signal
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
                    _stop_gunicorn_master()
                    os._exit(HOOK_EXIT_CODE)

    def make(*args: Any, **kwargs: Any) -> AttemptHandle:
        return ExitAfterBindings(*args, **{**kwargs, "pool": None})
    return make


def _stop_gunicorn_master() -> None:
    """Stop the gunicorn master this worker runs under (never any other parent): it would start
    another worker at once, with the same hook and the app preloaded, which could bind the next
    member of the gang before the test kills the instance (seen in CI: two members bound). The
    worker then stays a zombie, its exit code readable in /proc until the test kills the master."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            text = cmdline.read()  # gunicorn's, or functions-framework's CLI, which runs gunicorn
            if b"gunicorn" in text or b"functions_framework" in text:
                os.kill(parent, signal.SIGSTOP)
    except OSError:
        pass


def handle_type(config: BindConfig) -> Callable[..., AttemptHandle]:
    """The handle bind's attempts use: AttemptHandle, unless a test hook is asked for."""
    if config.exit_after_record:
        return ExitBeforeBinding
    if config.exit_after_bindings:
        return exit_after_bindings(config.exit_after_bindings)
    return AttemptHandle
