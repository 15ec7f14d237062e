"""check/check.py: logs its node and devices in a loop, unbuffered, and stops at once on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

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
        assert process.wait(timeout=5) == 0
    finally:
        process.kill()


def test_says_unset_rather_than_failing():
    process = start(CHECK_INTERVAL_SECONDS="30")
    try:
        assert process.stdout.readline() == "node=<unset> CUDA_VISIBLE_DEVICES=<unset>\n"
        process.send_signal(signal.SIGTERM)
        # In the middle of a 30 s wait: it must not sleep the interval out (the kubelet would
        # wait out the grace period and kill it).
        assert process.wait(timeout=5) == 0
    finally:
        process.kill()
