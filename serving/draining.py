"""Whether this server is draining: on its way out after a SIGTERM, still answering, no longer
ready. The gunicorn master sets it (serving/gunicorn_config.py); the functions' readiness
answers 503 from then on, so that endpoints drop the pod while it still serves what reaches it.

The flag is one byte of anonymous shared memory, made when this module is first imported: the
gunicorn master imports it (with its configuration, before it forks), so the workers it forks
share the byte, and the master's write is what every worker reads. A function served any other
way (functions-framework's own CLI, tests in one process) never drains: draining() is False.
Like fastpath and jsonlog, a helper of the shells, not of the pure core.
"""
from __future__ import annotations

import mmap

_flag = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: inherited by forked workers, not copied


def draining() -> bool:
    """True once the server has started draining (a SIGTERM reached its gunicorn master)."""
    return _flag[0] == 1


def start() -> None:
    """Mark the server as draining, for this process and every process it has forked or forks."""
    _flag[0] = 1
