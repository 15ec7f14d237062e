"""CPU per event bind answers (issue 62): bind served by its image's entry point three ways, side
by side in one run, each sent the same events over kept-alive connections as the adapter sends
them: with the lane (serving/fastlane.py, as shipped), with the lane off (the fast path behind
gunicorn's parser: GPU_SCHEDULER_FAST_LANE=off), and through Flask (GPU_SCHEDULER_FAST_PATH=off).
The event is the ApiServerSource's update of a bound pod (captured), the kind bind mostly gets:
it answers "ignored". Its API server is not there; nothing here needs one.

python -m bench.events [--events 3000] [--reps 3]"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from localcp import images
from localcp.cluster import free_port
from tests.fixtures import SAMPLES

from . import hostile, profile

REPO = Path(__file__).resolve().parent.parent
WAYS = {"lane": {}, "lane off": {"GPU_SCHEDULER_FAST_LANE": "off"}, "Flask": {"GPU_SCHEDULER_FAST_PATH": "off"}}
CONNECTIONS = 2


def serve_bind_image(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """bind run by its image's entry point (Dockerfile.bind) on a free port of this machine, in a
    session of its own, once it answers /health/liveness: (the process, its port)."""
    port = free_port()
    process = subprocess.Popen(
        images.read_dockerfile(REPO / "Dockerfile.bind").entrypoint, cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
             "PYTHONPATH": str(REPO), "PORT": str(port), "LOG_LEVEL": "WARNING", "DRAIN_SECONDS": "0", **env})
    hostile.wait_live(f"http://127.0.0.1:{port}", process, "bind", 60)
    return process, port


def _send(port: int, n: int, body: bytes, headers: dict[str, str]) -> None:
    def one(count: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(count):
            connection.request("POST", "/", body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"bind answered {response.status}")
        connection.close()
    threads = [threading.Thread(target=one, args=(n // CONNECTIONS,)) for _ in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def event_cpu(events: int = 3000, reps: int = 3) -> dict:
    """CPU ms per event (bind's master and worker, from /proc) for each way, medians of `reps`
    alternated runs, and the lane's ratio to the others."""
    captured = json.loads((SAMPLES / "apiserversource-update-gpu-scheduler-check-2-bound.json").read_text())
    body = json.dumps(captured["body"]).encode()
    headers = {**captured["headers"], "Content-Type": "application/json"}
    figures: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = hostile.unreachable_kubeconfig(tmp)
        servers = {way: serve_bind_image({"KUBECONFIG": kubeconfig, **env}) for way, env in WAYS.items()}
        try:
            for process, port in servers.values():
                _send(port, 200, body, headers)  # warm: imports, connections, caches
            for rep in range(reps):
                for way in (list(WAYS) if rep % 2 == 0 else list(WAYS)[::-1]):
                    process, port = servers[way]
                    before = profile.cpu_seconds(process.pid)
                    _send(port, events, body, headers)
                    figures[way].append((profile.cpu_seconds(process.pid) - before) * 1000 / events)
        finally:
            for process, _ in servers.values():
                os.killpg(process.pid, signal.SIGINT)
                process.wait(timeout=20)
    ms = {way: statistics.median(values) for way, values in figures.items()}
    return {"events": events, "reps": reps, "cpu_ms_per_event": ms, "runs": figures,
            "lane_over_lane_off": ms["lane"] / ms["lane off"], "lane_over_flask": ms["lane"] / ms["Flask"]}


def rows(figures: dict) -> list[str]:
    ms = figures["cpu_ms_per_event"]
    return [f"  CPU ms per event bind answers: lane / lane off / Flask     "
            f"{ms['lane']:.3f} / {ms['lane off']:.3f} / {ms['Flask']:.3f}     (report)",
            f"  the lane / the lane off (gunicorn's parser)               {figures['lane_over_lane_off']:.2f}     (report)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    figures = event_cpu(args.events, args.reps)
    print(json.dumps(figures, indent=2))
    print("\n".join(rows(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
