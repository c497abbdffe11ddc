"""Reward verifiers (math-verify, sandboxed unit tests, env return) and an HTTP reward client."""

from rollstream.workers.rewards.http import HttpRewardClient, RewardError
from rollstream.workers.rewards.verifiers import score, score_code, score_game, score_math

__all__ = ["HttpRewardClient", "RewardError", "score", "score_code", "score_game", "score_math"]
