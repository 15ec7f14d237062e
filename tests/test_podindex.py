"""Which map entry a pod uses: `gpu_scheduler.podindex`, and `gpu_scheduler.placement` on top of it."""
from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_scheduler.placement import (
    MALFORMED_MAP, NO_ENTRY, UNKNOWN_INDEX, NotPlaceable, map_text, metadata, placement_for, spec,
)
from gpu_scheduler.podindex import JOB_INDEX_KEY, STATEFULSET_INDEX_LABEL, IndexUnknown, pod_index
from gpu_scheduler.schedmap import Placement

SEED = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n"
STS = STATEFULSET_INDEX_LABEL
JOB = JOB_INDEX_KEY


def meta(name=None, *, generate_name=None, labels=None, annotations=None, **extra):
    """Pod metadata with only the fields given."""
    result = dict(extra)
    if name is not None:
        result["name"] = name
    if generate_name is not None:
        result["generateName"] = generate_name
    if labels is not None:
        result["labels"] = labels
    if annotations is not None:
        result["annotations"] = annotations
    return result


def unknown(metadata_: dict) -> str:
    with pytest.raises(IndexUnknown) as caught:
        pod_index(metadata_)
    return str(caught.value)


# --------------------------------------------------------------------------- pod_index

@pytest.mark.parametrize("metadata_, expected", [
    # 1. the StatefulSet label (1.28+) wins over everything
    (meta(labels={STS: "3"}), 3),
    (meta(labels={STS: "0"}), 0),
    (meta(labels={STS: "12"}), 12),
    (meta("web-7", labels={STS: "2", JOB: "5"}, annotations={JOB: "6"}), 2),
    (meta("web-7", generate_name="web-", labels={STS: "2"}), 2),
    # 2. the Job completion index: annotation, then label
    (meta(annotations={JOB: "4"}), 4),
    (meta("job-x-9", annotations={JOB: "4"}, labels={JOB: "5"}), 4),
    (meta(labels={JOB: "5"}), 5),
    (meta("job-x-9", labels={JOB: "5"}), 5),
    (meta(labels={STS + "x": "8", "app": "9"}, annotations={"other": "1", JOB: "1"}), 1),
    # 3. the name's -<digits> suffix
    (meta("web-0"), 0),
    (meta("web-12"), 12),
    (meta("gpu-scheduler-check-3"), 3),
    (meta("a-b-c-42"), 42),
    (meta("web--1"), 1),
    (meta("0-1"), 1),
    (meta("web-3", generate_name="web-"), 3),  # StatefulSet pods have both
    (meta("web-3", labels=None, annotations={"gpu-scheduling-map": SEED}), 3),
    (meta("web-3", labels=["x"], annotations="not a map"), 3),  # non-object labels/annotations: ignored
    (meta("web-3", labels={"app": "web"}, annotations={"x": "y"}), 3),
    (meta("web-2147483647"), 2147483647),  # the largest index (int32, MAX_INDEX_DIGITS)
])
def test_pod_index(metadata_, expected):
    assert pod_index(metadata_) == expected


def test_first_rule_that_applies_is_final():
    # A present-but-invalid label is reported, never replaced by a guess from the next rule.
    assert unknown(meta("web-3", labels={STS: "x"}, annotations={JOB: "4"})) == (
        f"label {STS} is 'x', not a non-negative decimal integer")
    assert unknown(meta("web-3", annotations={JOB: ""}, labels={JOB: "4"})) == (
        f"annotation {JOB} is '', not a non-negative decimal integer")
    assert unknown(meta("web-3", labels={JOB: "-1"})) == f"label {JOB} is '-1', not a non-negative decimal integer"


@pytest.mark.parametrize("value", ["", "x", "01", "00", "-1", "+1", " 1", "1 ", "1\n", "1.0", "\u0663", "0x1",
                                   3, 3.0, None, True, ["3"], {"v": "3"}])
@pytest.mark.parametrize("where, build", [
    (f"label {STS}", lambda v: meta("web-1", labels={STS: v})),
    (f"annotation {JOB}", lambda v: meta("web-1", annotations={JOB: v})),
    (f"label {JOB}", lambda v: meta("web-1", labels={JOB: v})),
])
def test_declared_index_must_be_decimal(value, where, build):
    assert unknown(build(value)) == f"{where} is {value!r}, not a non-negative decimal integer"


