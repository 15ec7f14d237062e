"""Knative's sink authentication, the second line behind reading every pod live: with Eventing's
`authentication-oidc` feature on, a source sends `Authorization: Bearer <token>`, a token of its
own ServiceAccount issued for the sink's audience. bind asks the API server whether the token is
valid for that audience (a TokenReview) and whose it is, and accepts only the senders it was told.

An audience alone proves little: any pod author can have the kubelet project a token for any
audience. The sender's identity is what counts, so a deployment names its senders.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

MAX_TOKEN = 16 * 1024  # service account JWTs are around 1 KiB; a larger header is not a token


class Unauthenticated(ValueError):
    """The request is refused (401); the message says why, never the token."""


@dataclass(frozen=True)
class SinkAuth:
    audience: str
    senders: frozenset[str]  # usernames: system:serviceaccount:<namespace>:<name>

    @classmethod
    def from_settings(cls, audience: str, senders: str) -> "SinkAuth | None":
        """None when off (no audience). On, it needs its senders: an audience with no one allowed
        would refuse everything, which is a configuration error to stop at start-up."""
        audience = audience.strip()
        if not audience:
            return None
        named = frozenset(s.strip() for s in senders.split(",") if s.strip())
        if not named:
            raise ValueError("SINK_AUDIENCE is set but SINK_SENDERS names no sender "
                             "(system:serviceaccount:<namespace>:<name>, comma-separated)")
        return cls(audience, named)


def bearer_token(header: str | None) -> str:
    if not header:
        raise Unauthenticated("no Authorization header: this sink requires an OIDC token (authentication-oidc)")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header is not 'Bearer <token>'")
    if len(token) > MAX_TOKEN:
        raise Unauthenticated(f"the bearer token is longer than {MAX_TOKEN} bytes")
    return token


def token_review(token: str, audience: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]}}


def sender_problem(status: Mapping[str, Any], auth: SinkAuth) -> str | None:
    """Why a TokenReview's status does not admit the sender (None: it does)."""
    if status.get("authenticated") is not True:
        return f"the token is not valid for audience {auth.audience}: {status.get('error') or 'not authenticated'}"
    if auth.audience not in (status.get("audiences") or [auth.audience]):
        return f"the token was not issued for audience {auth.audience}"
    user = (status.get("user") or {}).get("username")
    if user not in auth.senders:
        return f"{user} is not a sender of this sink (SINK_SENDERS)"
    return None
