"""A tiny RFC 6902 JSON Patch applier for the tests: `add`, `replace` and `remove`.

Paths are RFC 6901 JSON Pointers (`~1` is `/`, `~0` is `~`, decoded in that order); `-` as the
last array token appends. Anything else raises PatchError, as a real API server would refuse it.
The document given is never modified: `apply_patch` works on a deep copy.
"""
from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """The patch cannot be applied to this document."""


def parse_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"path {pointer!r} does not start with '/'")
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def _array_index(container: list, token: str, *, for_insert: bool) -> int:
    if for_insert and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"array index {token!r} is not a valid index")
    index = int(token)
    if index > len(container) or (not for_insert and index == len(container)):
        raise PatchError(f"array index {index} is out of range (length {len(container)})")
    return index


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"member {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_array_index(node, token, for_insert=False)]
        else:
            raise PatchError(f"cannot descend into {type(node).__name__} at {token!r}")
    return node


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, tokens = op.get("op"), parse_pointer(op.get("path", ""))
    if kind not in ("add", "replace", "remove"):
        raise PatchError(f"unsupported op {kind!r}")
    if kind != "remove" and "value" not in op:
        raise PatchError(f"{kind} at {op['path']!r} has no value")
    value = copy.deepcopy(op.get("value"))
    if not tokens:  # the whole document
        if kind == "remove":
            raise PatchError("cannot remove the whole document")
        return value
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        if kind != "add" and last not in parent:
            raise PatchError(f"{kind}: member {last!r} does not exist")
        if kind == "remove":
            del parent[last]
        else:
            parent[last] = value
    elif isinstance(parent, list):
        if kind == "add":
            parent.insert(_array_index(parent, last, for_insert=True), value)
        elif kind == "replace":
            parent[_array_index(parent, last, for_insert=False)] = value
        else:
            del parent[_array_index(parent, last, for_insert=False)]
    else:
        raise PatchError(f"cannot {kind} inside a {type(parent).__name__}")
    return doc


def apply_patch(doc: Any, patch: list[dict[str, Any]]) -> Any:
    """`doc` with every operation of `patch` applied, in order (atomically: a copy is patched)."""
    result = copy.deepcopy(doc)
    for op in patch:
        result = _apply_op(result, op)
    return result
