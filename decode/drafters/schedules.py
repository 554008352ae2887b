"""Draft-length schedules: how many tokens each row of a draft-model drafter drafts each round.

A schedule follows the batch's rows: `start(rows)` once, `lengths()` before each round (each row's wanted
length, at most gamma), `update(drafted, accepted)` after it with what the target verified and kept per row,
`select_rows(kept)` when rows finish. `keep_drafting(q, tokens)` may stop rows in the middle of a round. The
drafter asks the schedule and clips its answer to the row's budget; the engine only sees proposal lengths.

Every schedule here is lossless under sampling: a row's length is decided before the round or, for
confidence, from the draft's own state before the next position, never from the target's verdict on it.
"""
from __future__ import annotations

import torch


class Schedule:
    """The interface, and the constant schedule: gamma drafts every round (Leviathan et al. 2023)."""
    name = "constant"
    stops_mid_round = False  # True: keep_drafting may end rows during a round (the drafter asks it each step)

    def __init__(self, gamma: int):
        if gamma < 1:
            raise ValueError(f"a schedule needs gamma >= 1, got {gamma}")
        self.gamma = gamma
        self.rows = 0

    def start(self, rows: int) -> None:
        """A new batch of `rows` rows; what was learnt about an earlier batch is dropped."""
        self.rows = rows

    def lengths(self) -> list[int]:
        """Each row's draft length for the coming round, 0..gamma (0: a plain target step for that row)."""
        return [self.gamma] * self.rows

    def update(self, drafted: list[int], accepted: list[int]) -> None:
        """Per row: how many drafts the target verified in the last round, and how many it accepted."""

    def select_rows(self, rows: list[int]) -> None:
        """Keep these rows (indices into the current batch), in this order."""
        self.rows = len(rows)

    def keep_drafting(self, step_probs: torch.Tensor, step_tokens: torch.Tensor) -> torch.Tensor | None:
        """After a drafting step, asked only when stops_mid_round: q [B, V] of the step and the drafted tokens
        [B] -> [B] bool, the rows that may draft another token (the token just drawn is kept either way)."""
        return None


class ConstantSchedule(Schedule):
    """gamma drafts every round (Leviathan et al. 2023)."""


class HeuristicSchedule(Schedule):
    """transformers' "heuristic" schedule (candidate_generator.py, update_candidate_strategy), per row: +2 after
    a round whose drafts were all accepted, -1 otherwise, never below 1; a round the row did not draft (its
    budget was spent) changes nothing. transformers starts at num_assistant_tokens (20 in transformers 5) and
    has no cap; here the start is gamma and gamma is the cap, so the sweep's gamma bounds every point, and for
    gamma <= 20 the start is transformers' own start, capped."""
    name = "heuristic"

    def start(self, rows: int) -> None:
        super().start(rows)
        self.current = [self.gamma] * rows

    def lengths(self) -> list[int]:
        return list(self.current)

    def update(self, drafted, accepted):
        self.current = [self._next(n, d, a) for n, d, a in zip(self.current, drafted, accepted)]

    def _next(self, length: int, drafted: int, accepted: int) -> int:
        if drafted == 0:
            return length
        if accepted == drafted:
            return min(self.gamma, length + 2)
        return max(1, length - 1)

    def select_rows(self, rows):
        super().select_rows(rows)
        self.current = [self.current[r] for r in rows]


class ConfidenceSchedule(Schedule):
    """Stop drafting a row once the draft's top probability at a step falls under a threshold (transformers'
    assistant_confidence_threshold, default 0.4). The probabilities are the warped q under sampling, the softmax
    of the logits in greedy.

    The token drawn at the step that falls under the threshold is kept, then the row stops: transformers'
    ConfidenceCriteria is a stopping criterion, checked after the token is appended. Keeping it is also what
    keeps sampling lossless: whether position i+1 is drafted depends only on the draft's tokens up to i, so
    each position either follows the accept/resample rule or is the target's own draw. (Under transformers' test
    on the drawn token's probability, dropping that token would keep x only when q(x) is high: the kept drafts
    would no longer be distributed as q, and the acceptance rule would be off.) transformers checks the
    drafted token's probability, which in greedy is the top probability; under sampling we take the top
    probability (a property of the position, not of the draw); both are lossless. transformers also retunes
    its threshold from past rounds (with scikit-learn); this one is fixed.
    """
    name = "confidence"
    stops_mid_round = True

    def __init__(self, gamma: int, threshold: float = 0.4):
        super().__init__(gamma)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"confidence threshold must be within [0, 1], got {threshold}")
        self.threshold = threshold

    def keep_drafting(self, step_probs, step_tokens):
        top_probability = step_probs.max(dim=-1).values  # [B]
        return top_probability >= self.threshold


