"""The `gpu-scheduling-map` grammar: `gpu_scheduler.schedmap`."""
from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpu_scheduler.schedmap import (
    MAX_GPU_INDEX, MAX_NODE_NAME, MAX_POD_INDEX, MapError, Placement, parse_index, parse_map,
)

SEED = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n"
UUID = "4c0f6a8e-2f3b-4d1e-9a7c-0123456789ab"
GPU = f"GPU-{UUID}"
MIG = f"MIG-{UUID}"
MIG_OLD = f"MIG-GPU-{UUID}/1/0"  # R450/R460 drivers


def as_dict(entries) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {index: (p.node, p.devices) for index, p in entries.items()}


def quoted(text: str) -> str:
    """How an error quotes offending text: repr, cut at 60 characters."""
    return repr(text if len(text) <= 60 else text[:60] + "...")


def map_error(text: str) -> MapError:
    with pytest.raises(MapError) as caught:
        parse_map(text)
    return caught.value


# --------------------------------------------------------------------------- valid maps

def test_seed_map():
    assert as_dict(parse_map(SEED)) == {
        0: ("node1", ("0", "1")),
        1: ("node2", ("2",)),
        2: ("node3", ("0", "1", "2")),
        3: ("node4", ("3",)),
        4: ("node4", ("3",)),
    }
    assert {i: p.visible_devices for i, p in parse_map(SEED).items()} == {
        0: "0,1", 1: "2", 2: "0,1,2", 3: "3", 4: "3"}


@pytest.mark.parametrize("text, expected", [
    pytest.param("0=node1:0", {0: ("node1", ("0",))}, id="single entry, no newline"),
    pytest.param("7=n:5\n", {7: ("n", ("5",))}, id="index need not start at 0"),
    pytest.param("  0 = node1 : 0 , 1  ", {0: ("node1", ("0", "1"))}, id="whitespace around tokens"),
    pytest.param("\t0=node1:0\t\n", {0: ("node1", ("0",))}, id="tabs"),
    pytest.param("0=a:0\r\n1=b:1\r\n", {0: ("a", ("0",)), 1: ("b", ("1",))}, id="CRLF"),
    pytest.param("0=a:0\r\n\r\n1=b:1", {0: ("a", ("0",)), 1: ("b", ("1",))}, id="CRLF blank line"),
    pytest.param("\n\n0=a:0\n   \n\n1=b:1\n\n", {0: ("a", ("0",)), 1: ("b", ("1",))}, id="blank lines"),
    pytest.param("# placement\n0=a:0\n  # indented\n#\n", {0: ("a", ("0",))}, id="comments"),
    pytest.param("#0=BAD\n0=a:0\n# 00=x:y:z", {0: ("a", ("0",))}, id="comments are not parsed"),
    pytest.param("1=b:1\n0=a:0", {0: ("a", ("0",)), 1: ("b", ("1",))}, id="any order"),
    pytest.param("0=a:3\n1=a:3", {0: ("a", ("3",)), 1: ("a", ("3",))}, id="shared node and devices"),
    pytest.param("0=n:2,0,1", {0: ("n", ("2", "0", "1"))}, id="device order kept"),
    pytest.param("0=n:0,10,100", {0: ("n", ("0", "10", "100"))}, id="multi-digit devices"),
    pytest.param("0=gpu-node-1.rack-2.example.com:0", {0: ("gpu-node-1.rack-2.example.com", ("0",))},
                 id="dotted node name"),
    pytest.param("0=1:0", {0: ("1", ("0",))}, id="all-digit node name"),
    pytest.param("0=a--b:0", {0: ("a--b", ("0",))}, id="double hyphen inside a label"),
    pytest.param("2147483647=n:1023", {2147483647: ("n", ("1023",))}, id="largest pod and GPU index"),
    pytest.param(f"0=n:{GPU}", {0: ("n", (GPU,))}, id="GPU uuid"),
    pytest.param(f"0=n:GPU-{UUID.upper()}", {0: ("n", ("GPU-" + UUID.upper(),))},
                 id="uppercase hex"),
    pytest.param(f"0=n:{MIG}", {0: ("n", (MIG,))}, id="MIG uuid"),
    pytest.param(f"0=n:{MIG_OLD}", {0: ("n", (MIG_OLD,))}, id="old-style MIG id"),
    pytest.param(f"0=n:0, {GPU} ,{MIG}", {0: ("n", ("0", GPU, MIG))}, id="mixed devices"),
    pytest.param(f"0=n:{GPU}\n1=n:{GPU}", {0: ("n", (GPU,)), 1: ("n", (GPU,))}, id="uuid shared"),
])
def test_valid_maps(text, expected):
    assert as_dict(parse_map(text)) == expected


