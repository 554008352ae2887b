"""Joules per output token (eval/figure_table.py energy_j_per_token) from the records' energy_j: the device's energy
counter read around each timed batch of our engine, and over each load point's span in a repeat (runner/energy.py),
the same value on every row of that batch or span.

A batch is the smallest thing the counter sees, so a fixed-batch point's interval is over prompt batches (each with
all its repeats, the batches of one conversation together, as speedup_ci95), and a load point, whose requests share
one reading per repeat, has none. A batch counts only whole (every row of it present): a group's rows are part of
batches whose joules the other rows spent too, so a group has no figure.
"""
from __future__ import annotations

from collections import defaultdict

from decode.methods import REGISTRY
from eval.stats import bootstrap_ci, ratio, ratio_of_totals
from eval.totals import BATCHES, Ratio, clusters_of, paired_clusters, units

FIGURES = ("energy_j_per_token", "energy_j_per_token_ci95", "energy_ratio", "energy_ratio_ci95")


def energy_and_tokens(rows: list[dict]) -> tuple | None:
    """(joules, new tokens) of one batch or one load point's repeat; None where it was not measured or is not whole."""
    if not rows or any(r.get("energy_j") is None for r in rows) or len(rows) != rows[0].get("batch_rows", len(rows)):
        return None
    return rows[0]["energy_j"], sum(r["new_tokens"] for r in rows)


def _per_token(units_of: dict) -> tuple[float | None, list[tuple] | None]:
    """sum joules / sum tokens over the units, and each unit's (joules, tokens); None where any unit lacks them."""
    measured = {key: energy_and_tokens(rows) for key, rows in units_of.items()}
    if not measured or any(m is None for m in measured.values()):
        return None, None
    return ratio(sum(j for j, _ in measured.values()), sum(n for _, n in measured.values())), measured


def energy_per_token(inputs) -> dict:
    """A fixed-batch point: joules per output token over its batches, its 95% bootstrap interval over prompt batches,
    and the ratio to the baseline's over the batches both finished, paired as the speedup is (eval/totals.py)."""
    samples, baseline = inputs.samples, inputs.baseline
    value, measured = _per_token(units(samples))
    if value is None:
        return dict.fromkeys(FIGURES)
    cluster = clusters_of(samples)
    by_cluster: dict = defaultdict(lambda: [0.0, 0, 1, 1])  # (joules, tokens, 1, 1): its ratio of totals is J/token
    for (_, batch_index), (joules, tokens) in measured.items():
        by_cluster[cluster[batch_index]][0] += joules
        by_cluster[cluster[batch_index]][1] += tokens
    out = {"energy_j_per_token": value, "energy_j_per_token_ci95": bootstrap_ci([tuple(c) for c in by_cluster.values()])}
    pairs = paired_clusters(samples, baseline, BATCHES, ENERGY) if baseline else []
    reference = REGISTRY[inputs.point.method].is_reference
    out["energy_ratio"] = ratio_of_totals(pairs) if pairs else None
    out["energy_ratio_ci95"] = None if reference or not pairs else bootstrap_ci(pairs)
    return out


# a batch's (joules, tokens): ratio_of_totals of the pairs is (J/token of the point) / (J/token of the baseline)
ENERGY = Ratio("energy_ratio", energy_and_tokens, every_pair=True)


def _by_repeat(rows: list[dict]) -> dict:
    out: dict = defaultdict(list)
    for r in rows:
        out[r.get("repeat", 0)].append(r)
    return out


def served_energy_per_token(inputs) -> dict:
    """A load point: joules per output token over its repeats, and the ratio to the baseline's over the repeats both
    served; no interval: its requests share one reading per repeat, and repeats are no new samples."""
    mine = _by_repeat(inputs.samples)
    value, measured = _per_token(mine)
    out = dict.fromkeys(FIGURES)
    if value is None:
        return out
    out["energy_j_per_token"] = value
    if inputs.baseline:
        _, theirs = _per_token(_by_repeat(inputs.baseline))
        both = sorted(set(measured) & set(theirs or {}))
        if both:
            out["energy_ratio"] = ratio_of_totals([(*measured[r], *theirs[r]) for r in both])
    return out
