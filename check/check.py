"""gpu-scheduler-check: logs where it runs and which GPUs it may use, forever.

NODE_NAME comes from the downward API (spec.nodeName); CUDA_VISIBLE_DEVICES from the webhook. In
DRA mode the driver adds what it injects for the pod's claim (CDI): the test driver's
claim_<claim>_<request>=true, NVIDIA's NVIDIA_VISIBLE_DEVICES; logged after the two, when set.
"""
import os
import signal
import sys
import time

INTERVAL = float(os.environ.get("CHECK_INTERVAL_SECONDS", "5"))


def line() -> str:
    node = os.environ.get("NODE_NAME", "<unset>")
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    injected = sorted(f"{k}={v}" for k, v in os.environ.items()
                      if k.startswith("claim_") or k == "NVIDIA_VISIBLE_DEVICES")
    return " ".join([f"node={node} CUDA_VISIBLE_DEVICES={devices}", *injected])


def main() -> int:
    stop = []
    # SIGTERM from the kubelet ends the pod promptly instead of waiting out the grace period.
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    while not stop:
        print(line(), flush=True)
        deadline = time.monotonic() + INTERVAL
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.1, INTERVAL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
