"""Client for an external HTTP reward endpoint (the "serverless reward" path), standard library only.

Request: ``POST <url>`` with JSON ``{"idempotency_key": <trajectory id>, "domain", "response", "info"}``;
response: JSON ``{"reward": <float>}``. Timeouts, connection errors, 5xx, 408 and 429 are retried with
exponential backoff (``backoff_s * 2**attempt``) up to ``retries`` times after the first attempt; other 4xx
and malformed replies fail at once. The same idempotency key is sent on every attempt (and on a redelivered
trajectory), so a server may dedupe retried requests and return the first reward; the client itself keeps
no state, which makes one instance safe to share between threads.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["HttpRewardClient", "RewardError"]

_RETRY_STATUS = {408, 429}


class RewardError(RuntimeError):
    """The endpoint gave no usable reward (after retries where retrying made sense)."""


class HttpRewardClient:
    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.2) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward url must be http(s): {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s

    def score(self, trajectory_id: str, domain: str, response: str, info: dict[str, Any]) -> float:
        body = json.dumps(
            {"idempotency_key": trajectory_id, "domain": domain, "response": response, "info": info},
            default=str,  # info may hold non-JSON values (numpy scalars...): send their text
        ).encode()
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Idempotency-Key": trajectory_id},
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    payload = resp.read()
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
                if e.code >= 500 or e.code in _RETRY_STATUS:
                    continue
                raise RewardError(f"reward endpoint {self.url} refused: {last}") from e
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
                continue
            return self._parse(payload)
        raise RewardError(f"reward endpoint {self.url} failed after {self.retries + 1} attempts: {last}")

    def _parse(self, payload: bytes) -> float:
        try:
            reward = float(json.loads(payload)["reward"])
        except (ValueError, KeyError, TypeError) as e:
            raise RewardError(f"malformed reward reply from {self.url}: {payload[:200]!r}") from e
        if not math.isfinite(reward):
            raise RewardError(f"non-finite reward from {self.url}: {reward}")
        return reward
