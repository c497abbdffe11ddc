from __future__ import annotations

import threading

import pytest

from rollstream.workers.envs import DOMAINS, TextEnv, make_env


def test_domains_and_protocol() -> None:
    assert DOMAINS == ("frozenlake", "math", "code")
    for d in DOMAINS:
        env = make_env(d)
        assert isinstance(env, TextEnv) and env.domain == d
        obs, info = env.reset(seed=0)
        assert isinstance(obs, str) and obs and info["domain"] == d
        env.close()


def test_unknown_domain_is_named() -> None:
    with pytest.raises(ValueError, match="chess"):
        make_env("chess")


def test_instances_in_threads_are_independent() -> None:
    results: dict[int, list[str]] = {}

    def run(seed: int) -> None:
        env = make_env("frozenlake")
        obs, _ = env.reset(seed=seed)
        seen = [obs]
        for _ in range(3):
            obs, _, term, trunc, _ = env.step("D")
            seen.append(obs)
            if term or trunc:
                break
        results[seed] = seen

    threads = [threading.Thread(target=run, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent = dict(results)
    results.clear()
    for s in range(16):
        run(s)
    assert concurrent == results