def test_node_name_of_maximum_length():
    node = ".".join(["a" * 63] * 4)[:MAX_NODE_NAME - 1] + "z"
    assert len(node) == MAX_NODE_NAME == 253
    assert parse_map(f"0={node}:0")[0].node == node


def test_duplicate_index_after_a_bad_line_is_the_first_valid_one():
    # Only entries that parsed count as "already mapped": the bad line 1 is reported alone.
    error = map_error("0=BAD:0\n0=good:1")
    assert len(error.problems) == 1
    assert error.problems[0].startswith("line 1 '0=BAD:0': ")


# --------------------------------------------------------------------------- malformed maps

NOT_A_NODE = ("is not a valid Kubernetes node name (lowercase letters, digits, '-' and '.', "
              "starting and ending with a letter or digit)")
NOT_A_DEVICE = "is neither a non-negative integer nor a GPU-<uuid>/MIG-<uuid> identifier"


@pytest.mark.parametrize("line, why", [
    # the '=' and the index
    ("0node1:0", "expected '<index>=<node>:<devices>', found no '='"),
    ("node1", "expected '<index>=<node>:<devices>', found no '='"),
    ("=node1:0", "the pod index before '=' is missing"),
    ("  =node1:0", "the pod index before '=' is missing"),
    ("01=node1:0", "pod index '01' has a leading zero"),
    ("00=node1:0", "pod index '00' has a leading zero"),
    ("-1=node1:0", "pod index '-1' is not a non-negative decimal integer"),
    ("+1=node1:0", "pod index '+1' is not a non-negative decimal integer"),
    ("a=node1:0", "pod index 'a' is not a non-negative decimal integer"),
    ("1.5=node1:0", "pod index '1.5' is not a non-negative decimal integer"),
    ("1 2=node1:0", "pod index '1 2' is not a non-negative decimal integer"),
    ("0x1=node1:0", "pod index '0x1' is not a non-negative decimal integer"),
    ("1_000=node1:0", "pod index '1_000' is not a non-negative decimal integer"),
    ("\u0663=node1:0", "pod index '\u0663' is not a non-negative decimal integer"),  # Arabic-Indic 3
    ("\uff11=node1:0", "pod index '\uff11' is not a non-negative decimal integer"),  # fullwidth 1
    # the node
    ("0=node1", "expected ':' between the node name and the devices"),
    ("0=node1 0,1", "expected ':' between the node name and the devices"),
    ("0=", "expected ':' between the node name and the devices"),
    ("0=:0", "the node name after '=' is missing"),
    ("0=  :0", "the node name after '=' is missing"),
    ("0=Node1:0", f"node name 'Node1' {NOT_A_NODE}"),
    ("0=node_1:0", f"node name 'node_1' {NOT_A_NODE}"),
    ("0=-node:0", f"node name '-node' {NOT_A_NODE}"),
    ("0=node-:0", f"node name 'node-' {NOT_A_NODE}"),
    ("0=.node:0", f"node name '.node' {NOT_A_NODE}"),
    ("0=node.:0", f"node name 'node.' {NOT_A_NODE}"),
    ("0=a..b:0", f"node name 'a..b' {NOT_A_NODE}"),
    ("0=a.-b:0", f"node name 'a.-b' {NOT_A_NODE}"),
    ("0=no de:0", f"node name 'no de' {NOT_A_NODE}"),
    ("0=a=b:0", f"node name 'a=b' {NOT_A_NODE}"),
    ("0=n\u00f6de:0", f"node name 'n\u00f6de' {NOT_A_NODE}"),
    # the devices
    ("0=node1:", "the device list after ':' is empty"),
    ("0=node1:   ", "the device list after ':' is empty"),
    ("0=node1:0,", "device 2 in '0,' is empty"),
    ("0=node1:,0", "device 1 in ',0' is empty"),
    ("0=node1:0,,1", "device 2 in '0,,1' is empty"),
    ("0=node1:0, ,1", "device 2 in '0, ,1' is empty"),
    ("0=node1:,", "device 1 in ',' is empty"),
    ("0=node1:00", "device '00' has a leading zero"),
    ("0=node1:1,07", "device '07' has a leading zero"),
    ("0=node1:-1", f"device '-1' {NOT_A_DEVICE}"),
    ("0=node1:gpu0", f"device 'gpu0' {NOT_A_DEVICE}"),
    ("0=node1:0 1", f"device '0 1' {NOT_A_DEVICE}"),
    ("0=node1:0:1", f"device '0:1' {NOT_A_DEVICE}"),
    ("0=node1:0;1", f"device '0;1' {NOT_A_DEVICE}"),
    ("0=node1:0 # gpu zero", f"device '0 # gpu zero' {NOT_A_DEVICE}"),
    ("0=node1:GPU-123", f"device 'GPU-123' {NOT_A_DEVICE}"),
    (f"0=node1:gpu-{UUID}", f"device 'gpu-{UUID}' {NOT_A_DEVICE}"),
    (f"0=node1:{UUID}", f"device '{UUID}' {NOT_A_DEVICE}"),
    (f"0=node1:GPU-{UUID}x", f"device 'GPU-{UUID}x' {NOT_A_DEVICE}"),
    (f"0=node1:GPU-{UUID[:-1]}g", f"device 'GPU-{UUID[:-1]}g' {NOT_A_DEVICE}"),
    (f"0=node1:MIG-GPU-{UUID}", f"device 'MIG-GPU-{UUID}' {NOT_A_DEVICE}"),
    (f"0=node1:MIG-GPU-{UUID}/1", f"device 'MIG-GPU-{UUID}/1' {NOT_A_DEVICE}"),
    (f"0=node1:GPU-GPU-{UUID}", f"device 'GPU-GPU-{UUID}' {NOT_A_DEVICE}"),
    ("0=node1:\u0663", f"device '\u0663' {NOT_A_DEVICE}"),
    ("0=node1:0,1,0", "device 0 is listed more than once"),
    ("0=node1:0, 0", "device 0 is listed more than once"),
    ("0=node1:3,1,3,1,2", "device 1, 3 is listed more than once"),
    (f"0=node1:{GPU},{GPU}", f"device {GPU} is listed more than once"),
])
def test_malformed_line(line, why):
    """Every rule: the message names the line number, quotes the line, and says what is wrong."""
    text = f"# header\n\n{line}\n9=ok:0\n"
    error = map_error(text)
    assert error.problems == [f"line 3 {quoted(line.strip())}: {why}"]
    assert str(error) == f"invalid gpu-scheduling-map annotation: line 3 {quoted(line.strip())}: {why}"


