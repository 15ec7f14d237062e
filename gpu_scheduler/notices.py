"""What bind tells a pod once, whatever becomes of it: a Warning Event for each thing the pod asks
for that gpu-scheduler does not do (an upstream PodGroup). Not a refusal: the pod is placed as any
other, and its attempts never say it again (bind's recorder writes each once per pod). Pure: the
(Event reason, message) pairs, as binding.Bind's warnings are."""
from __future__ import annotations

from typing import Any, Mapping

from .plugins.gang import UPSTREAM_POD_GROUP, upstream_gang_notice


def pod_notices(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(Event reason, message) for each notice the pod gets; none for almost every pod."""
    notices = []
    upstream = upstream_gang_notice(pod)
    if upstream is not None:
        notices.append((UPSTREAM_POD_GROUP, upstream))
    return tuple(notices)
