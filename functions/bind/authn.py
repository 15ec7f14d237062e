"""bind's sink authentication (serving/sinkauth.py) against the API server: a TokenReview
per new token, verdicts kept a minute in a bounded cache (a source reuses its token for its
lifetime, so a verdict costs one review, and garbage tokens cannot make bind flood the API)."""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict

import urllib3
from kubeapi.errors import APIError

from serving.sinkauth import SinkAuth, Unauthenticated, bearer_token, sender_problem, token_review

VERDICT_SECONDS = 60.0
VERDICTS = 256


class Unavailable(Exception):
    """The TokenReview could not be made now: the sender should retry (503)."""


class SinkAuthenticator:
    def __init__(self, api, auth: SinkAuth):
        self.api, self.auth = api, auth
        self._verdicts: OrderedDict[bytes, tuple[float, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, api) -> "SinkAuthenticator | None":
        auth = SinkAuth.from_settings(os.environ.get("SINK_AUDIENCE", ""), os.environ.get("SINK_SENDERS", ""))
        return cls(api, auth) if auth else None

    def check(self, header: str | None) -> None:
        """Returns when the sender is admitted; raises Unauthenticated (401) or Unavailable (503)."""
        token = bearer_token(header)
        key = hashlib.sha256(token.encode()).digest()
        with self._lock:
            cached = self._verdicts.get(key)
        if cached and time.monotonic() - cached[0] < VERDICT_SECONDS:
            problem = cached[1]
        else:
            if self.api is None:
                raise Unavailable("no Kubernetes API configuration to review the token")
            try:
                status = self.api.create_token_review(token_review(token, self.auth.audience)).get("status") or {}
            except APIError as error:
                raise Unavailable(f"TokenReview failed: {error.status or 'no answer'}: {error.message}") from None
            problem = sender_problem(status, self.auth)
            with self._lock:
                self._verdicts[key] = (time.monotonic(), problem)
                self._verdicts.move_to_end(key)
                while len(self._verdicts) > VERDICTS:
                    self._verdicts.popitem(last=False)
        if problem:
            raise Unauthenticated(problem)