def test_error_is_a_value_error():
    assert issubclass(MapError, ValueError)


@pytest.mark.parametrize("text, expected", [
    ("0=a:0\n0=b:1", ["line 2 '0=b:1': pod index 0 is already mapped on line 1"]),
    ("# c\n\n0=a:0\n1=a:0\n0=a:0\n",
     ["line 5 '0=a:0': pod index 0 is already mapped on line 3"]),
    ("5=a:0\r\n5=a:0\r\n5=b:2\r\n", ["line 2 '5=a:0': pod index 5 is already mapped on line 1",
                                     "line 3 '5=b:2': pod index 5 is already mapped on line 1"]),
])
def test_duplicate_index(text, expected):
    assert map_error(text).problems == expected


def test_every_bad_line_is_reported():
    error = map_error("bad\n0=a:0\n1=B:0\n\n2=c:01\n3=d:0")
    assert error.problems == [
        "line 1 'bad': expected '<index>=<node>:<devices>', found no '='",
        f"line 3 '1=B:0': node name 'B' {NOT_A_NODE}",
        "line 5 '2=c:01': device '01' has a leading zero",
    ]
    assert str(error) == "invalid gpu-scheduling-map annotation: " + "; ".join(error.problems)


@pytest.mark.parametrize("text", ["", "\n", "\n\n\n", "   \t ", "\r\n\r\n", "# nothing here", "#0=a:0\n  # x\n"])
def test_empty_map_is_an_error(text):
    assert map_error(text).problems == ["the map has no entries"]


@pytest.mark.parametrize("value, type_name", [(None, "NoneType"), (b"0=a:0", "bytes"), (5, "int"),
                                              (["0=a:0"], "list"), ({"0": "a:0"}, "dict")])
def test_non_string_value_is_an_error(value, type_name):
    assert map_error(value).problems == [f"the annotation value must be a string, not {type_name}"]


def test_lines_are_stripped_before_quoting():
    assert map_error("   0=Node:0 \r\n").problems[0].startswith("line 1 '0=Node:0': ")


