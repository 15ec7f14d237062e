"""`make demo GANG=1`'s manifests (localcp/demo.py --gang), offline: the seed as a gang of five
with its map unchanged, and a holder that is another workload wanting node4's GPU 3."""
from __future__ import annotations

import json

import yaml

from gpu_scheduler.fit import GANG_ANNOTATION
from gpu_scheduler.gangask import gang_size
from gpu_scheduler.schedmap import parse_map
from localcp import demo


def template_pod(manifest: dict) -> dict:
    return {"metadata": manifest["spec"]["template"]["metadata"], "spec": manifest["spec"]["template"]["spec"]}


def test_the_gang_is_the_seed_with_one_annotation():
    shipped = yaml.safe_load(demo.SEED.read_text())
    gang = json.loads(demo.seed(False, gang=True))
    assert gang["spec"]["template"]["metadata"]["annotations"].pop(GANG_ANNOTATION) == "true"
    assert gang == shipped and gang["spec"]["podManagementPolicy"] == "Parallel"
    assert gang_size(template_pod(json.loads(demo.seed(False, gang=True)))) == 5


def test_the_holder_is_another_workload_on_node4_gpu_3():
    holder = demo.holder()
    assert holder["metadata"]["name"] != demo.SEED_NAME and holder["spec"]["replicas"] == 1
    labels = holder["spec"]["template"]["metadata"]["labels"]
    assert holder["spec"]["selector"]["matchLabels"] == labels and labels != {"app": demo.SEED_NAME}
    [entry] = parse_map(holder["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"]).values()
    assert (entry.node, tuple(entry.devices)) == ("node4", ("3",))
    assert gang_size(template_pod(holder)) is None  # placed alone, as before
