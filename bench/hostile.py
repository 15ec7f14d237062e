"""The hostile-input section of `make bench` (issue 15): what bad input costs.

- parse time at 1x, 10x and 100x the size: the map parser (uncached) and mutate's whole decision on
  a review body up to 3 MiB; the ratios show the cost is linear;
- peak memory of mutate and bind over hundreds of distinct maximum-size maps and events, against
  half of the deployed memory limit (knative/*-service.yaml);
- median and p99 of good reviews while hostile requests (3 MiB bodies, maximum-size maps, bodies
  that never finish) are sent at the same time, against the webhook's timeout.

Needs no control plane: mutate is served by gunicorn with the settings of localcp/mutate_gunicorn.py
(as the local control plane serves it, without TLS here), bind by functions-framework as in its
image, with an API server that refuses connections. Figures are printed next to their goals,
never asserted. `python -m bench.hostile [--smoke]` runs only this section.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from bench.proc import peak_rss_mb
from gpu_scheduler import schedmap
from gpu_scheduler.admission import admission_response
from gpu_scheduler.schedmap import MAX_DEVICES_PER_ENTRY, MAX_ENTRIES, MAX_MAP_BYTES
from localcp.cluster import REPO, free_port
from tests.fixtures import SAMPLES

MIB = 1024 * 1024
WEBHOOK_TIMEOUT_S = yaml.safe_load((REPO / "knative" / "webhook.yaml").read_text())["webhooks"][0]["timeoutSeconds"]


def _limit_mib(service: str) -> float:
    manifest = yaml.safe_load((REPO / "knative" / f"{service}-service.yaml").read_text())
    limit = manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    return float(limit[:-2])


def _sample(name: str) -> dict:
    return json.loads((SAMPLES / name).read_text())


REVIEW = _sample("admissionreview-v1-create-gpu-scheduler-check-3.json")
ADD = _sample("apiserversource-add-gpu-scheduler-check-0.json")


def max_size_map(seed: int) -> str:
    """A distinct valid map of MAX_ENTRIES entries, just under MAX_MAP_BYTES."""
    pad = "x" * 8
    lines = [f"{i}=n{seed}-{pad}-{i % 97}:{i % 8},{(i + 1) % 8},{(i + 2) % 8}" for i in range(MAX_ENTRIES)]
    text = "\n".join(lines)
    while len(text) > MAX_MAP_BYTES:
        pad = pad[:-1]
        text = "\n".join(f"{i}=n{seed}-{pad}-{i % 97}:{i % 8},{(i + 1) % 8},{(i + 2) % 8}" for i in range(MAX_ENTRIES))
    return text


def bad_map(lines: int) -> str:
    return "\n".join(f"{i}=Bad_Node:{i}" for i in range(lines))


def review_with(map_text: str, name: str = "gpu-scheduler-check-3", env_entries: int = 0) -> dict:
    review = copy.deepcopy(REVIEW)
    obj = review["request"]["object"]
    obj["metadata"].setdefault("annotations", {})["gpu-scheduling-map"] = map_text
    obj["metadata"]["name"] = name
    if env_entries:
        obj["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x" * 8} for i in range(env_entries)]
    return review


def _timed(fn, reps: int) -> float:
    """The fastest of `reps` runs of `fn()`, in seconds: on a shared machine the minimum is the
    figure least disturbed by others."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