def test_only_newline_separates_lines():
    # A lone \r (and other Unicode line breaks) is not a line break: the line is one bad entry.
    assert map_error("0=a:0\r1=b:1").problems == [f"line 1 '0=a:0\\r1=b:1': device '0\\r1=b:1' {NOT_A_DEVICE}"]
    assert map_error("0=a:0\u20281=b:1").problems[0].startswith("line 1 ")


def test_long_line_is_quoted_shortened():
    line = "0=" + "x" * 100 + "_:0"
    problem = map_error(line).problems[0]
    assert problem.startswith("line 1 '0=" + "x" * 58 + "...': node name '" + "x" * 60 + "...' ")
    assert "x" * 61 not in problem


def test_node_name_too_long():
    node = "a" * 254
    assert map_error(f"0={node}:0").problems == [
        f"line 1 {quoted('0=' + node + ':0')}: node name is 254 characters long; at most 253 are allowed"]


def test_index_too_long_for_int_is_a_map_error():
    # int() refuses more than sys.get_int_max_str_digits() (4300) digits with a plain ValueError;
    # the grammar refuses anything past MAX_POD_INDEX before converting.
    index = "1" * 5000
    assert map_error(f"{index}=n:0").problems == [
        f"line 1 {quoted(index + '=n:0')}: pod index {quoted(index)} is too large (5000 digits):"
        f" the limit is {MAX_POD_INDEX}"]


# --------------------------------------------------------------------------- parse_index, Placement

@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("7", 7), ("10", 10), ("4294967296", 4294967296),
    ("", None), ("00", None), ("01", None), ("-1", None), ("+1", None), (" 1", None), ("1 ", None),
    ("1\n", None), ("\u0663", None), ("1e3", None), ("1" * 5000, None), ("12345678901", None),
])
def test_parse_index(text, expected):
    assert parse_index(text) == expected


@pytest.mark.parametrize("devices, visible, indexes", [
    (("0",), "0", (0,)),
    (("0", "1"), "0,1", (0, 1)),
    (("2", "0", "1"), "2,0,1", (2, 0, 1)),
    ((GPU,), GPU, ()),
    (("3", GPU, MIG, "12", MIG_OLD), f"3,{GPU},{MIG},12,{MIG_OLD}", (3, 12)),
])
def test_placement(devices, visible, indexes):
    placement = Placement("n", devices)
    assert placement.visible_devices == visible
    assert placement.device_indexes() == indexes


def test_a_device_int_cannot_convert_is_never_dropped_from_the_indexes():
    # Never in a parsed map (MAX_GPU_INDEX); built by hand, it must fail loudly, not vanish from
    # a capacity check (it once did, and bind bound the pod).
    with pytest.raises(ValueError):
        Placement("n", ("0", "1" * 5000)).device_indexes()


def test_placement_is_immutable_and_compares_by_value():
    placement = Placement("n", ("0",))
    assert placement == Placement("n", ("0",))
    assert placement != Placement("n", ("1",))
    assert placement != Placement("m", ("0",))
    assert len({placement, Placement("n", ("0",))}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.node = "m"  # type: ignore[misc]


# --------------------------------------------------------------------------- properties

_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,12}[a-z0-9])?", fullmatch=True)
nodes = st.lists(_label, min_size=1, max_size=4).map(".".join).filter(lambda n: len(n) <= MAX_NODE_NAME)
_hex_case = st.sampled_from([str.lower, str.upper])
_uuid = st.builds(lambda u, case: case(str(u)), st.uuids(), _hex_case)
device = st.one_of(
    st.integers(min_value=0, max_value=MAX_GPU_INDEX).map(str),
    _uuid.map(lambda u: f"GPU-{u}"),
    _uuid.map(lambda u: f"MIG-{u}"),
    st.builds(lambda u, gi, ci: f"MIG-GPU-{u}/{gi}/{ci}", _uuid, st.integers(0, 99), st.integers(0, 99)),
)
device_lists = st.lists(device, min_size=1, max_size=6, unique=True).map(tuple)
maps = st.dictionaries(st.integers(min_value=0, max_value=10**9), st.tuples(nodes, device_lists),
                       min_size=1, max_size=8)
spaces = st.sampled_from(["", " ", "\t", "  ", " \t "])
newlines = st.sampled_from(["\n", "\r\n"])
comments = st.text(st.characters(blacklist_characters="\n"), max_size=20).map(lambda c: "#" + c)


