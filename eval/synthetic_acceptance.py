"""Figures of a synthetic-acceptance point (config speculative.synthetic_acceptance): its drafts were accepted by a
seeded Bernoulli(alpha) chain at a set alpha, not by the target, so its output is not the target's and it has no
exact match. What it measures is the system's cost at that alpha: the alpha estimated from its rounds against the
set one (with a bootstrap interval over prompts), and its measured speedup against the one Leviathan's model
predicts from the measured alpha, c and v (eval/figures.py cost_figures: the point's efficiency)."""
from __future__ import annotations

import random
from collections import Counter

from eval.leviathan import predicted_speedup
from eval.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, MIN_PROMPTS, expanded_interval, ratio

BISECTION_STEPS = 50  # 2^-50: far below any alpha a run can resolve


def _expected(alpha: float, drafted: int) -> float:
    """E[accepted | drafted, alpha] = alpha (1 - alpha^drafted) / (1 - alpha) (eval/leviathan.py expected_accepted)."""
    return drafted if alpha >= 1 else alpha * (1 - alpha ** drafted) / (1 - alpha)


def alpha_of_counts(drafted: Counter, accepted: int) -> float | None:
    """eval/leviathan.py solve_alpha from totals: `drafted` counts the rounds by how many drafts each had (rounds
    with none left out), `accepted` sums their accepted drafts."""
    total = sum(g * n for g, n in drafted.items())
    if not total:
        return None
    if accepted <= 0:
        return 0.0
    if accepted >= total:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        if sum(n * _expected(mid, g) for g, n in drafted.items()) < accepted:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def alpha_clusters(samples: list[dict]) -> list[tuple[Counter, int]]:
    """Per prompt (sample_id), with every repeat of it: (its rounds counted by drafts, their accepted drafts), in
    prompt order. Each row's draws are its own, so a prompt is the unit the bootstrap resamples, at any batch size."""
    clusters: dict[int, tuple[Counter, list[int]]] = {}
    for s in samples:
        drafted, accepted = clusters.setdefault(s["sample_id"], (Counter(), [0]))
        for r in s.get("rounds") or []:
            if r["drafted"] > 0:
                drafted[r["drafted"]] += 1
                accepted[0] += r["accepted"]
    return [(drafted, accepted[0]) for _, (drafted, accepted) in sorted(clusters.items())]


def alpha_ci(samples: list[dict], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
             ) -> list[float] | None:
    """95% bootstrap CI of the alpha solved from the rounds: resample prompts with replacement (each with all its
    repeats), solve alpha from the resample's totals, take the expanded percentile interval as every speedup's
    (eval/stats.py bootstrap_ci). None with fewer than MIN_PROMPTS prompts. Seeded: a rebuild gives the same."""
    clusters = [c for c in alpha_clusters(samples) if c[0]]
    n = len(clusters)
    if n < MIN_PROMPTS:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        drafted, accepted = Counter(), 0
        for counts, taken in rng.choices(clusters, k=n):
            drafted.update(counts)
            accepted += taken
        value = alpha_of_counts(drafted, accepted)
        if value is not None:
            values.append(value)
    return expanded_interval(values, n)


def synthetic_figures(set_alpha: float, samples: list[dict], metrics: dict) -> dict:
    """The set alpha, the estimated one's interval and distance from it, and the prompts behind the interval."""
    estimated = metrics.get("alpha")
    return {"synthetic": True, "synthetic_acceptance": set_alpha, "alpha_ci95": alpha_ci(samples),
            "alpha_minus_set": None if estimated is None else estimated - set_alpha,
            "alpha_prompts": sum(1 for c in alpha_clusters(samples) if c[0])}


def prediction_interval(gamma: int | None, metrics: dict) -> list[float] | None:
    """The predicted speedup at the ends of the alpha interval, c and v as measured (the prediction grows with
    alpha): how far alpha's own uncertainty moves the prediction. None without an interval or a prediction."""
    interval, c, v = metrics.get("alpha_ci95"), metrics.get("draft_cost_ratio_c"), metrics.get("verify_cost_ratio_v")
    if not interval or metrics.get("predicted_speedup") is None or gamma is None or c is None or v is None:
        return None
    ends = [predicted_speedup(a, gamma, c, v) for a in interval]
    return None if None in ends else ends


def efficiency_interval(metrics: dict) -> list[float] | None:
    """measured / predicted at the ends of the speedup's interval, the prediction as it is: how far the prompts'
    spread alone moves the cost model's test. None without both."""
    interval, predicted = metrics.get("speedup_ci95"), metrics.get("predicted_speedup")
    if not interval or not predicted:
        return None
    return [interval[0] / predicted, interval[1] / predicted]


def not_the_targets(point, samples: list[dict], metrics: dict) -> dict:
    """A synthetic point's figures in place of the exact match (its output is not the target's), at a fixed batch and
    under load alike."""
    return {"exact_match": None, "mismatches": None,
            **synthetic_figures(point.synthetic_acceptance, samples, metrics)}


def synthetic_prediction(point, metrics: dict, speedup: str = "speedup") -> dict:
    """A synthetic point's test of the cost model: the prediction at the ends of alpha's interval, and measured /
    predicted with its interval over the measured speedup's (speedup: its key, speedup_tput under load)."""
    predicted = metrics.get("predicted_speedup")
    return {"predicted_speedup_ci95": prediction_interval(point.gamma, metrics),
            "efficiency": ratio(metrics.get(speedup), predicted),
            "efficiency_ci95": efficiency_interval({"speedup_ci95": metrics.get(speedup + "_ci95"),
                                                    "predicted_speedup": predicted})}
