"""The `gpu-scheduling-map` grammar.

One entry per line, `<index>=<node>:<devices>`:
- index: a non-negative decimal integer without leading zeros, unique in the map;
- node: a Kubernetes node name (DNS-1123 subdomain, at most 253 characters);
- devices: a non-empty comma-separated list of GPU indexes (`0`, `3`) or GPU/MIG UUIDs,
  no repeats inside one entry; becomes the value of `CUDA_VISIBLE_DEVICES`.
Blank lines, lines starting with `#`, whitespace around lines and tokens, and CRLF are ignored.
Two indexes may share a node and devices.

Limits (anyone who may create a pod chooses the text, and mutate sees it before the API server
validates anything, so every cost is bounded here, once, for mutate, bind and the plugin):
- the annotation: at most MAX_MAP_BYTES bytes of UTF-8 (the API server refuses a pod whose
  annotations together are larger, so no pod that could exist is refused for it);
- entries: at most MAX_ENTRIES non-blank, non-comment lines;
- devices: at most MAX_DEVICES_PER_ENTRY per entry;
- a pod index: at most MAX_POD_INDEX (int32, like StatefulSet ordinals and Job completion
  indexes), a GPU index at most MAX_GPU_INDEX; longer digit strings are refused unconverted.
Parsing is linear in the text's size: one pass over the lines, sets for repeats, regular
expressions without nested ambiguity.

`parse_map` is total: on any `str` it returns a map or raises `MapError`, nothing else. A MapError
names the first MAX_PROBLEMS_SHOWN problems with their lines and counts the rest.
"""
from __future__ import annotations

import re
import reprlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Generic, Hashable, Mapping, TypeVar

from . import ANNOTATION

MAX_MAP_BYTES = 256 * 1024  # the API server's limit on all of a pod's annotations together
MAX_ENTRIES = 10_000
MAX_DEVICES_PER_ENTRY = 128  # 16 GPUs cut into 7 MIG instances each is 112
MAX_POD_INDEX = 2**31 - 1  # int32: StatefulSet ordinals, Indexed Job completion indexes
MAX_GPU_INDEX = 1023  # nvidia-smi numbers a node's GPUs from 0; nodes hold 8 or 16
MAX_INDEX_DIGITS = len(str(MAX_POD_INDEX))  # longer digit strings are refused without int()
MAX_PROBLEMS_SHOWN = 5  # problems a MapError names; the rest are counted
MAX_NODE_NAME = 253
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_NODE_NAME = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_DIGITS = re.compile(r"[0-9]+")
# nvidia-smi -L prints `GPU-<uuid>`, MIG devices as `MIG-<uuid>` or (R450/R460) `MIG-GPU-<uuid>/<gi>/<ci>`.
_HEX_UUID = r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
_DEVICE_UUID = re.compile(rf"GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]+/[0-9]+")
_SHOWN = 60  # characters of offending text quoted in an error


@dataclass(frozen=True)
class Placement:
    """Where one pod index goes: a node and the devices its containers may see."""

    node: str
    devices: tuple[str, ...]

    @property
    def visible_devices(self) -> str:
        return ",".join(self.devices)

    def device_indexes(self) -> tuple[int, ...]:
        """Every plain integer device (UUIDs are not indexes). None is left out: a device of digits
        that int() cannot convert (never in a parsed map: MAX_GPU_INDEX) raises ValueError here,
        so it cannot slip past a capacity check."""
        return tuple(int(d) for d in self.devices if _DIGITS.fullmatch(d))


class MapError(ValueError):
    """A malformed map. `problems` holds the first MAX_PROBLEMS_SHOWN problems, each naming its
    line; `more` counts the others, so neither the message nor a log line grows with the input."""

    def __init__(self, problems: list[str], more: int = 0):
        self.problems = problems[:MAX_PROBLEMS_SHOWN]
        self.more = more + len(problems) - len(self.problems)
        tail = f"; and {self.more} more problem{'s' if self.more != 1 else ''}" if self.more else ""
        super().__init__(f"invalid {ANNOTATION} annotation: " + "; ".join(self.problems) + tail)


def _quote(text: str) -> str:
    shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return repr(shown)


# Any JSON value as a message quotes it: a few levels, items and characters; never the repr of a
# whole value, which may be megabytes long or nested a thousand levels deep.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxlong = 2, 4, 4, _SHOWN, 40


