"""The figure table (eval/figure_table.py): a figure declared in one file (tests/eval/toy_figure.py) and registered
is computed where it applies and found in every output: summary.json's metrics and legend, summary.md, summary.csv,
serving.csv and the terminal's tables, for a fixed-batch point and a load point."""
import csv
import io

import pytest
from rich.console import Console

import eval.figure_table as table
from eval.report import csv_text, markdown, print_table
from eval.summary import summarize
from sample_records import paired_run, record
from toy_figure import TOY

SPEC = "speculative draft=d gamma=2 constant batch=1 greedy"


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(table, "FIGURES", list(table.FIGURES))  # the table as it was after the test
    return table.register(TOY)


def served(method, index, rounds=None):
    """A request at concurrency 1 of 5 tokens, the first at 0.5 s, the last at 1.0 s (one at a time)."""
    emits = [[0.5 + 0.125 * k, 1] for k in range(5)]
    return record(method, sample_id=index, batch_size=1, batch_rows=2, tokens=5, latency=1.0, prefill=0.5,
                  rounds=rounds, concurrency=1, request_rate=None, arrival_s=0.0, admitted_s=0.0, first_token_s=0.5,
                  finish_s=1.0, emits=emits)


def load_point() -> list[dict]:
    # two requests each; the speculative ones have 2 rounds, then 1: 3 rounds over 10 tokens
    one = {"drafted": 2, "accepted": 0, "emitted": 1}
    return [served("baseline", i) for i in range(2)] + [served("speculative", 0, [one, one]),
                                                        served("speculative", 1, [one])]


def test_a_registered_figure_is_in_every_output(toy):
    # fixed batches: 8 speculative rows, each 4 tokens in one round: 8 / 32 = 0.25; the baseline has no rounds
    summary = summarize(paired_run(units=8) + load_point(), {})
    static = {r["label"]: r for r in summary["runs"] if r["group"] is None}
    assert static[SPEC]["metrics"]["toy_rounds_per_token"] == pytest.approx(0.25)
    assert "toy_rounds_per_token" not in static["baseline batch=1 greedy"]["metrics"]  # it does not apply
    load = {r["method"]: r for r in summary["serving"]["runs"]}
    assert load["speculative"]["metrics"]["toy_rounds_per_token"] == pytest.approx(0.3)
    assert "toy_rounds_per_token" not in load["baseline"]["metrics"]
    assert summary["legend"]["toy_rounds_per_token"] == TOY.legend

    text = markdown(summary, "t")
    fixed_table = text.split("## Under load")[0]
    assert "| toy r/tok |" in fixed_table and "| 0.250 |" in fixed_table
    serving_header = next(line for line in text.split("## Under load")[1].splitlines() if line.startswith("| point"))
    assert serving_header.endswith("| toy r/tok |")
    assert "| 0.300 |" in text.split("## Under load")[1]

    rows = list(csv.DictReader(io.StringIO(csv_text(summary))))
    assert float(next(r for r in rows if r["label"] == SPEC)["toy_rounds_per_token"]) == pytest.approx(0.25)
    rows = list(csv.DictReader(io.StringIO(csv_text(summary, served=True))))
    assert float(next(r for r in rows if r["method"] == "speculative")["toy_rounds_per_token"]) == pytest.approx(0.3)

    console = Console(record=True, width=400)
    print_table(summary, console)
    terminal = console.export_text()
    assert terminal.count("toy r/tok") == 2 and "0.250" in terminal and "0.300" in terminal


def test_without_the_figure_no_output_has_it():
    summary = summarize(paired_run(units=8) + load_point(), {})
    outputs = [markdown(summary, "t"), csv_text(summary), csv_text(summary, served=True), str(summary)]
    assert not any("toy" in text for text in outputs)


def test_a_name_already_in_the_table_is_refused(toy):
    with pytest.raises(ValueError, match="toy_rounds_per_token"):
        table.register(TOY)


# ---- every legend entry computed, every computed figure in the legend --------------------------------------------

# computed figures no legend text names yet: writing theirs changes the legend of every summary already written
NO_TEXT_YET = {"max_drafted", "output_tokens", "requests", "requests_paired", "span_s"}


def test_every_legend_entry_is_computed_and_every_computed_figure_has_a_legend():
    assert table.uncomputed() == []
    assert set(table.undescribed()) == NO_TEXT_YET


def named(name: str, text: str) -> bool:
    """Whether a legend text names a figure: whole, or as the tail the legend writes after a figure it names or its
    entry's own ('mean_accepted_tokens_pooled / _per_request'; the entry predicted_speedup_replay's '_ci95')."""
    parts = name.split("_")
    return name in text or any("_".join(parts[:i]) in text and "_" + "_".join(parts[i:]) in text
                               for i in range(1, len(parts)))


def test_each_further_figure_an_entry_describes_is_named_in_its_text():
    assert named("mean_accepted_tokens_per_request", "MAT: mean_accepted_tokens_pooled / _per_request")
    assert not named("slo_met", "goodput_req_s: requests meeting every limit")
    assert [(f.name, name) for f in table.FIGURES for name in f.also
            if not named(name, f"{f.name}: {f.legend or ''}")] == []


def test_a_legend_entry_nothing_computes_is_found(monkeypatch):
    monkeypatch.setattr(table, "FIGURES", list(table.FIGURES))
    table.register(table.Figure("toy_unmeasured", legend="toy: a figure no computation gives"))
    assert table.uncomputed() == ["toy_unmeasured"]


def test_a_computed_figure_without_a_legend_is_found(monkeypatch):
    monkeypatch.setattr(table, "FIGURES", list(table.FIGURES))
    table.register(table.Figure("toy_counted", legend="toy: samples counted", gives=("toy_counted", "toy_silent"),
                                static=lambda inputs: {"toy_counted": 1, "toy_silent": 2}))
    assert set(table.undescribed()) == NO_TEXT_YET | {"toy_silent"}


def test_a_computation_that_gives_more_than_its_entry_declares_is_refused(monkeypatch):
    monkeypatch.setattr(table, "FIGURES", list(table.FIGURES))
    table.register(table.Figure("toy_counted", legend="toy: samples counted",
                                static=lambda inputs: {"toy_counted": 1, "toy_silent": 2}))
    with pytest.raises(ValueError, match=r"toy_counted's computation gives \['toy_silent'\]"):
        summarize(paired_run(units=8), {})
