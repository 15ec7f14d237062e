"""check/check.py: logs its node and devices in a loop, unbuffered, and stops at once on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import REPO


def start(**env):
    return subprocess.Popen([sys.executable, str(REPO / "check" / "check.py")], stdout=subprocess.PIPE, text=True,
                            env={"PATH": os.environ["PATH"], "CHECK_INTERVAL_SECONDS": "0.2", **env})


def test_logs_node_and_devices_in_a_loop_unbuffered_and_stops_on_sigterm():
    process = start(NODE_NAME="node3", CUDA_VISIBLE_DEVICES="0,1,2")
    try:
        # Read through a pipe while it runs: lines arrive only if the program flushes them.
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines == ["node=node3 CUDA_VISIBLE_DEVICES=0,1,2\n"] * 3
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - started < 1.0  # promptly, not after the interval or a grace period
    finally:
        process.kill()


def test_says_unset_rather_than_failing():
    process = start(CHECK_INTERVAL_SECONDS="30")
    try:
        assert process.stdout.readline() == "node=<unset> CUDA_VISIBLE_DEVICES=<unset>\n"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=2) == 0  # even in the middle of a 30 s wait
    finally:
        process.kill()