class CostModelSchedule(Schedule):
    """Each round, per row, the draft length k in 0..gamma that maximises expected tokens per unit of cost:

        E(k) = (1 - a^(k+1)) / (1 - a) tokens   for   k * c + v(k)   (v(k): a (k+1)-token target forward over a
                                                                        1-token one; v(0) = 1, a plain step)

    c and v are the cost ratios measured in this run (runner/probes.py); v is keyed, as there, by the draft
    length k (the forward is k+1 tokens wide), and interpolated linearly between measured lengths. k = 0 is a
    plain target step: speculation switches itself off where it does not pay.

    a is the row's acceptance estimate under the model E(k) assumes (each draft accepted with probability a,
    independently): accepted drafts are successes, a round that stopped at a rejection is one failure, and
    drafts after a rejection were never tested, so they count as neither. With a uniform Beta(1, 1) prior,
    a = (accepted + 1) / (accepted + rejections + 2): 0.5 before any evidence. (accepted / drafted would
    count the untested drafts as failures and underestimate a, the more so the longer the drafts.)

    A row at k = 0 gathers no evidence and would stay there for good, even where its text turned easy (a
    quoted passage, code being repeated). So a row idle for probe_every - 1 rounds drafts one token: a probe
    costs about c + v(1) - 1 target steps every probe_every rounds, and lets the estimate recover.
    """
    name = "cost_model"
    PROBE_EVERY = 8

    def __init__(self, gamma: int, c: float, v: dict[int, float], probe_every: int = PROBE_EVERY):
        super().__init__(gamma)
        if c < 0 or any(value <= 0 for value in v.values()):
            raise ValueError(f"cost_model needs c >= 0 and v > 0, got c={c}, v={v}")
        self.c = c
        self.v = {0: 1.0, **{int(k): float(value) for k, value in v.items()}}  # draft length k -> v(k)
        self.probe_every = probe_every

    def start(self, rows):
        super().start(rows)
        self.accepted = [0] * rows  # drafts accepted so far (successes)
        self.rejections = [0] * rows  # rounds that ended at a rejected draft (failures)
        self.idle = [0] * rows  # rounds since the row last drafted

    def verify_cost(self, k: int) -> float:
        """v(k): measured, interpolated linearly between measured lengths; past the longest, the last slope."""
        known = self.v
        if k in known:
            return known[k]
        below = max(j for j in known if j < k)
        above = min((j for j in known if j > k), default=None)
        if above is None:
            lower = max((j for j in known if j < below), default=None)
            slope = 0.0 if lower is None else (known[below] - known[lower]) / (below - lower)
            return known[below] + slope * (k - below)
        return known[below] + (known[above] - known[below]) * (k - below) / (above - below)

    def tokens_per_cost(self, k: int, alpha: float) -> float:
        """E(k) / (k c + v(k))."""
        expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        return expected / (k * self.c + self.verify_cost(k))

    def best_length(self, alpha: float) -> int:
        """The k in 0..gamma with the most tokens per cost; on a tie the shorter."""
        return max(range(self.gamma + 1), key=lambda k: (self.tokens_per_cost(k, alpha), -k))

    def alpha(self, row: int) -> float:
        return (self.accepted[row] + 1) / (self.accepted[row] + self.rejections[row] + 2)

    def lengths(self):
        out = []
        for row in range(self.rows):
            k = self.best_length(self.alpha(row))
            if k == 0 and self.idle[row] + 1 >= self.probe_every:
                k = 1  # a probe: the only way new evidence arrives
            out.append(k)
        return out

    def update(self, drafted, accepted):
        for row, (d, a) in enumerate(zip(drafted, accepted)):
            self.accepted[row] += a
            self.rejections[row] += int(a < d)
            self.idle[row] = 0 if d else self.idle[row] + 1

    def select_rows(self, rows):
        super().select_rows(rows)
        self.accepted = [self.accepted[r] for r in rows]
        self.rejections = [self.rejections[r] for r in rows]
        self.idle = [self.idle[r] for r in rows]


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "confidence": ConfidenceSchedule,
             "cost_model": CostModelSchedule}


def make_schedule(name: str, gamma: int, *, confidence: float = 0.4, c: float | None = None,
                  v: dict[int, float] | None = None) -> Schedule:
    """A schedule by name (SCHEDULES). confidence: the threshold; c, v: cost_model's measured cost ratios
    (v keyed by draft length k, as runner/probes.py measures it)."""
    if name == "confidence":
        return ConfidenceSchedule(gamma, confidence)
    if name == "cost_model":
        if c is None or not v:
            raise ValueError("the cost_model schedule needs the measured cost ratios c and v")
        return CostModelSchedule(gamma, c, v)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](gamma)