@pytest.mark.parametrize("metadata_, message", [
    (meta(generate_name="web-"),
     "the pod has no name yet (only generateName 'web-'), so its index is unknown; "
     "use a StatefulSet, an Indexed Job, a JobSet or a LeaderWorkerSet, or name the label that holds the"
         " index in gpu-scheduler/index-label"),
    (meta("", generate_name="deploy-5d8f-"),
     "the pod has no name yet (only generateName 'deploy-5d8f-'), so its index is unknown; "
     "use a StatefulSet, an Indexed Job, a JobSet or a LeaderWorkerSet, or name the label that holds the"
         " index in gpu-scheduler/index-label"),
    (meta(), "the pod has no name, so its index is unknown"),
    (meta(""), "the pod has no name, so its index is unknown"),
    (meta(generate_name=""), "the pod has no name, so its index is unknown"),
    (meta(5), "the pod has no name, so its index is unknown"),
    (meta(5, generate_name=7), "the pod has no name, so its index is unknown"),
    (meta(["web-3"], generate_name="web-"),
     "the pod has no name yet (only generateName 'web-'), so its index is unknown; "
     "use a StatefulSet, an Indexed Job, a JobSet or a LeaderWorkerSet, or name the label that holds the"
         " index in gpu-scheduler/index-label"),
])
def test_no_name(metadata_, message):
    assert unknown(metadata_) == message


@pytest.mark.parametrize("name", ["web", "web-", "web-01", "web-00", "web-1a", "web1", "web-+1", "web_1",
                                  "3", "web-1.2", "web-\u0663", "web- 1"])
def test_name_without_index_suffix(name):
    assert unknown(meta(name, generate_name="web-")) == (
        f"pod name {name!r} does not end in -<index> and the pod has no "
        f"{STS} label or {JOB} annotation")


@pytest.mark.parametrize("metadata_, message", [
    (meta(annotations={JOB: "1" * 5000}), f"annotation {JOB} has 5000 digits, too many for an index"),
    (meta(labels={STS: "2" * 4301}), f"label {STS} has 4301 digits, too many for an index"),
    (meta("web-" + "3" * 4400), f"the -<index> suffix of pod name {('web-' + '3' * 56)!r} has 4400 digits, "
                                "too many for an index"),
])
def test_index_too_long_for_int(metadata_, message):
    # int() refuses more than 4300 digits with a plain ValueError; pod_index must say IndexUnknown.
    assert unknown(metadata_) == message


def test_index_unknown_is_a_value_error():
    assert issubclass(IndexUnknown, ValueError)


@given(st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True), st.integers(min_value=0, max_value=2**31 - 2))
def test_name_suffix_property(prefix, n):
    assert pod_index(meta(f"{prefix}-{n}")) == n
    assert pod_index(meta(f"{prefix}-{n}", labels={STS: str(n + 1)})) == n + 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
index_like = st.one_of(st.integers(0, 99).map(str), st.sampled_from(["", "01", "x", "-1"]), json_values)
metadata_strategy = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.text(max_size=12), st.integers(0, 99).map(lambda n: f"web-{n}"), json_values),
    "generateName": st.one_of(st.text(max_size=8), json_values),
    "labels": st.one_of(json_values, st.dictionaries(st.sampled_from([STS, JOB, "app"]), index_like)),
    "annotations": st.one_of(json_values, st.dictionaries(st.sampled_from([JOB, "x"]), index_like)),
})


@given(metadata_strategy)
def test_pod_index_is_total(metadata_):
    try:
        index = pod_index(metadata_)
    except IndexUnknown as error:
        assert str(error)
    else:
        assert type(index) is int and index >= 0


# --------------------------------------------------------------------------- placement_for

def pod(name="web-1", *, annotations=None, labels=None, generate_name=None, **spec_fields):
    """A pod carrying the seed map unless annotations say otherwise."""
    annotations = {"gpu-scheduling-map": SEED} if annotations is None else annotations
    return {"metadata": meta(name, generate_name=generate_name, labels=labels, annotations=annotations),
            "spec": dict(spec_fields)}