def shown(value: object) -> str:
    """`value` quoted for an error message, bounded in size whatever it is."""
    return _quote(value) if isinstance(value, str) else _REPR.repr(value)


# A pod is about 10 levels deep (spec.containers[].env[].valueFrom.fieldRef.fieldPath); 64 leaves
# room for any real object and keeps every later step (copies, json.dumps, logging) far from
# Python's recursion limit.
MAX_NESTING = 64


def nesting_exceeds(value: object, limit: int = MAX_NESTING) -> bool:
    """Whether JSON `value` nests lists and objects more than `limit` levels deep. Iterative and
    linear, so it cannot itself hit the recursion limit."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


MAX_NAMESPACE = 63


def is_dns_subdomain(text: object) -> bool:
    """A DNS-1123 subdomain of at most 253 characters: node names, pod names."""
    return isinstance(text, str) and len(text) <= MAX_NODE_NAME and _NODE_NAME.fullmatch(text) is not None


def is_dns_label(text: object) -> bool:
    """A DNS-1123 label of at most 63 characters: namespaces."""
    return isinstance(text, str) and len(text) <= MAX_NAMESPACE and _DNS_LABEL_RE.fullmatch(text) is not None


def _line_problem(number: int, line: str, why: str) -> str:
    return f"line {number} {_quote(line)}: {why}"


def parse_index(text: str) -> int | None:
    """A decimal index as the map writes it, of at most MAX_INDEX_DIGITS digits, or None."""
    if len(text) > MAX_INDEX_DIGITS or not _DECIMAL.fullmatch(text):
        return None
    return int(text)


def utf8_size(text: str) -> int:
    """The size of `text` in UTF-8 bytes (a lone surrogate, which JSON can carry, counts 3)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _size_problem(text: str) -> str | None:
    # Characters never outnumber bytes, so a text this long is too large without encoding it.
    size = len(text) if len(text) > MAX_MAP_BYTES else utf8_size(text)
    if size > MAX_MAP_BYTES:
        return (f"the annotation is {size} bytes long, more than the limit of {MAX_MAP_BYTES} bytes"
                " (the API server's limit on all of a pod's annotations together)")
    return None


