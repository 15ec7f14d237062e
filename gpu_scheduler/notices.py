"""What bind tells a pod once, whatever becomes of it: a Warning Event for each thing the pod asks
for that gpu-scheduler does not do (an upstream PodGroup). Not a refusal: the pod is placed as any
other, and its attempts never say it again (bind's recorder writes each once per pod). Pure: the
(Event reason, message) pairs, as binding.Bind's warnings are; PodInputs.of works them out with
the rest of what the pod asks."""
from __future__ import annotations

from .gangask import UPSTREAM_POD_GROUP, GangAsk, upstream_gang_notice


def pod_notices(upstream: str | None, ask: GangAsk, gang: str) -> tuple[tuple[str, str], ...]:
    """(Event reason, message) for each notice a pod gets, given the upstream PodGroup it names
    (gangask.upstream_pod_group), what it asks of gangs and its gang's name; none for almost every pod."""
    notices = []
    upstream_notice = upstream_gang_notice(upstream, ask, gang)
    if upstream_notice is not None:
        notices.append((UPSTREAM_POD_GROUP, upstream_notice))
    return tuple(notices)
