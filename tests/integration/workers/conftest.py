"""Fixtures of the rollout integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rollout_harness import Rollout, fast_config


@pytest.fixture
def rollout_factory(kafka_bootstrap: str, kafka_admin: Any, run_id: str) -> Iterator[Any]:
    made: list[Rollout] = []

    def make(*overrides: str) -> Rollout:
        r = Rollout(fast_config(*overrides), kafka_bootstrap, run_id, kafka_admin)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
