"""Axes are declared once (eval/axes.py). A toy point axis and a toy comparison axis, declared here and nowhere else,
reach the plan, the records, the summary and the report's table; the table itself agrees with the config schema and
the method registry."""
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import BaseModel
from decode.methods import REGISTRY
from eval.axes import AXES, COMPARISON, POINT, Axis, declared, doc_table, point_axes
from eval.records import Comparison, Point, SampleRecord, batch_key
from eval.report import csv_text, markdown
from eval.summary import summarize
from runner.plan import comparisons, points_of, units_of
from runner.records import record_of
from utils.config import Config, validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"},
         "methods": ["baseline", "speculative"], "speculative": {"gamma": [2]}}
# a point axis that only speculative sweeps, and a comparison axis; neither has a config field, so each sweeps its
# default
FLAVOUR = Axis("flavour", POINT, "speculative.flavour", "flavour={}", "a test's point axis", default=("x", "y"),
               applies=lambda spec: spec.name == "speculative", column="flavour")
SHADE = Axis("shade", COMPARISON, "generation.shade", "shade={}", "a test's comparison axis", default=(1, 2))
PROMPTS = 8
# seconds per 4-token row: the baseline's at shade 1 and 2, speculative's per flavour (the same at both shades); the
# speedups are then 2 / 1 = 2 and 2 / 0.5 = 4 at shade 1, 4 / 1 = 4 and 4 / 0.5 = 8 at shade 2
BASELINE_S, SPECULATIVE_S = {1: 2.0, 2: 4.0}, {"x": 1.0, "y": 0.5}


def _records(config) -> list[dict]:
    """Every point of every comparison on every unit, built by the runner's record builder from a measured row."""
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: "")
    rows = []
    for comparison in comparisons(config):
        for unit in units_of(comparison, PROMPTS, 0):
            prompt = SimpleNamespace(sample_id=unit.batch_index, group=None, token_ids=[1, 2, 3], reference=None)
            for point in points_of(config, comparison):
                spec = REGISTRY[point.method]
                seconds = SPECULATIVE_S[point.flavour] if spec.has_rounds else BASELINE_S[point.shade]
                measured = SimpleNamespace(
                    output_ids=[5, 6, 7, 8], new_tokens=4, stop_reason="length", latency_s=seconds, prefill_s=0.1,
                    target_forwards=2 if spec.has_rounds else 4, draft_forwards=2, target_s=seconds, draft_s=0.0,
                    draft_prefill_s=0.0, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}])
                rows.append(record_of(point, unit, prompt, measured, tokenizer, "none", spec.has_rounds, 1))
    return rows


def test_a_toy_axis_reaches_the_plan_the_records_the_summary_and_the_table():
    before = [axis.name for axis in AXES]
    with declared(FLAVOUR, SHADE):
        config = validate(VALID)
        assert [c.label for c in comparisons(config)] == ["batch=1 greedy shade=1", "batch=1 greedy shade=2"]
        first = comparisons(config)[0]
        assert [p.label for p in points_of(config, first)] == [
            "baseline batch=1 greedy shade=1", "speculative draft=d gamma=2 constant batch=1 greedy flavour=x shade=1",
            "speculative draft=d gamma=2 constant batch=1 greedy flavour=y shade=1"]
        assert units_of(first, PROMPTS, 0)[3].label == "batch=1 greedy shade=1 repeat=0 batch#3"

        rows = _records(config)
        assert len(rows) == 2 * 3 * PROMPTS
        spec_row = next(r for r in rows if r["method"] == "speculative" and r["flavour"] == "y" and r["shade"] == 2)
        assert SampleRecord.from_json(spec_row).flavour == "y" and Point.of(spec_row).comparison == Comparison(
            batch_size=1, shade=2)
        assert len({batch_key(r) for r in rows}) == len(rows)  # resume tells every point's batches apart

        summary = summarize(rows, {})
        speedups = {(r["flavour"], r["shade"]): r["metrics"]["speedup"] for r in summary["runs"]
                    if r["method"] == "speculative"}
        assert speedups == pytest.approx({("x", 1): 2.0, ("y", 1): 4.0, ("x", 2): 4.0, ("y", 2): 8.0})
        best = summary["best"]
        assert set(best) == {"batch=1 greedy shade=1", "batch=1 greedy shade=2"}
        assert best["batch=1 greedy shade=2"]["speculative"]["label"].endswith("flavour=y shade=2")

        table = markdown(summary)
        header = next(line for line in table.splitlines() if line.startswith("| point"))
        assert header.startswith("| point | status | flavour | tok/s")
        row = next(line for line in table.splitlines() if "flavour=x shade=2" in line)
        assert row.split(" | ")[2] == "x"
        columns = csv_text(summary).splitlines()[0].split(",")
        assert {"flavour", "shade"} <= set(columns)
    assert [axis.name for axis in AXES] == before


def test_the_table_agrees_with_the_registry_and_the_config_schema():
    declared_point_axes = {axis.name for axis in point_axes()}
    for spec in REGISTRY.values():
        assert set(spec.axes) <= declared_point_axes, f"{spec.name} sweeps an undeclared axis"
    for axis in AXES:  # each axis's config path is a field of the schema
        model = Config
        for part in axis.config.split("."):
            assert model is not None and part in model.model_fields, f"axis {axis.name}: no config field {axis.config}"
            model = _model_of(model.model_fields[part].annotation)
    with pytest.raises(ValueError, match="declared already"):
        with declared(Axis("gamma", POINT, "speculative.gamma", "g={}", "again")):
            pass


def test_the_docs_show_the_table():
    text = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text()
    assert doc_table() in text, "docs/methods.md's sweep axes table is stale: paste eval/axes.py doc_table() there"


def _model_of(annotation):
    """The pydantic model a field holds (through Optional and list), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_of, typing.get_args(annotation)) if m is not None), None)


def test_the_summary_order_puts_a_methods_chains_before_its_trees_and_numbers_by_value():
    from eval.summary import point_order

    def point(**axes):
        return Point(method="speculative", draft="d", batch_size=1, **axes)

    expected = [Point(method="baseline", batch_size=1),
                point(gamma=2, schedule="constant"), point(gamma=2, schedule="constant", synthetic_acceptance=0.5),
                point(gamma=2, schedule="heuristic"), point(gamma=2, tree="2-1"), point(gamma=2, tree="dynamic-8"),
                point(gamma=4, schedule="constant"), point(gamma=4, tree="dynamic-8"),
                # sampling after greedy, temperatures by value whatever their type: 1 (an int) between 0.7 and 1.5
                point(gamma=2, schedule="constant", temperature=0.7), point(gamma=2, schedule="constant", temperature=1),
                point(gamma=2, schedule="constant", temperature=1.5)]
    assert sorted(reversed(expected), key=point_order) == expected
    assert sorted(expected[::2] + expected[1::2], key=point_order) == expected