@pytest.mark.parametrize("index, node, devices", [
    (0, "node1", ("0", "1")), (1, "node2", ("2",)), (2, "node3", ("0", "1", "2")),
    (3, "node4", ("3",)), (4, "node4", ("3",)),
])
def test_placement_for_the_seed(index, node, devices):
    assert placement_for(pod(f"gpu-scheduler-check-{index}")) == Placement(node, devices)
    assert placement_for(pod("any", labels={STS: str(index)})) == Placement(node, devices)


@pytest.mark.parametrize("the_pod, reason, message", [
    (pod(annotations={"gpu-scheduling-map": "0=node1:00"}), MALFORMED_MAP,
     "invalid gpu-scheduling-map annotation: line 1 '0=node1:00': device '00' has a leading zero"),
    (pod(annotations={"gpu-scheduling-map": ""}), MALFORMED_MAP,
     "invalid gpu-scheduling-map annotation: the map has no entries"),
    (pod(annotations={"gpu-scheduling-map": 7}), MALFORMED_MAP,
     "invalid gpu-scheduling-map annotation: the annotation value must be a string, not int"),
    (pod(annotations={}), MALFORMED_MAP,  # callers check map_text first; placement_for still answers
     "invalid gpu-scheduling-map annotation: the annotation value must be a string, not NoneType"),
    # the map is checked before the index: a bad map is reported even for a pod without an index
    (pod(None, generate_name="web-", annotations={"gpu-scheduling-map": "x"}), MALFORMED_MAP,
     "invalid gpu-scheduling-map annotation: line 1 'x': expected '<index>=<node>:<devices>', found no '='"),
    (pod(None, generate_name="web-"), UNKNOWN_INDEX,
     "the pod has no name yet (only generateName 'web-'), so its index is unknown; "
     "use a StatefulSet, an Indexed Job, a JobSet or a LeaderWorkerSet, or name the label that holds the"
         " index in gpu-scheduler/index-label"),
    (pod("web"), UNKNOWN_INDEX,
     f"pod name 'web' does not end in -<index> and the pod has no {STS} label or {JOB} annotation"),
    (pod("web-5"), NO_ENTRY, "pod index 5 has no entry in the gpu-scheduling-map annotation (entries: 0, 1, 2, 3, 4)"),
    (pod("web-1", annotations={"gpu-scheduling-map": "10=a:0\n2=b:0\n0=c:1"}), NO_ENTRY,
     "pod index 1 has no entry in the gpu-scheduling-map annotation (entries: 0, 2, 10)"),
])
def test_not_placeable(the_pod, reason, message):
    with pytest.raises(NotPlaceable) as caught:
        placement_for(the_pod)
    assert (caught.value.reason, caught.value.message, str(caught.value)) == (reason, message, message)
    # no MapError/IndexUnknown chained into tracebacks: the message says it all
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None or caught.value.__suppress_context__


def test_not_placeable_survives_context_managers():
    # contextlib assigns __traceback__ on the way out; a frozen dataclass exception turned that
    # into FrozenInstanceError.
    @contextlib.contextmanager
    def scope():
        yield

    with pytest.raises(NotPlaceable) as caught:
        with scope():
            placement_for(pod("web-9"))
    assert caught.value.reason == NO_ENTRY
    caught.value.add_note("noted")
    assert caught.value.__notes__ == ["noted"]


@pytest.mark.parametrize("the_pod, expected", [
    ({"metadata": {"annotations": {"gpu-scheduling-map": "0=a:0"}}}, "0=a:0"),
    ({"metadata": {"annotations": {"gpu-scheduling-map": ""}}}, ""),
    ({"metadata": {"annotations": {"other": "0=a:0"}}}, None),
    ({"metadata": {"annotations": None}}, None),
    ({"metadata": {"annotations": ["gpu-scheduling-map"]}}, None),
    ({"metadata": {}}, None),
    ({"metadata": "x"}, None),
    ({}, None),
])
def test_map_text(the_pod, expected):
    assert map_text(the_pod) == expected


@pytest.mark.parametrize("value, expected", [({"a": 1}, {"a": 1}), (None, {}), ("x", {}), ([1], {})])
def test_metadata_and_spec_default_to_empty(value, expected):
    assert metadata({"metadata": value}) == expected
    assert spec({"spec": value}) == expected
    assert metadata({}) == {} and spec({}) == {}
