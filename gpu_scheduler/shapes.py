"""Reading fields of Kubernetes objects as JSON gives them, total on odd shapes: what is not an
object counts as an empty one, what is not a list of objects as none. The API server validates
these fields, so only a fake or hostile object has odd shapes; none makes gpu-scheduler fail."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_maps(value: Any) -> list[Mapping[str, Any]]:
    """The objects in a list field; anything else in it, or a field that is no list, counts as none."""
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []
