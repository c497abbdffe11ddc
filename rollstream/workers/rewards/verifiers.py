"""Rule-based reward verifiers shared by the envs and the reward workers.

``score_math`` uses math-verify. Its built-in timeouts rely on ``signal.alarm`` which only works in the main
thread, and workers score in thread pools, so off the main thread the timeouts are off and we guard against
sympy blow-ups ourselves: responses are cut to their last ``MAX_MATH_CHARS`` characters, and a response with
chained or huge exponents (``9**9**9``, ``2^{100000}``) scores 0.0 without being parsed.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any

__all__ = ["MAX_MATH_CHARS", "score", "score_code", "score_game", "score_math"]

MAX_MATH_CHARS = 2000
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
# A power whose exponent is itself a power, or has 4+ digits: sympy may evaluate it for minutes.
_POW = r"(?:\*\*|\^)\s*[{(]?\s*[+-]?\s*"
_RISKY_POWER = re.compile(_POW + r"(?:\d{4,}|[\w.]+\s*[})]?\s*(?:\*\*|\^))")


def _as_number(text: str) -> float | None:
    t = text.strip().rstrip(".").replace(",", "")
    if _NUMBER.fullmatch(t):
        try:
            return float(t)
        except ValueError:
            return None
    return None


def score_math(response: str, ground_truth: str) -> float:
    """1.0 when ``response`` states an answer equal to ``ground_truth`` (math-verify semantics), else 0.0."""
    # Fast path (and tolerance): both plain numbers -> numeric comparison, no sympy.
    gt_num, resp_num = _as_number(ground_truth), _as_number(response)
    if gt_num is not None and resp_num is not None:
        return 1.0 if math.isclose(gt_num, resp_num, rel_tol=1e-9, abs_tol=1e-9) else 0.0
    text = response[-MAX_MATH_CHARS:]
    if not text.strip() or _RISKY_POWER.search(text):
        return 0.0
    from math_verify import parse, verify  # lazy: imports sympy (~1 s)

    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None  # signal-based timeouts only work in the main thread
    try:
        gold = parse(ground_truth, parsing_timeout=timeout)
        if not gold:  # unparsable ground truth: fall back to exact text
            return 1.0 if response.strip() == ground_truth.strip() else 0.0
        pred = parse(text, parsing_timeout=timeout)
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except Exception:  # math-verify raises on pathological input/timeouts: a wrong answer, not a crash
        return 0.0


def score_code(response: str, tests: str, **limits: Any) -> float:
    """Fraction of the asserts in ``tests`` that pass against the code in ``response`` (sandboxed)."""
    from rollstream.workers.envs.code_env import extract_code
    from rollstream.workers.envs.sandbox import run_python

    return run_python(extract_code(response), tests, **limits).fraction


def score_game(env_return: float) -> float:
    """Game domains are scored by the environment itself: the episode return (NaN -> 0.0)."""
    r = float(env_return)
    return r if math.isfinite(r) else 0.0


def score(domain: str, response_text: str, info: dict[str, Any], env_return: float) -> tuple[float, str]:
    """(reward, source) for one finished trajectory; ``info`` is the terminal step's info.

    source is ``math-verify``, ``sandbox`` or ``env``. Raises ValueError for an unknown domain and KeyError
    when ``info`` lacks what the domain needs (``ground_truth`` for math, ``tests`` for code).
    """
    if domain == "math":
        return score_math(response_text, str(info["ground_truth"])), "math-verify"
    if domain == "code":
        return score_code(response_text, str(info["tests"])), "sandbox"
    if domain == "frozenlake":
        return score_game(env_return), "env"
    raise ValueError(f"no verifier for domain {domain!r}")