# -- 1. linear cost ----------------------------------------------------------------------------------
def parse_scaling(reps: int) -> dict:
    """The parser uncached (schedmap._parse) on valid and invalid maps at 1x, 10x, 100x; mutate's
    decision (json.loads + parse + decide + answer) on bodies of about 30 KiB, 300 KiB, 3 MiB."""
    out: dict = {}
    for name, build in {"valid map": lambda n: "\n".join(f"{i}=node-{i % 4}:{i % 8}" for i in range(n)),
                        "invalid map (every line bad)": bad_map,
                        "devices (entries of 128)": lambda n: "\n".join(
                            f"{i}=n:" + ",".join(map(str, range(MAX_DEVICES_PER_ENTRY))) for i in range(max(1, n // 100)))}.items():
        sizes = {}
        for scale, n in (("1x", 100), ("10x", 1000), ("100x", 10000)):
            text = build(n)
            if len(text) > MAX_MAP_BYTES:
                text = text[:MAX_MAP_BYTES].rsplit("\n", 1)[0]

            def parse(text=text):
                try:
                    schedmap._parse(text)
                except schedmap.MapError:
                    pass
            sizes[scale] = {"bytes": len(text), "ms": _timed(parse, reps) * 1000}
        out[name] = sizes
    bodies = {}
    for scale, env in (("1x", 600), ("10x", 6000), ("100x", 60000)):
        review = review_with(bad_map(100 if scale == "1x" else 1000 if scale == "10x" else MAX_ENTRIES), env_entries=env)
        raw = json.dumps(review).encode()
        raw = raw[:3 * MIB] if len(raw) > 3 * MIB else raw
        valid = review_with("\n".join(f"{i}=node-1:0" for i in range(10)), env_entries=env)
        raw_valid = json.dumps(valid).encode()

        def decide(raw=raw):
            try:
                admission_response(json.loads(raw))
            except ValueError:
                pass
        bodies[scale] = {"bytes": len(raw), "ms": _timed(decide, max(3, reps // 3)) * 1000,
                         "placed_ms": _timed(lambda: admission_response(json.loads(raw_valid)), max(3, reps // 3)) * 1000}
    out["mutate decision, whole body"] = bodies
    return out


# -- servers ----------------------------------------------------------------------------------------
def wait_live(url: str, process: subprocess.Popen, what: str, seconds: float = 30) -> None:
    """Until the server at `url` answers /health/liveness (RuntimeError if `process` exits or
    `seconds` pass first)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"{url}/health/liveness", timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


class Server:
    def __init__(self, target: str, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {**os.environ, "PYTHONPATH": str(REPO), "LOG_LEVEL": "WARNING", "DRAIN_SECONDS": "0", **env}
        if target == "mutate":
            app = 'functions_framework:create_app(target="mutate", source="functions/mutate/main.py")'
            command = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}", "--no-control-socket",
                       "--config", "python:localcp.mutate_gunicorn", "--chdir", str(REPO), app]
        else:
            command = [sys.executable, "-m", "functions_framework", "--target", target, "--source",
                       str(REPO / "functions" / target / "main.py"), "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, env=base, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_live(self.url, self.process, target)

    def post(self, body: bytes, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, float]:
        request = urllib.request.Request(self.url + "/", data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            error.read()
            status = error.code
        return status, time.perf_counter() - started

    def peak_rss_mib(self) -> float:
        return peak_rss_mb(self.process.pid)  # VmHWM is in KiB: /1024 gives MiB

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def unreachable_kubeconfig(directory: str) -> str:
    """A kubeconfig in `directory` naming an API server nobody listens for."""
    path = Path(directory) / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def _in_parallel(fn, items, workers: int) -> list:
    results: list = []
    lock = threading.Lock()
    queue = list(items)

    def run():
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            result = fn(item)
            with lock:
                results.append(result)
    threads = [threading.Thread(target=run) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# -- 2. memory --------------------------------------------------------------------------------------
def peak_memory(count: int) -> dict:
    """Distinct maximum-size maps, `count` of them, 4 at a time: mutate as reviews, bind as pod
    events (half valid, half with an invalid last line), then peak RSS against the limits."""
    maps = [max_size_map(seed) for seed in range(count)]
    out = {}
    mutate = Server("mutate", {})
    try:
        statuses = _in_parallel(lambda m: mutate.post(json.dumps(review_with(m)).encode())[0], maps, 4)
        out["mutate"] = {"requests": count, "statuses": sorted(set(statuses)), "peak_mib": mutate.peak_rss_mib(),
                         "limit_mib": _limit_mib("mutate")}
    finally:
        mutate.stop()
    with tempfile.TemporaryDirectory() as directory:
        bind = Server("bind", {"KUBECONFIG": unreachable_kubeconfig(directory)})
        try:
            def event(pair):
                n, map_text = pair
                pod = copy.deepcopy(ADD["body"])
                pod["metadata"]["annotations"]["gpu-scheduling-map"] = map_text + ("\nBAD" if n % 2 else "")
                pod["metadata"]["uid"] = f"bench-{n}"
                return bind.post(json.dumps(pod).encode(), {**ADD["headers"], "Ce-Id": f"bench-{n}"})[0]
            statuses = _in_parallel(event, list(enumerate(maps)), 4)
            out["bind"] = {"requests": count, "statuses": sorted(set(statuses)), "peak_mib": bind.peak_rss_mib(),
                           "limit_mib": _limit_mib("bind")}
        finally:
            bind.stop()
    return out


# -- 3. good reviews under attack ------------------------------------------------------------------
def _trickle(url_port: int, stop: threading.Event) -> None:
    """A client that sends headers and then a body one byte at a time, forever."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", url_port), timeout=5) as sock:
                sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000000\r\n\r\n")
                while not stop.is_set():
                    sock.sendall(b" ")
                    time.sleep(0.2)
        except OSError:
            time.sleep(0.05)


def good_reviews_under_attack(good: int) -> dict:
    """Good reviews (5-entry map) one after another, while 3 senders post 3 MiB bodies (a
    maximum-size invalid map and thousands of env entries), 3 post distinct maximum-size maps, and
    4 trickle bodies that never finish. Also the same good reviews alone, for comparison."""
    good_body = json.dumps(review_with("0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n")).encode()
    big = json.dumps(review_with(bad_map(MAX_ENTRIES), env_entries=30000)).encode()
    big_reviews = [json.dumps(review_with(bad_map(MAX_ENTRIES), env_entries=n)).encode() for n in (40000, 45000)]
    big_reviews = [b for b in big_reviews if len(b) <= 3 * MIB] or [big]
    mutate = Server("mutate", {})
    stop = threading.Event()
    hostile_sent = [0]
    try:
        alone = [mutate.post(good_body)[1] for _ in range(max(30, good // 4))]

        # Made before the attack: the senders then only send (they share this process's GIL with
        # the thread that measures the good reviews).
        distinct = [json.dumps(review_with(max_size_map(1000 + seed))).encode() for seed in range(max(20, good // 4))]

        def flood(kind: int):
            seed = kind
            while not stop.is_set():
                body = big_reviews[seed % len(big_reviews)] if kind % 2 else distinct[seed % len(distinct)]
                seed += 1
                try:
                    mutate.post(body, timeout=30)
                    hostile_sent[0] += 1
                except OSError:
                    pass
        threads = [threading.Thread(target=flood, args=(k,), daemon=True) for k in range(6)]
        threads += [threading.Thread(target=_trickle, args=(mutate.port, stop), daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(1)
        results = [mutate.post(good_body, timeout=30) for _ in range(good)]
        stop.set()
        peak = mutate.peak_rss_mib()
    finally:
        stop.set()
        mutate.stop()
    times = [t for _, t in results]
    return {"good": good, "hostile_sent": hostile_sent[0], "statuses": sorted({s for s, _ in results}),
            "alone_ms": {"p50": statistics.median(alone) * 1000, "p99": _p(alone, 99) * 1000},
            "under_attack_ms": {"p50": statistics.median(times) * 1000, "p99": _p(times, 99) * 1000,
                                "max": max(times) * 1000},
            "peak_mib": peak, "webhook_timeout_s": WEBHOOK_TIMEOUT_S}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# -- the section ------------------------------------------------------------------------------------
def run(smoke: bool) -> dict:
    return {"parse": parse_scaling(9 if smoke else 15),
            "memory": peak_memory(40 if smoke else 300),
            "under_attack": good_reviews_under_attack(30 if smoke else 400)}


def rows(results: dict) -> list[str]:
    out = []

    def row(name, value, goal, ok=None):
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        out.append(f"{name:<58} {value:>18} {goal:>14}  {verdict}")
    for name, sizes in results["parse"].items():
        base = sizes["1x"]["ms"]
        figures = " / ".join(f"{sizes[s]['ms']:.2f}" for s in ("1x", "10x", "100x"))
        ratios = f"x{sizes['10x']['ms'] / base:.0f}, x{sizes['100x']['ms'] / base:.0f}"
        size = f"{sizes['100x']['bytes'] / 1024:.0f} KiB"
        linear = sizes["100x"]["ms"] / base <= 150
        row(f"hostile: {name}, 1x/10x/100x ms (100x = {size})", figures, "ratio ~10, ~100", None)
        row(f"  ratios 10x/1x, 100x/1x", ratios, "<= 150 at 100x", linear)
    placed = results["parse"]["mutate decision, whole body"]
    row("  the same bodies with a valid 10-entry map, 1x/10x/100x ms",
        " / ".join(f"{placed[s]['placed_ms']:.2f}" for s in ("1x", "10x", "100x")), "(report)", None)
    for target, m in results["memory"].items():
        half = m["limit_mib"] / 2
        row(f"hostile: peak RSS of {target}, {m['requests']} distinct max-size maps (MiB)",
            f"{m['peak_mib']:.0f} (HTTP {','.join(map(str, m['statuses']))})", f"< {half:.0f} MiB", m["peak_mib"] < half)
    a = results["under_attack"]
    margin = a["webhook_timeout_s"] * 1000 / 2
    row("hostile: good reviews alone, p50/p99 ms", f"{a['alone_ms']['p50']:.1f}/{a['alone_ms']['p99']:.1f}", "(report)")
    row(f"hostile: good reviews under attack, p50/p99 ms ({a['hostile_sent']} hostile)",
        f"{a['under_attack_ms']['p50']:.0f}/{a['under_attack_ms']['p99']:.0f}",
        f"p99 < {margin:.0f} ms", a["under_attack_ms"]["p99"] < margin and a["statuses"] == [200])
    row("  mutate peak RSS during the attack (MiB)", f"{a['peak_mib']:.0f}",
        f"< {results['memory']['mutate']['limit_mib'] / 2:.0f} MiB", a["peak_mib"] < results["memory"]["mutate"]["limit_mib"] / 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    results = run(args.smoke)
    print("\n".join(rows(results)))
    print(f"(hostile section: {time.perf_counter() - started:.0f} s)")
    if not args.smoke:
        (REPO / "bench" / "results-hostile.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
