"""What /proc says of a function's processes, for the benchmarks."""
from __future__ import annotations

from pathlib import Path


def peak_rss_mb(pid: int) -> float:
    """The largest VmHWM of the process and its children (gunicorn's master and worker)."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(c) for c in children.read_text().split()]
    peaks = []
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return max(peaks)
