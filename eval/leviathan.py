"""Leviathan et al. 2023's model of speculative decoding: alpha from the rounds, the expected accepted length,
and the predicted speedup (docs/metrics.md)."""
from __future__ import annotations

from eval.stats import ratio


def expected_accepted(alpha: float, drafted: int) -> float:
    """E[accepted prefix length] of `drafted` drafts, each accepted with probability alpha given the ones before:
    alpha + alpha^2 + ... + alpha^drafted = alpha (1 - alpha^drafted) / (1 - alpha)."""
    return sum(alpha ** i for i in range(1, drafted + 1))


def solve_alpha(rounds: list[dict]) -> float | None:
    """The alpha with sum_r E[a_r | gamma_r, alpha] = sum_r a_r over the rounds that drafted (docs/metrics.md).

    From the rounds, for every schedule: tau = N / target forwards counts the prefill's forward and token, which
    biases alpha low for short outputs (gamma 3, every draft accepted, 12 tokens: tau 3.0 gives 0.81, not 1).
    All drafts accepted gives 1, none 0; None when no round drafted a token."""
    drafted = [r["drafted"] for r in rounds if r["drafted"] > 0]
    accepted = sum(r["accepted"] for r in rounds if r["drafted"] > 0)
    if not drafted:
        return None
    if accepted <= 0:
        return 0.0
    if accepted >= sum(drafted):
        return 1.0
    return _bisect(lambda a: sum(expected_accepted(a, g) for g in drafted) - accepted)


def _bisect(increasing) -> float:
    """The root in [0, 1] of a function that grows with its argument."""
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if increasing(mid) < 0:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def predicted_speedup(alpha: float, gamma: int, c: float, v: float) -> float | None:
    """Expected tokens per round over the cost of a round in 1-token target forwards:
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + v))."""
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return ratio(expected_tokens, gamma * c + v)
