"""The `gpu-scheduling-map` grammar.

One entry per line, `<index>=<node>:<devices>`:
- index: a non-negative decimal integer without leading zeros, unique in the map;
- node: a Kubernetes node name (DNS-1123 subdomain, at most 253 characters);
- devices: a non-empty comma-separated list of GPU indexes (`0`, `3`) or GPU/MIG UUIDs,
  no repeats inside one entry; becomes the value of `CUDA_VISIBLE_DEVICES`.
Blank lines, lines starting with `#`, whitespace around lines and tokens, and CRLF are ignored.
Two indexes may share a node and devices.

`parse_map` is total: on any `str` it returns a map or raises `MapError`, nothing else.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from . import ANNOTATION

MAX_NODE_NAME = 253
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NODE_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
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
        """The plain integer devices (UUIDs are not indexes)."""
        return tuple(i for i in map(parse_index, self.devices) if i is not None)


class MapError(ValueError):
    """A malformed map. `problems` holds one message per bad line, each naming the line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"invalid {ANNOTATION} annotation: " + "; ".join(problems))


def _quote(text: str) -> str:
    shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return repr(shown)


def _line_problem(number: int, line: str, why: str) -> str:
    return f"line {number} {_quote(line)}: {why}"


def parse_index(text: str) -> int | None:
    """A decimal index as the map writes it, or None."""
    if not _DECIMAL.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return None


def _parse_entry(line: str) -> tuple[int, Placement] | str:
    """One stripped, non-empty line -> (index, placement), or a reason it is wrong."""
    index_text, eq, rest = line.partition("=")
    if not eq:
        return "expected '<index>=<node>:<devices>', found no '='"
    index_text = index_text.strip()
    index = parse_index(index_text)
    if index is None:
        if not index_text:
            return "the pod index before '=' is missing"
        if _DIGITS.fullmatch(index_text):
            if index_text.startswith("0"):
                return f"pod index {_quote(index_text)} has a leading zero"
            return f"pod index {_quote(index_text)} is too large ({len(index_text)} digits)"
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
    devices = tuple(d.strip() for d in devices_text.split(","))
    if devices == ("",):
        return "the device list after ':' is empty"
    for position, device in enumerate(devices, start=1):
        if not device:
            return f"device {position} in {_quote(devices_text.strip())} is empty"
        if _DIGITS.fullmatch(device) and not _DECIMAL.fullmatch(device):
            return f"device {_quote(device)} has a leading zero"
        if not (_DECIMAL.fullmatch(device) or _DEVICE_UUID.fullmatch(device)):
            return (
                f"device {_quote(device)} is neither a non-negative integer "
                "nor a GPU-<uuid>/MIG-<uuid> identifier"
            )
    repeated = sorted({d for d in devices if devices.count(d) > 1})
    if repeated:
        return f"device {', '.join(repeated)} is listed more than once"
    return index, Placement(node, devices)


def parse_map(text: str) -> Mapping[int, Placement]:
    """Parse the annotation's value into {pod index: Placement} (read-only), or raise MapError."""
    if not isinstance(text, str):
        raise MapError([f"the annotation value must be a string, not {type(text).__name__}"])
    return _parse_cached(text)


# Every replica of a StatefulSet carries the same map: parse it once, not once per pod
# (a 1000-entry map takes milliseconds). Results are read-only, so sharing them is safe.
@lru_cache(maxsize=64)
def _parse_cached(text: str) -> Mapping[int, Placement]:
    entries: dict[int, Placement] = {}
    first_line: dict[int, int] = {}
    problems: list[str] = []
    # Only \n separates lines (str.splitlines also splits on \x1c, \u2028, ...); \r is whitespace.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parsed = _parse_entry(line)
        if isinstance(parsed, str):
            problems.append(_line_problem(number, line, parsed))
            continue
        index, placement = parsed
        if index in entries:
            problems.append(
                _line_problem(number, line, f"pod index {index} is already mapped on line {first_line[index]}")
            )
            continue
        entries[index] = placement
        first_line[index] = number
    if problems:
        raise MapError(problems)
    if not entries:
        raise MapError(["the map has no entries"])
    return MappingProxyType(entries)
