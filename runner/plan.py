"""The sweep plan: which points run, on which batches, in which units of work.

A point is a set of named axes, declared once in eval/axes.py: the comparison axes (batch_size, the load point,
temperature) split the sweep into comparisons, each with its own baseline, and the point axes (draft, gamma, schedule,
tree, ...) tell a comparison's points apart; the registry says which point axes apply to a method. Nothing here names
an axis but the tree's own rules (points_of). A unit of work is one batch of prompts of one comparison in one repeat
(a serving comparison's: its whole load point): every point of that comparison runs on it back to back, in an order
that changes from unit to unit (`order_of`, a Williams design), so drift of the machine favours no method, no point
always runs right after the same other one, and every ratio pairs the same prompts.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from decode.methods import REGISTRY
from decode.tree_layout import tree_depth
from eval.axes import comparison_axes, point_axes
from eval.records import Comparison, Point


@dataclass(frozen=True)
class Unit:
    """One batch of a fixed-batch comparison, or one whole load point of a serving run (config load:): all its
    requests, batch_index 0, batch_size = concurrency (the most rows in flight). Its comparison's axes read as its own
    (unit.batch_size, unit.temperature, ...)."""
    comparison: Comparison
    repeat: int
    batch_index: int

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "comparison":
            raise AttributeError(name)
        return getattr(self.comparison, name)

    @property
    def label(self) -> str:
        where = "" if self.serving else f" batch#{self.batch_index}"
        return f"{self.comparison.label} repeat={self.repeat}{where}"


def axis_values(config, method: str) -> dict[str, list]:
    """The values each point axis takes for one method: [None] where the axis does not apply to it (the registry
    says which do)."""
    spec = REGISTRY[method]
    return {axis.name: axis.swept(config, spec) if axis.applies_to(spec) else [None] for axis in point_axes()}


def points_of(config, comparison: Comparison, engine: str | None = None) -> list[Point]:
    """The comparison's points, of one engine's methods where engine is given (MethodSpec.engine).

    Per method, the chains (tree None) first, as before trees existed, then the trees in config order. A tree point
    has no schedule (schedules choose a chain's length), and a static tree's gamma is its depth, so the gamma axis
    does not repeat it; a dynamic tree and auto keep each gamma (their depth cap). auto is a drafter's that drafts a
    depth per forward (it prices the tree with that forward's measured cost: MethodSpec.tree_auto): prompt lookup and
    suffix take the static and dynamic trees only."""
    points = []
    shared = comparison.values()
    for method in config.methods:
        if engine is not None and REGISTRY[method].engine != engine:
            continue
        values = axis_values(config, method)
        trees = values.pop("tree")
        for tree in sorted(trees, key=lambda label: label is not None):  # stable: the trees keep config order
            if tree == "auto" and not REGISTRY[method].tree_auto:
                continue
            for combination in itertools.product(*values.values()):
                axes = dict(zip(values, combination), tree=tree)
                if tree is not None:
                    axes.update(gamma=tree_depth(tree, axes["gamma"]), schedule=None)
                points.append(Point(method=method, **shared, **axes))
    return list(dict.fromkeys(points))  # a static tree comes once per gamma and schedule: keep the first


def comparisons(config, requests: int | None = None) -> list[Comparison]:
    """The comparisons, in the order they run; each has its own baseline. The product of the comparison axes' values,
    the last axis of the table outermost (temperature: every batch size at one temperature, then the next); an axis
    another sets (a serving run's load point sets concurrency, request_rate and batch_size together) adds none of its
    own. `requests`: a serving run's requests per load point."""
    sweeps = [axis.swept(config, requests) for axis in reversed(comparison_axes()) if axis.set_by is None]
    return [Comparison(**{k: v for part in combination for k, v in part.items()})
            for combination in itertools.product(*sweeps)]


def skipped_reason(point: Point) -> str | None:
    limit = REGISTRY[point.method].max_batch_size
    if limit is not None and point.batch_size > limit:
        return f"{point.method} supports batch size {limit} only (transformers has no batched version of it)"
    return None


def batches_of(prompts: list, batch_size: int) -> list[list]:
    return [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]


def units_of(comparison: Comparison, num_prompts: int, repeat: int) -> list[Unit]:
    """A fixed-batch comparison's batches of num_prompts prompts; a serving comparison is one unit (its requests)."""
    return [Unit(comparison, repeat, index) for index in range(num_units(comparison, num_prompts))]


def num_units(comparison: Comparison, num_prompts: int) -> int:
    """Units (batches; one for a load point) per repeat of a comparison."""
    return 1 if comparison.serving else -(-num_prompts // comparison.batch_size)


def williams_order(n: int, index: int) -> list[int]:
    """Row `index` of a Williams design for n treatments: rows 0 .. n-1 (and, for odd n, their reverses,
    n .. 2n-1) form a Latin square, so over a cycle each treatment runs in each position equally often, and each
    ordered pair (a, b) runs back to back equally often: what ran just before (a warm cache, a hot core, the
    allocator's state) favours no treatment. A plain rotation keeps every point right after the same other one.
    """
    if n == 0:
        return []
    offsets = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    cycle = n if n % 2 == 0 else 2 * n
    row = index % cycle
    order = [(row % n + offset) % n for offset in offsets]
    return order[::-1] if row >= n else order


def order_of(points: list[Point], unit: Unit) -> list[Point]:
    """The unit's order of its points: the next row of the Williams design, from batch to batch and repeat
    to repeat."""
    return [points[i] for i in williams_order(len(points), unit.batch_index + unit.repeat)]


def left_pad(token_lists: list[list[int]], pad_id: int, device):
    """A batch's token lists -> ids, mask [B, P] (torch, on device), left padded."""
    import torch

    width = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return ids.to(device), mask.to(device)
