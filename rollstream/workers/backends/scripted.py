"""`scripted` backend: deterministic policies with no model, for tests and benchmarks.

`oracle` solves what it can read (FrozenLake by breadth-first search over the grid in the prompt,
arithmetic by evaluating the expression), `random` picks seeded random actions. With
`generation.simulate_cost` each micro-batch sleeps per a per-pool cost model (prefill and decode time
per token, shaped after the paper's H800 vs H20 table) so hardware affinity can be studied on CPU.
"""

from __future__ import annotations

import ast
import operator
import random
import re
import time
from collections import deque

from rollstream.config import Config
from rollstream.workers.backends.base import GenInput, GenOutput
from rollstream.workers.policy import CharTokenizer

# (prefill ms per prompt token, decode ms per generated token): H800 is compute-rich (fast prefill),
# H20 has the better memory bandwidth per FLOP (relatively cheaper decode).
POOL_COST_MS: dict[str, tuple[float, float]] = {"h800": (0.01, 0.30), "h20": (0.05, 0.25)}
DEFAULT_COST_MS = (0.03, 0.30)

MOVES = {"L": (0, -1), "D": (1, 0), "R": (0, 1), "U": (-1, 0)}
_GRID_LINE = re.compile(r"^[SFHG@]+$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def solve_frozenlake(prompt: str) -> str | None:
    """Next move on the shortest safe path from `@` to `G`, or None if the prompt is no grid."""
    grid = [line.strip() for line in prompt.splitlines() if _GRID_LINE.match(line.strip())]
    if not grid:
        return None
    start = next(((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "@"), None)
    if start is None:
        return None
    first: dict[tuple[int, int], str] = {start: ""}
    frontier = deque([start])
    while frontier:
        r, c = frontier.popleft()
        if grid[r][c] == "G":
            return first[(r, c)]
        for move, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if (
                0 <= nr < len(grid)
                and 0 <= nc < len(grid[nr])
                and (nr, nc) not in first
                and grid[nr][nc] != "H"
            ):
                first[(nr, nc)] = first[(r, c)] or move
                frontier.append((nr, nc))
    return None


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))  # type: ignore[operator]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))  # type: ignore[operator]
    raise ValueError("not arithmetic")


def solve_arithmetic(prompt: str) -> str | None:
    for candidate in re.findall(r"[-\d][\d\s+\-*()]*\d", prompt):
        try:
            return str(_eval(ast.parse(candidate.strip(), mode="eval").body))
        except (SyntaxError, ValueError):
            continue
    return None


class ScriptedBackend:
    needs_weights = False

    def __init__(self, cfg: Config, pool: str) -> None:
        self.policy = cfg.generation.scripted_policy
        self.simulate_cost = cfg.generation.simulate_cost
        self.cost = POOL_COST_MS.get(pool, DEFAULT_COST_MS)
        self.tokenizer = CharTokenizer()
        self.rng = random.Random(f"{cfg.rollout.seed}:{pool}")
        self.version = 0

    def _act(self, item: GenInput) -> str:
        if self.policy == "oracle":
            answer = None
            if item.domain == "frozenlake":
                answer = solve_frozenlake(item.prompt_text)
            elif item.domain == "math":
                answer = solve_arithmetic(item.prompt_text)
            if answer is not None:
                return answer
        if item.domain == "frozenlake":
            return self.rng.choice("LDRU")
        if item.domain == "math":
            return str(self.rng.randint(0, 100))
        return "def f(*args):\n    return args[0] if args else None\n"

    def generate(self, batch: list[GenInput]) -> list[GenOutput]:
        start = time.perf_counter()
        out = []
        prompt_tokens = 0
        longest = 0
        for item in batch:
            text = self._act(item)
            prompt = self.tokenizer.encode(item.prompt_text)
            ids = self.tokenizer.encode(text)[: item.max_new_tokens]
            prompt_tokens += len(prompt)
            longest = max(longest, len(ids))
            # A deterministic policy is a point mass: logprob 0 for every chosen token.
            out.append(GenOutput(self.tokenizer.decode(ids), prompt, ids, [0.0] * len(ids), "stop"))
        if self.simulate_cost:
            prefill_ms, decode_ms = self.cost
            budget = (prompt_tokens * prefill_ms + longest * decode_ms) / 1000
            time.sleep(max(0.0, budget - (time.perf_counter() - start)))
        return out

    def load_state_dict(self, version: int, state_dict: dict[str, object]) -> None:
        self.version = version

    def close(self) -> None:
        pass
