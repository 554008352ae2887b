"""The sweep plan: which points run, on which batches, in which units of work.

A point is a set of named axes (eval/records.py: method, draft, gamma, schedule, tree, exit_layer,
synthetic_acceptance, batch_size, temperature); the registry says which axes apply to a method, so a new axis is a new entry in AXES and
here, not a new code path. A unit of work is one batch of prompts at one (batch_size, temperature) in one
repeat: every point of that comparison runs on it back to back, in an order that changes from unit to unit
(`order_of`, a Williams design), so drift of the machine favours no method, no point always runs right after
the same other one, and every ratio pairs the same prompts.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from decode.methods import REGISTRY
from decode.tree_layout import tree_depth
from eval.records import Point


@dataclass(frozen=True)
class Unit:
    """One batch of a fixed-batch comparison, or one whole load point of a serving run (config load:): all its
    requests, batch_index 0, batch_size = concurrency (the most rows in flight)."""
    batch_size: int
    temperature: float | None
    repeat: int
    batch_index: int
    concurrency: int | None = None  # a serving unit's load point; None: a fixed batch
    request_rate: float | None = None  # requests per second; None: all at once

    @property
    def serving(self) -> bool:
        return self.concurrency is not None

    @property
    def comparison(self) -> tuple:
        """What points_of and Session.prepare take: (batch_size, temperature), and a serving unit's load point."""
        return (self.batch_size, self.temperature) + ((self.concurrency, self.request_rate) if self.serving else ())

    @property
    def label(self) -> str:
        temperature = "greedy" if self.temperature is None else f"T={self.temperature}"
        if self.serving:
            rate = "" if self.request_rate is None else f" rate={self.request_rate}/s"
            return f"conc={self.concurrency}{rate} {temperature} repeat={self.repeat}"
        return f"batch={self.batch_size} {temperature} repeat={self.repeat} batch#{self.batch_index}"


def axis_values(config, method: str) -> dict[str, list]:
    """The values each axis takes for one method: the registry says which axes apply."""
    spec = REGISTRY[method]
    axes, speculative = spec.axes, config.speculative
    return {
        "draft": [d.name for d in config.draft if d.kind in spec.draft_kinds] if "draft" in axes else [None],
        "gamma": list(speculative.gamma) if "gamma" in axes else [None],
        "schedule": list(speculative.schedule) if "schedule" in axes else [None],
        "tree": list(speculative.tree) if "tree" in axes else [None],
        "exit_layer": list(speculative.exit_layer or []) if "exit_layer" in axes else [None],
        "synthetic_acceptance": list(speculative.synthetic_acceptance) if "synthetic_acceptance" in axes else [None],
    }


def points_of(config, batch_size: int, temperature: float | None, concurrency: int | None = None,
              request_rate: float | None = None, engine: str | None = None) -> list[Point]:
    """The comparison's points, of one engine's methods where engine is given (MethodSpec.engine); a serving
    comparison's carry its load point (concurrency, request_rate).

    Per method, the chains (tree None) first, as before trees existed, then the trees in config order. A tree point
    has no schedule (schedules choose a chain's length), and a static tree's gamma is its depth, so the gamma axis
    does not repeat it; a dynamic tree and auto keep each gamma (their depth cap). auto is a draft model's (it prices
    the tree with the draft's measured cost): prompt lookup takes the static and dynamic trees only."""
    points = []
    for method in config.methods:
        if engine is not None and REGISTRY[method].engine != engine:
            continue
        values = axis_values(config, method)
        trees = values.pop("tree")
        for tree in sorted(trees, key=lambda label: label is not None):  # stable: the trees keep config order
            if tree == "auto" and method != "speculative":
                continue
            for draft, gamma, schedule, exit_layer, synthetic in itertools.product(*values.values()):
                if tree is not None:
                    gamma, schedule = tree_depth(tree, gamma), None
                points.append(Point(method=method, batch_size=batch_size, draft=draft, gamma=gamma, schedule=schedule,
                                    tree=tree, exit_layer=exit_layer, synthetic_acceptance=synthetic,
                                    concurrency=concurrency, request_rate=request_rate, temperature=temperature))
    return list(dict.fromkeys(points))  # a static tree comes once per gamma and schedule: keep the first


def comparisons(config, requests: int | None = None) -> list[tuple]:
    """(batch_size, temperature) pairs, in the order they run; each has its own baseline. A serving run's (config
    load:) are (concurrency, temperature, concurrency, request_rate): its load points, `requests` per point."""
    if getattr(config, "load", None) is not None:
        return [(c, t, c, r) for t in config.generation.temperatures() for c, r in config.load.points(requests or 1)]
    return [(b, t) for t in config.generation.temperatures() for b in config.batch_size]


def skipped_reason(point: Point) -> str | None:
    limit = REGISTRY[point.method].max_batch_size
    if limit is not None and point.batch_size > limit:
        return f"{point.method} supports batch size {limit} only (transformers has no batched version of it)"
    return None


def batches_of(prompts: list, batch_size: int) -> list[list]:
    return [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]


def units_of(comparison: tuple, num_prompts: int, repeat: int) -> list[Unit]:
    """A fixed-batch comparison's batches of num_prompts prompts; a serving comparison is one unit (its requests)."""
    if len(comparison) == 4:
        batch_size, temperature, concurrency, rate = comparison
        return [Unit(batch_size, temperature, repeat, 0, concurrency, rate)]
    batch_size, temperature = comparison
    count = -(-num_prompts // batch_size)
    return [Unit(batch_size, temperature, repeat, index) for index in range(count)]


def num_units(comparison: tuple, num_prompts: int) -> int:
    """Units (batches; one for a load point) per repeat of a comparison."""
    return 1 if len(comparison) == 4 else -(-num_prompts // comparison[0])


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


def shard(units: list[Unit], worker: int, workers: int) -> list[Unit]:
    """Round-robin: each worker gets every workers-th unit."""
    return units[worker::workers]


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
