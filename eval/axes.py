"""The sweep's axes, declared once: this table is the only place that lists them.

An axis is a named value of a sweep point. A *comparison* axis splits comparisons: points that share every comparison
axis's value are measured on the same batches and compared with the same baseline (batch_size, the load point,
temperature). A *point* axis tells the points of one comparison apart (draft, gamma, schedule, tree, ...); the method
registry (decode/methods, MethodSpec.axes) says which apply to a method. Where an axis does not apply its value is
None.

Everything that enumerates axes derives from AXES: Point, Comparison and the records' axis fields (eval/records.py), the
plan's comparisons, points and units (runner/plan.py), labels, the summary's runs, order and best points
(eval/summary.py), the serving lines (eval/served_figures.py) and the report's columns and CSVs (eval/report.py). A new
axis is an entry here, its config field (utils/config.py) and, where an engine must honour its value, that engine; a test
(tests/eval/test_axes.py) declares a toy axis and follows it from the plan to the table.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

COMPARISON, POINT = "comparison", "point"


@dataclass(frozen=True)
class Axis:
    name: str  # the axis, and its field in Point, Comparison and every record (samples.jsonl, summary.json's runs)
    splits: str  # COMPARISON or POINT (the module docstring)
    config: str  # the config path its values come from ("speculative.gamma"): a list sweeps
    label: str | Callable  # its value in a point's label: a format of the value, left out where the value is None; or
    #   (value, the point's axis values) -> text or None (left out)
    doc: str  # one line: what a value means
    default: tuple = ()  # the values where the config leaves the path unset (None, or absent)
    values: Callable | None = None  # where the path alone does not say them: a point axis's (config, MethodSpec) ->
    #   values; a comparison axis's (config, requests) -> [{axis: value} per comparison] (a load point sets several)
    applies: Callable | None = None  # a point axis: (MethodSpec) -> whether the method sweeps it; default: the
    #   registry's MethodSpec.axes names it
    column: str | None = None  # the report table's column header where the table shows it beside the label (only
    #   where some run has a value)
    order: Callable | None = None  # its sort key of a value (default: None first, then by value)
    load: bool = False  # set by a serving run's load point (config load:): the serving figures run across it
    set_by: str | None = None  # a comparison axis whose values another axis's `values` sets with its own

    def swept(self, config, context=None) -> list:
        """A point axis's values for a method (context: its MethodSpec); a comparison axis's, as dicts (context: the
        requests per load point)."""
        if self.values is not None:
            return list(self.values(config, context))
        found = _lookup(config, self.config)
        values = list(self.default) if found is None else list(found) if isinstance(found, (list, tuple)) else [found]
        return values if self.splits == POINT else [{self.name: value} for value in values]

    def applies_to(self, spec) -> bool:
        return self.applies(spec) if self.applies is not None else self.name in spec.axes

    def text(self, value, values: dict) -> str | None:
        if callable(self.label):
            return self.label(value, values)
        return None if value is None else self.label.format(value)

    def key(self, value) -> tuple:
        if self.order is not None:
            return self.order(value)
        if value is None:
            return (False, ())
        # numbers by value whatever their type (an int 1 before a float 1.5), other values by type, then value
        return (True, (0, value) if isinstance(value, (int, float)) else (1, str(type(value)), value))


def _lookup(config, path: str):
    node = config
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node


def _drafts(config, spec) -> list:
    return [d.name for d in config.draft if d.kind in spec.draft_kinds]


def _batch_sizes(config, requests) -> list[dict]:
    return [{}] if getattr(config, "load", None) is not None else [{"batch_size": b} for b in config.batch_size]


def _load_points(config, requests) -> list[dict]:
    """A serving run's load points: its batch size is the most rows that can be in flight, min(concurrency,
    `requests`: a load point's requests), at which its costs are probed and kept; the concurrency stays as
    configured (its label)."""
    if getattr(config, "load", None) is None:
        return [{}]
    return [{"concurrency": c, "request_rate": r, "batch_size": c if requests is None else min(c, requests)}
            for c, r in config.load.points(requests or 1)]


def _temperatures(config, requests) -> list[dict]:
    return [{"temperature": t} for t in config.generation.temperatures()]


AXES: list[Axis] = [
    Axis("method", POINT, "methods", "{}", "the method (decode/methods registry; the plan goes method by method)"),
    Axis("draft", POINT, "draft", "draft={}", "the draft's label (config draft[i].label), for methods with a draft",
         values=_drafts),
    Axis("gamma", POINT, "speculative.gamma", "gamma={}", "the most draft tokens per round (a static tree: its depth)"),
    Axis("tree", POINT, "speculative.tree", "tree={}", "the token tree (decode/tree_layout.py): 3-2-1-1, dynamic-24, "
         "auto; None: a chain", column="tree"),
    Axis("schedule", POINT, "speculative.schedule", "{}",
         "the draft-length schedule: constant, heuristic, confidence, cost_model or recommended (a chain's)"),
    Axis("draft_context", POINT, "speculative.draft_context", "ctx={}",
         "the draft model's window: it is prefilled with the prompt's last N tokens; None: the whole prompt",
         default=(None,)),
    Axis("exit_layer", POINT, "speculative.exit_layer", "exit={}", "early_exit: the target's layers that draft"),
    Axis("synthetic_acceptance", POINT, "speculative.synthetic_acceptance", "synthetic={}",
         "the set alpha of a synthetic point (decode/sampling.py accept_synthetic); None: the real acceptance",
         column="synthetic"),
    Axis("batch_size", COMPARISON, "batch_size", lambda v, values: None if v is None or values.get("concurrency") is not None
         else f"batch={v}", "prompts per batch; a serving point's most requests in flight, min(concurrency, its requests)",
         values=_batch_sizes, load=True),
    Axis("concurrency", COMPARISON, "load.concurrency", "conc={}",
         "a serving point's cap on requests in flight (config load:); None: a fixed batch", values=_load_points,
         load=True),
    Axis("request_rate", COMPARISON, "load.request_rate", "rate={}/s",
         "a serving point's arrivals per second; None: all at once", set_by="concurrency", load=True,
         order=lambda v: (v is None, v if v is not None else math.inf)),
    Axis("temperature", COMPARISON, "generation.temperature",
         lambda v, values: "greedy" if v is None else f"T={v}", "None: greedy; a float: sampling at it",
         values=_temperatures),
]


def names() -> tuple[str, ...]:
    return tuple(axis.name for axis in AXES)


def comparison_axes() -> list[Axis]:
    return [axis for axis in AXES if axis.splits == COMPARISON]


def point_axes() -> list[Axis]:
    """The point axes besides the method."""
    return [axis for axis in AXES if axis.splits == POINT and axis.name != "method"]


def axis(name: str) -> Axis:
    return next(a for a in AXES if a.name == name)


def label_of(values: dict, axes: list[Axis] | None = None) -> str:
    """A point's (or a comparison's) label: the text of each axis `values` has (None included), in table order."""
    parts = [axis.text(values[axis.name], values) for axis in (AXES if axes is None else axes) if axis.name in values]
    return " ".join(p for p in parts if p)


def sort_key(values: dict, axes: list[Axis]) -> tuple:
    return tuple(axis.key(values.get(axis.name)) for axis in axes)


def doc_table() -> str:
    """The table as docs/methods.md shows it (a test keeps the two equal)."""
    rows = ["| axis | splits | config | in a label | what a value means |", "|---|---|---|---|---|"]
    for axis in AXES:
        value = _EXAMPLE.get(axis.name, 1)
        rows.append(f"| `{axis.name}` | {axis.splits} | `{axis.config}` | `{axis.text(value, {axis.name: value})}` | "
                    f"{axis.doc} |")
    return "\n".join(rows) + "\n"


_EXAMPLE = {"method": "speculative", "draft": "small", "gamma": 4, "schedule": "heuristic", "tree": "3-2-1",
            "draft_context": 64, "exit_layer": 8, "synthetic_acceptance": 0.8, "batch_size": 4, "concurrency": 4,
            "request_rate": 2.0, "temperature": 0.7}


@contextmanager
def declared(*new: Axis):
    """The table with `new` axes added while the block runs (a test's toy axis; a plugin's own axis)."""
    known = set(names())
    clash = [a.name for a in new if a.name in known]
    if clash:
        raise ValueError(f"axis {clash[0]} is declared already")
    AXES.extend(new)
    try:
        yield new
    finally:
        for added in new:
            AXES.remove(added)
