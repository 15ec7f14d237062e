"""gpu-scheduler-check: logs where it runs and which GPUs it may use, forever.

NODE_NAME comes from the downward API (spec.nodeName); CUDA_VISIBLE_DEVICES from the webhook.
"""
import os
import signal
import sys
import time

INTERVAL = float(os.environ.get("CHECK_INTERVAL_SECONDS", "5"))


def line() -> str:
    node = os.environ.get("NODE_NAME", "<unset>")
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    return f"node={node} CUDA_VISIBLE_DEVICES={devices}"


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
