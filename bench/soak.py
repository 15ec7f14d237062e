"""The soak: pod creations through mutate on the local control plane, as kube-apiserver uses it
under sustained load, and the count of creations that failed (goal 0).

Each creation is a real POST of a pod with a map to kube-apiserver 1.34, which calls mutate through
the shipped webhook registration (failurePolicy Fail) over TLS; `dryRun=All`, so that the API server
runs every admission step, the webhook included, and stores nothing (100,000 pods would otherwise
fill etcd and the nodes). A creation counts as failed when the API server does not answer 201 with
the pod mutate patched (its `gpu-scheduler/managed` label).

The load comes in bursts (CREATORS clients at once, as a rollout or a busy namespace does) with
idle gaps between them, because idle kept-alive connections are what failed: the gaps sweep
1.6 s to 3.2 s, around gunicorn's former 2 s keep-alive (plus its sweep of up to 1 s), where its
close met the API server's next POST on the connection; the full run adds one gap of 95 s, past
the API server's own 90 s idle limit, after which the API server has closed its connections first.

    python -m bench.soak [--admissions N] [--smoke]      (make bench runs it: bench/run.py)
"""
from __future__ import annotations

import argparse
import itertools
import json
import threading
import time

import urllib3

from localcp.cluster import ensure_built
from localcp.stack import LocalStack

ADMISSIONS, SMOKE_ADMISSIONS = 100_000, 3_000
CREATORS = 8
BURST = 2_000
GAPS = (1.6, 2.0, 2.4, 2.8, 3.2)  # seconds idle between bursts, in turn
LONG_GAP = 95.0  # once, in the full run
MAP = "".join(f"{i}=node{i + 1}:{i}\n" for i in range(4))


def _pod(namespace: str, i: int) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"soak-{i % 4}", "namespace": namespace,
                                    "annotations": {"gpu-scheduling-map": MAP}},
                       "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "busybox"}]}}).encode()


def soak(stack: LocalStack, admissions: int, long_gap: bool) -> dict:
    namespace = stack.create_namespace("soak")
    cp = stack.cp
    http = urllib3.PoolManager(maxsize=CREATORS, retries=False, ca_certs=str(cp.ca[1]),
                               cert_file=str(cp.admin[1]), key_file=str(cp.admin[0]),
                               timeout=urllib3.Timeout(connect=5, read=30))
    url = f"{cp.server}/api/v1/namespaces/{namespace}/pods?dryRun=All"
    failures: list[str] = []
    done = itertools.count()
    lock = threading.Lock()

    def create(i: int) -> None:
        try:
            response = http.request("POST", url, body=_pod(namespace, i), headers={"Content-Type": "application/json"})
            if response.status != 201:
                problem = f"HTTP {response.status}: {response.data[:300].decode(errors='replace')}"
            elif json.loads(response.data)["metadata"].get("labels", {}).get("gpu-scheduler/managed") != "true":
                problem = "created without mutate's patch"
            else:
                problem = None
        except urllib3.exceptions.HTTPError as error:
            problem = f"{type(error).__name__}: {error}"
        with lock:
            next(done)
            if problem:
                failures.append(problem)

    def burst(first: int, size: int) -> None:
        numbers = iter(range(first, first + size))
        take = threading.Lock()

        def creator() -> None:
            while True:
                with take:
                    i = next(numbers, None)
                if i is None:
                    return
                create(i)
        threads = [threading.Thread(target=creator) for _ in range(CREATORS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    started, idle = time.monotonic(), 0.0
    gaps = itertools.cycle(GAPS)
    first, bursts = 0, 0
    while first < admissions:
        size = min(BURST, admissions - first)
        burst(first, size)
        first, bursts = first + size, bursts + 1
        if first < admissions:
            gap = LONG_GAP if long_gap and bursts == 2 else next(gaps)
            time.sleep(gap)  # the idle gap is the point: connections sit kept alive
            idle += gap
    wall = time.monotonic() - started
    stack.api.delete_namespace(namespace)
    return {"admissions": admissions, "failed": len(failures), "failures": failures[:10], "bursts": bursts,
            "creators": CREATORS, "idle_s": round(idle, 1), "busy_rate_per_s": round(admissions / (wall - idle), 1)}


def run(smoke: bool, admissions: int | None = None) -> dict:
    print("bench: soak, pod creations through mutate with idle gaps (bench/soak.py)", flush=True)
    with LocalStack(event_source=False) as stack:
        return soak(stack, admissions or (SMOKE_ADMISSIONS if smoke else ADMISSIONS), long_gap=not smoke)


def rows(result: dict) -> list[str]:
    figure = f"{result['failed']} of {result['admissions']}"
    label = (f"soak: failed creations through mutate ({result['bursts']} bursts of {result['creators']} clients,"
             f" idle gaps; {result['busy_rate_per_s']:.0f}/s)")
    out = [f"{label:<62} {figure:>20} {'0':>12}  {'PASS' if result['failed'] == 0 else 'MISS'}"]
    out += [f"    {failure}" for failure in result["failures"]]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_ADMISSIONS} admissions, no 95 s gap")
    parser.add_argument("--admissions", type=int, help=f"how many (default {ADMISSIONS}; smoke {SMOKE_ADMISSIONS})")
    args = parser.parse_args()
    ensure_built()
    result = run(args.smoke, args.admissions)
    print(json.dumps(result, indent=2))
    print("\n".join(rows(result)))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
