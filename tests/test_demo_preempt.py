"""`make demo PREEMPT=1`'s manifests (localcp/demo.py --preempt), offline: the seed of the high
class with nothing else changed, a holder of the low class on node4's GPU 3, and the classes' order."""
from __future__ import annotations

import json

import yaml

from gpu_scheduler.schedmap import parse_map
from localcp import demo


def test_the_seed_differs_by_its_priority_class_alone():
    shipped = yaml.safe_load(demo.SEED.read_text())
    high = json.loads(demo.seed(False, priority_class=demo.HIGH_CLASS))
    assert high["spec"]["template"]["spec"].pop("priorityClassName") == demo.HIGH_CLASS
    assert high == shipped


def test_the_holder_is_of_the_lower_class_on_node4_gpu_3():
    holder = demo.holder(demo.LOW_CLASS)
    assert holder["spec"]["template"]["spec"]["priorityClassName"] == demo.LOW_CLASS
    [entry] = parse_map(holder["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"]).values()
    assert (entry.node, tuple(entry.devices)) == ("node4", ("3",))
    values = {c["metadata"]["name"]: c["value"] for c in demo.PRIORITY_CLASSES}
    assert values[demo.LOW_CLASS] < values[demo.HIGH_CLASS]
    assert "priorityClassName" not in demo.holder()["spec"]["template"]["spec"]  # --gang's holder unchanged
