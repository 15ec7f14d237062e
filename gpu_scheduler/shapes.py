"""Reading fields of Kubernetes objects as JSON gives them, total on odd shapes: what is not an
object counts as an empty one, what is not a list of objects as none. The API server validates
these fields, so only a fake or hostile object has odd shapes; none makes gpu-scheduler fail."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


# `type(x) is dict` first: JSON gives dicts, and isinstance against the Mapping ABC costs ten
# times as much; a bind listing 20,000 pods asked it a million times (issue 62).
def as_map(value: Any) -> Mapping[str, Any]:
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def as_maps(value: Any) -> list[Mapping[str, Any]]:
    """The objects in a list field; anything else in it, or a field that is no list, counts as none."""
    if not isinstance(value, list):
        return []
    return [item for item in value if type(item) is dict or isinstance(item, Mapping)]