@st.composite
def rendered_maps(draw):
    """A valid map and one of its many spellings: shuffled, spaced, commented, CRLF or LF."""
    entries = draw(maps)
    lines = []
    for index in draw(st.permutations(sorted(entries))):
        node, devices = entries[index]
        ws = lambda: draw(spaces)  # noqa: E731
        devices_text = ",".join(ws() + d + ws() for d in devices)
        lines.append(f"{ws()}{index}{ws()}={ws()}{node}{ws()}:{devices_text}{ws()}")
        for _ in range(draw(st.integers(0, 2))):
            lines.append(ws() + draw(st.one_of(st.just(""), comments)))
    lines.insert(0, draw(st.one_of(st.just(""), comments)))
    text = "".join(line + draw(newlines) for line in lines)
    if draw(st.booleans()):
        text = text.rstrip("\r\n")
    return entries, text


@given(rendered_maps())
@example(({0: ("node1", ("0", "1"))}, "0=node1:0,1"))
def test_round_trip(case):
    entries, text = case
    assert as_dict(parse_map(text)) == entries


@given(maps)
def test_canonical_rendering_round_trips(entries):
    text = "\n".join(f"{i}={node}:{','.join(devices)}" for i, (node, devices) in entries.items())
    parsed = parse_map(text)
    assert as_dict(parsed) == entries
    # ... and so does rendering the parsed map again from its visible_devices
    again = "\n".join(f"{i}={p.node}:{p.visible_devices}" for i, p in parsed.items())
    assert parse_map(again) == parsed


@given(device_lists)
def test_visible_devices_is_the_device_list(devices):
    placement = Placement("n", devices)
    assert placement.visible_devices.split(",") == list(devices)
    assert parse_map(f"0=n:{placement.visible_devices}")[0] == placement
    assert placement.device_indexes() == tuple(int(d) for d in devices if d.isdigit())


@given(maps, st.data())
def test_one_bad_line_is_found_where_it_is(entries, data):
    lines = [f"{i}={node}:{','.join(devices)}" for i, (node, devices) in entries.items()]
    bad = data.draw(st.sampled_from(["x", "0=n", "=n:0", "01=n:0", "1=N:0", "1=n:", "1=n:0,0", "1=n:00"]))
    position = data.draw(st.integers(0, len(lines)))
    lines.insert(position, bad)
    error = map_error("\n".join(lines))
    assert error.problems[0].startswith(f"line {position + 1} {bad!r}: ")
    assert len(error.problems) == 1


@given(maps, st.data())
def test_a_repeated_index_is_found_where_it_is(entries, data):
    lines = [f"{i}={node}:{','.join(devices)}" for i, (node, devices) in entries.items()]
    first = data.draw(st.integers(0, len(lines) - 1))
    repeat = data.draw(st.integers(first + 1, len(lines)))
    index = lines[first].partition("=")[0]
    lines.insert(repeat, f"{index}=other:0")
    assert map_error("\n".join(lines)).problems == [
        f"line {repeat + 1} '{index}=other:0': pod index {index} is already mapped on line {first + 1}"]


_map_alphabet = st.sampled_from(list("0123456789=:,.-# \t\r\nabzGPUMI/") + ["GPU-", "MIG-", UUID, "\u0663", "\x00"])


def _check_total(text: str) -> None:
    try:
        entries = parse_map(text)
    except MapError as error:
        assert error.problems, "a MapError names at least one problem"
        line_count = text.count("\n") + 1
        for problem in error.problems:
            match = re.match(r"line (\d+) ['\"]", problem)
            if match:
                assert 1 <= int(match.group(1)) <= line_count
            else:
                assert problem == "the map has no entries"
        return
    assert entries
    for index, placement in entries.items():
        assert type(index) is int and index >= 0
        assert isinstance(placement, Placement) and placement.devices
        assert len(set(placement.devices)) == len(placement.devices)


@settings(max_examples=500)
@given(st.text())
def test_total_on_any_text(text):
    _check_total(text)


@settings(max_examples=500)
@given(st.lists(_map_alphabet, max_size=60).map("".join))
def test_total_on_map_like_text(text):
    _check_total(text)


@given(st.lists(st.one_of(rendered_maps().map(lambda c: c[1]), st.text(max_size=30)), min_size=1, max_size=4))
def test_total_on_mixtures_of_valid_and_arbitrary_text(parts):
    _check_total("\n".join(parts))
