"""The one error type every Kubernetes API call of gpu-scheduler raises: the API server's answer
(status, its message and reason, what it was about), or no answer at all (status 0: unreachable,
timed out, broken off). Plain data, no client imported: the core classifies it without I/O."""
from __future__ import annotations

import json
from typing import Any

# HTTP statuses worth retrying; 0 stands for "no response" (connection refused, timeout).
TRANSIENT_STATUSES = frozenset({0, 408, 425, 429, 500, 502, 503, 504})
# Right after a restart the API server answers 403 with this message for seconds, while its
# authorizer's informers sync: transient, not a refusal.
NOT_YET_READY = "not yet ready to handle request"
MAX_BODY = 64 * 1024  # of an error body kept: the API server's Status objects are short


class APIError(Exception):
    def __init__(self, status: int, message: str, reason: str = "", kind: str = "", name: str = ""):
        super().__init__(message)
        self.status, self.message, self.reason, self.kind, self.name = status, message, reason, kind, name

    @classmethod
    def of_response(cls, status: int, http_reason: str, body: bytes | str) -> "APIError":
        """From an answer other than 2xx: its Status object's message, reason and details."""
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
        try:
            value: Any = json.loads(text[:MAX_BODY])
        except ValueError:
            value = None
        if not isinstance(value, dict):
            return cls(status, f"{status} {http_reason}".strip())
        details = value.get("details") if isinstance(value.get("details"), dict) else {}
        return cls(status, str(value.get("message") or f"{status} {http_reason}".strip()), str(value.get("reason") or ""),
                   str(details.get("kind") or ""), str(details.get("name") or ""))

    @classmethod
    def unreachable(cls, error: BaseException, server: str = "") -> "APIError":
        """No answer: the socket's words, not the exception's repr."""
        root = error
        seen = set()
        while root.__cause__ is not None and id(root) not in seen:
            seen.add(id(root))
            root = root.__cause__
        why = (root.strerror if isinstance(root, OSError) and root.strerror else str(root)) or type(root).__name__
        return cls(0, f"cannot reach the Kubernetes API{f' at {server}' if server else ''}: {why}")

    @property
    def transient(self) -> bool:
        """Worth trying again as it is: no answer, overload, a restart."""
        return self.status in TRANSIENT_STATUSES or (self.status == 403 and NOT_YET_READY in self.message)

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def quota_exceeded(self) -> bool:
        """The namespace's ResourceQuota refused the object: the user's quota, not bind's fault."""
        return self.status == 403 and "exceeded quota" in self.message

    def namespace_missing(self) -> str:
        """The namespace the API server said does not exist ('' when this is not that 404)."""
        return self.name if self.status == 404 and self.kind == "namespaces" else ""

    def __str__(self) -> str:
        return self.message
