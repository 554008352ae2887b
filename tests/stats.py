"""A chi-square goodness-of-fit check with no SciPy."""
from __future__ import annotations

import math

import torch


def chi_square(observed_counts: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0):
    """Returns (statistic, 99.9% critical value); bins expected below min_expected are pooled."""
    total = observed_counts.sum().item()
    expected = expected_probs.double() * total
    small = expected < min_expected
    observed = observed_counts.double()
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    statistic = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    dof = int(keep.sum().item()) - 1
    z = 3.09  # one-sided 99.9%; Wilson-Hilferty approximation of the chi-square quantile
    critical = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return statistic, critical
