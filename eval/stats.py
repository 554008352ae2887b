"""Small statistics: finite figures, percentiles, distributions, spreads, strict JSON, and the paired bootstrap
over prompts that every ratio's interval comes from (docs/metrics.md, Uncertainty)."""
from __future__ import annotations

import math
import random
import statistics

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
# Fewer prompt batches than this back a ratio: no interval, and the ratio is flagged few_samples. With n prompt
# batches a bootstrap has C(2n-1, n) distinct resamples (3 at n = 2, 126 at n = 5, 6435 at n = 8), and the plain
# percentile interval of a mean covers P(|t_(n-1)| < 1.96 sqrt((n-1)/n)) instead of 95%: 85% at n = 5, 90% at
# n = 10. The expanded interval below corrects the second; below 8 the first leaves too few distinct resamples
# for its tail percentiles (0.6% and 99.4% at n = 8) to mean anything.
MIN_PROMPTS = 8


def finite(value):
    """None for a figure that does not exist (NaN, inf, None)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def ratio(numerator, denominator):
    if numerator is None or not denominator:
        return None
    return finite(numerator / denominator)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "p50": percentile(values, .5), "p90": percentile(values, .9),
            "p99": percentile(values, .99)}


def spread(values: list[float]) -> float | None:
    """(max - min) / median: how far repetitions of the same measurement disagree."""
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None


def strict(obj, where: str = "", replaced: list[str] | None = None):
    """A copy of obj with every NaN or infinity replaced by None (strict JSON); their paths go to `replaced`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if replaced is not None:
            replaced.append(where or "(top)")
        return None
    if isinstance(obj, dict):
        return {k: strict(v, f"{where}.{k}" if where else str(k), replaced) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v, f"{where}[{i}]", replaced) for i, v in enumerate(obj)]
    return obj


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by its Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5): within 1e-3 of
    the exact value for df >= 5 at p = 0.975 (2.5706 at df 5, 2.2622 at df 9, 2.0423 at df 30)."""
    z = statistics.NormalDist().inv_cdf(p)
    terms = [(z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
             (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
             (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160]
    return z + sum(term / df ** (k + 1) for k, term in enumerate(terms))


def expanded_tail(n: int, confidence: float = CONFIDENCE) -> float:
    """The tail probability at which the expanded percentile interval cuts the bootstrap distribution (Hesterberg,
    "What teachers should know about the bootstrap", 2015): Phi(-sqrt(n / (n - 1)) t_(1-a/2, n-1)), so that for a
    mean it is as wide as the t interval, instead of the plain percentile interval's too narrow 1.96 s / sqrt(n)."""
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    return statistics.NormalDist().cdf(-math.sqrt(n / (n - 1)) * t)


def ratio_of_totals(clusters: list[tuple]) -> float | None:
    """(sum tokens / sum wall of the point) / (sum tokens / sum wall of the baseline), clusters being
    (tokens, wall, baseline tokens, baseline wall)."""
    tokens, wall, base_tokens, base_wall = (sum(c[i] for c in clusters) for i in range(4))
    return ratio(ratio(tokens, wall), ratio(base_tokens, base_wall))


def expanded_interval(values: list[float], n: int) -> list[float] | None:
    """The expanded percentile interval (expanded_tail) of bootstrap values over n clusters; None without values."""
    if not values:
        return None
    tail = expanded_tail(n)
    return [percentile(values, tail), percentile(values, 1 - tail)]


def misses(point: float | None, interval: list[float] | None) -> bool:
    """Whether an interval misses its own point (both given, the point outside; an edge is inside): such an interval
    is no interval of the point, and the figures withhold it."""
    return point is not None and bool(interval) and not interval[0] <= point <= interval[1]


def bootstrap_ci(clusters: list[tuple], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
                 ) -> list[float] | None:
    """95% CI of the ratio of totals, resampling prompt clusters with replacement; None with fewer than MIN_PROMPTS.

    A cluster is one prompt batch with every repeat of it, point and baseline side by side (tokens, wall, baseline
    tokens, baseline wall, summed over its repeats): repeats average the timing noise of those prompts, and the
    interval covers how the ratio varies from prompt to prompt, so more repeats of the same prompts do not narrow
    it by sqrt(repeats). Expanded percentile interval (expanded_tail). Seeded: a rebuild gives the same numbers."""
    n = len(clusters)
    if n < MIN_PROMPTS:
        return None
    rng = random.Random(seed)
    values = [v for v in (ratio_of_totals(rng.choices(clusters, k=n)) for _ in range(resamples)) if v is not None]
    return expanded_interval(values, n)