def _parse_entry(line: str) -> tuple[int, Placement] | str:
    """One stripped, non-empty line -> (index, placement), or a reason it is wrong."""
    index_text, eq, rest = line.partition("=")
    if not eq:
        return "expected '<index>=<node>:<devices>', found no '='"
    index_text = index_text.strip()
    index = parse_index(index_text)
    if index is None or index > MAX_POD_INDEX:
        if not index_text:
            return "the pod index before '=' is missing"
        if _DIGITS.fullmatch(index_text):
            if index_text.startswith("0"):
                return f"pod index {_quote(index_text)} has a leading zero"
            return (f"pod index {_quote(index_text)} is too large ({len(index_text)} digits):"
                    f" the limit is {MAX_POD_INDEX}")
        return f"pod index {_quote(index_text)} is not a non-negative decimal integer"
    node, colon, devices_text = rest.partition(":")
    node = node.strip()
    if not colon:
        return "expected ':' between the node name and the devices"
    if not node:
        return "the node name after '=' is missing"
    if len(node) > MAX_NODE_NAME:
        return f"node name is {len(node)} characters long; at most {MAX_NODE_NAME} are allowed"
    if not _NODE_NAME.fullmatch(node):
        return (
            f"node name {_quote(node)} is not a valid Kubernetes node name "
            "(lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )
    count = devices_text.count(",") + 1  # counted before anything is split
    if count > MAX_DEVICES_PER_ENTRY:
        return f"the entry lists {count} devices, more than the limit of {MAX_DEVICES_PER_ENTRY} per entry"
    devices = tuple(d.strip() for d in devices_text.split(","))
    if devices == ("",):
        return "the device list after ':' is empty"
    seen: set[str] = set()
    repeated: set[str] = set()
    for position, device in enumerate(devices, start=1):
        if not device:
            return f"device {position} in {_quote(devices_text.strip())} is empty"
        if _DIGITS.fullmatch(device):
            if not _DECIMAL.fullmatch(device):
                return f"device {_quote(device)} has a leading zero"
            if len(device) > len(str(MAX_GPU_INDEX)) or int(device) > MAX_GPU_INDEX:
                return (f"device {_quote(device)} is too large ({len(device)} digits):"
                        f" the limit is GPU index {MAX_GPU_INDEX}")
        elif not _DEVICE_UUID.fullmatch(device):
            return (
                f"device {_quote(device)} is neither a non-negative integer "
                "nor a GPU-<uuid>/MIG-<uuid> identifier"
            )
        (repeated if device in seen else seen).add(device)
    if repeated:
        return f"device {', '.join(sorted(repeated))} is listed more than once"
    return index, Placement(node, devices)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A least-recently-used cache bounded in (estimated) bytes as well as in entries: distinct
    large inputs, which anyone who may create a pod can send, cannot grow the process past
    `max_bytes`. `cost(key)` estimates what keeping the key and its value costs; a key that would
    take more than `max_bytes / 2` is computed every time, never kept. Thread-safe."""

    def __init__(self, compute: Callable[[K], V], cost: Callable[[K], int], max_bytes: int, max_entries: int):
        self._compute, self._cost = compute, cost
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()

    def __call__(self, key: K) -> V:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        value = self._compute(key)  # outside the lock: other requests need not wait for this one
        cost = self._cost(key)
        if cost > self.max_bytes // 2:
            return value
        with self._lock:
            if key not in self._items:
                self._items[key] = (value, cost)
                self.bytes += cost
                while self.bytes > self.max_bytes or len(self._items) > self.max_entries:
                    _, (_, dropped) = self._items.popitem(last=False)
                    self.bytes -= dropped
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


# A parsed map keeps at most about 22 bytes per character of its text (ints, Placements, tuples,
# strings; measured with tracemalloc, 10000 entries `i=a:0`), its device claims (devices.py) about
# 42 (128 devices per entry). The estimates stay above that (tests/test_hostile.py measures), so
# each cache holds at most MAP_CACHE_BYTES; a map of more than half of it is parsed every time.
PARSED_BYTES_PER_CHAR = 40
CLAIMS_BYTES_PER_CHAR = 64
MAP_CACHE_BYTES = 16 * 1024 * 1024


def parsed_cost(text: str) -> int:
    return 2048 + PARSED_BYTES_PER_CHAR * len(text)


def claims_cost(text: str) -> int:
    return 2048 + CLAIMS_BYTES_PER_CHAR * len(text)


def parse_map(text: str) -> Mapping[int, Placement]:
    """Parse the annotation's value into {pod index: Placement} (read-only), or raise MapError."""
    if not isinstance(text, str):
        raise MapError([f"the annotation value must be a string, not {type(text).__name__}"])
    too_large = _size_problem(text)
    if too_large:
        raise MapError([too_large])
    return _parse_cached(text)


def _parse(text: str) -> Mapping[int, Placement]:
    entries: dict[int, Placement] = {}
    first_line: dict[int, int] = {}
    problems: list[str] = []  # the first MAX_PROBLEMS_SHOWN; the rest are only counted
    more = 0
    lines = 0
    # Only \n separates lines (str.splitlines also splits on \x1c, \u2028, ...); \r is whitespace.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines += 1
        if lines > MAX_ENTRIES:
            # First, so the message names the limit however many problems came before.
            problems.insert(0, _line_problem(
                number, line, f"the map has more than {MAX_ENTRIES} entries, the limit; the rest is not read"))
            break
        parsed = _parse_entry(line)
        if isinstance(parsed, str):
            if len(problems) < MAX_PROBLEMS_SHOWN:
                problems.append(_line_problem(number, line, parsed))
            else:
                more += 1
            continue
        index, placement = parsed
        if index in entries:
            if len(problems) < MAX_PROBLEMS_SHOWN:
                problems.append(
                    _line_problem(number, line, f"pod index {index} is already mapped on line {first_line[index]}"))
            else:
                more += 1
            continue
        entries[index] = placement
        first_line[index] = number
    if problems:
        raise MapError(problems, more)
    if not entries:
        raise MapError(["the map has no entries"])
    return MappingProxyType(entries)


# Every replica of a StatefulSet carries the same map: parse it once, not once per pod (a
# 1000-entry map takes milliseconds). Results are read-only, so sharing them is safe. Malformed
# maps raise and are not kept.
_parse_cached: BoundedCache[str, Mapping[int, Placement]] = BoundedCache(
    _parse, parsed_cost, max_bytes=MAP_CACHE_BYTES, max_entries=64)
