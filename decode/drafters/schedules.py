"""Draft-length schedules: how many tokens each row drafts each round.

A schedule answers `lengths(rows)` before a round and learns from `update(drafted, accepted)` after it,
per row; `confident(probs)` lets a schedule stop a row's drafting mid-round. The drafter asks it; the
engine only sees each row's proposal length.
"""
from __future__ import annotations

import torch


class Schedule:
    name = "constant"

    def __init__(self, gamma: int):
        self.gamma = gamma
        self.rows = 0

    def start(self, rows: int) -> None:
        self.rows = rows

    def lengths(self) -> list[int]:
        """Each row's draft length for the coming round (at most gamma)."""
        return [self.gamma] * self.rows

    def update(self, drafted: list[int], accepted: list[int]) -> None:
        """What each row drafted and kept in the last round."""

    def select_rows(self, rows: list[int]) -> None:
        self.rows = len(rows)

    def keep_drafting(self, step_probs: torch.Tensor, step_tokens: torch.Tensor) -> torch.Tensor | None:
        """[B, V] q of this step and the drafted tokens [B] -> [B] bool: rows that may draft another token,
        or None when the schedule never stops a row mid-round."""
        return None


class ConstantSchedule(Schedule):
    """gamma drafts every round (Leviathan et al.)."""


class HeuristicSchedule(Schedule):
    """transformers' "heuristic" schedule (candidate_generator.py): +2 after a round whose drafts were all
    accepted, -1 otherwise, never below 1. transformers starts at num_assistant_tokens; here at gamma, and
    the length never exceeds gamma, so gamma is the cap the sweep axis sets."""
    name = "heuristic"

    def start(self, rows: int) -> None:
        super().start(rows)
        self.current = [self.gamma] * rows

    def lengths(self) -> list[int]:
        return list(self.current)

    def update(self, drafted, accepted):
        self.current = [min(self.gamma, n + 2) if d and a == d else max(1, n - 1) if d else n
                        for n, d, a in zip(self.current, drafted, accepted)]

    def select_rows(self, rows):
        super().select_rows(rows)
        self.current = [self.current[r] for r in rows]


class ConfidenceSchedule(Schedule):
    """Stop drafting a row once the draft's probability of the token it just drafted falls under a
    threshold (transformers' assistant_confidence_threshold and its ConfidenceCriteria, which check the
    last drafted token's probability: that token is kept, then the row stops)."""
    name = "confidence"

    def __init__(self, gamma: int, threshold: float = 0.4):
        super().__init__(gamma)
        self.threshold = threshold

    def keep_drafting(self, step_probs, step_tokens):
        p_drafted = step_probs.gather(-1, step_tokens[:, None]).squeeze(-1)  # [B]
        return p_drafted >= self.threshold


class CostModelSchedule(Schedule):
    """Each round, per row, the k in 0..gamma that maximises expected tokens per unit of target-forward cost:

        E(k) = (1 - a^(k+1)) / (1 - a)   tokens, for   k * c + v(k+1)   (v(1) = 1: a plain target step)

    a = the row's running acceptance estimate, (accepted + 1) / (drafted + 2) (a uniform prior), c and v the
    draft and verification cost ratios measured in this run. k = 0 is a plain target step: speculation
    switches itself off where it does not pay. With k = 0 no evidence arrives, so a row that stopped
    drafting probes with k = 1 every PROBE_EVERY rounds; a probe costs about c + v(2) - 1 of one target
    step, spread over PROBE_EVERY steps.
    """
    name = "cost_model"
    PROBE_EVERY = 8

    def __init__(self, gamma: int, c: float, v: dict[int, float]):
        super().__init__(gamma)
        self.c = c
        self.v = dict(v)  # draft length k -> cost of a (k+1)-token target forward / a 1-token one

    def start(self, rows):
        super().start(rows)
        self.drafted = [0] * rows
        self.accepted = [0] * rows
        self.idle = [0] * rows

    def verify_cost(self, k: int) -> float:
        """v of a (k+1)-token forward: measured, interpolated linearly between measured lengths, 1 at k = 0."""
        known = {0: 1.0, **{int(key): value for key, value in self.v.items()}}
        if k in known:
            return known[k]
        below = max((j for j in known if j < k), default=0)
        above = min((j for j in known if j > k), default=None)
        if above is None:  # past the longest measured: extend the last slope
            lower = max((j for j in known if j < below), default=None)
            slope = 0.0 if lower is None else (known[below] - known[lower]) / (below - lower)
            return known[below] + slope * (k - below)
        return known[below] + (known[above] - known[below]) * (k - below) / (above - below)

    def best_length(self, alpha: float) -> int:
        def tokens_per_cost(k: int) -> float:
            expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
            return expected / (k * self.c + self.verify_cost(k))

        return max(range(self.gamma + 1), key=lambda k: (tokens_per_cost(k), -k))

    def lengths(self):
        out = []
        for row in range(self.rows):
            alpha = (self.accepted[row] + 1) / (self.drafted[row] + 2)
            k = self.best_length(alpha)
            if k == 0 and self.idle[row] + 1 >= self.PROBE_EVERY:
                k = 1
            out.append(k)
        return out

    def update(self, drafted, accepted):
        for row, (d, a) in enumerate(zip(drafted, accepted)):
            self.drafted[row] += d
            self.accepted[row] += a
            self.idle[row] = 0 if d else self.idle[row] + 1

    def select_rows(self, rows):
        super().select_rows(rows)
        self.drafted = [self.drafted[r] for r in rows]
        self.accepted = [self.accepted[r] for r in rows]
        self.idle = [self.idle[r] for r in rows]


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "confidence": ConfidenceSchedule,
             "cost_model": CostModelSchedule}


def make_schedule(name: str, gamma: int, *, confidence: float = 0.4, c: float | None = None,
                  v: dict[int, float] | None = None) -> Schedule:
    if name == "confidence":
        return ConfidenceSchedule(gamma, confidence)
    if name == "cost_model":
        if c is None or not v:
            raise ValueError("the cost_model schedule needs the measured cost ratios c and v")
        return CostModelSchedule(gamma, c, v)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](gamma)
