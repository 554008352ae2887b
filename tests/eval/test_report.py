"""The report files: strict JSON, the tables' cells (CI, '!' for flagged, partial counts), the per-group tables,
every plot, and `python -m eval DIR` rebuilding the same summary.json."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.groups import natural
from eval.summary import summarize
from eval.figure_table import Column, columns
from eval.report import cell, csv_text, markdown, write_report
from sample_records import SPEC_LABEL, costs, paired_run, record, run
from utils.io import write_json

ROOT = Path(__file__).resolve().parents[2]


def refuse(constant):
    raise ValueError(f"{constant} is not strict JSON")


def speedup_cell(r):
    return cell(r, next(c for c in columns() if c.paths == ("speedup",)))


def sweep() -> tuple[list[dict], dict]:
    """Two groups, two gammas (gamma 4 partial), transformers' generate as a method without gamma."""
    samples = []
    for i, group in enumerate("aabb"):
        samples.append(record("baseline", i, i, tokens=4, latency=2.0, group=group))
        samples.append(record("speculative", i, i, tokens=4, latency=1.0, group=group,
                              rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]))
        samples.append(record("hf_generate", i, i, tokens=4, latency=1.8, group=group, prefill=None,
                              target_forwards=None))
        if i < 3:
            samples.append(record("speculative", i, i, tokens=4, latency=0.8, gamma=4, group=group,
                                  rounds=[{"drafted": 3, "accepted": 3, "emitted": 4}]))
    progress = {"group_by": "category", "status": "finished", "order": "fixed", "notes": ["from the runner"],
                "planned": {SPEC_LABEL: 4, "speculative draft=d gamma=4 constant batch=1 greedy": 4},
                "costs": costs(0.25, {"2": 1.5, "4": 2.0}),
                "drift": {"1": {"p1": [0.1, 0.1]}},
                "numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 3e-5, "dtype": "float32"}, "drafts": {}}}
    return samples, progress


# ---- strict JSON ----------------------------------------------------------------------------------------

def test_write_json_refuses_nan_and_says_where(tmp_path):
    with pytest.raises(ValueError, match=r"runs\[0\]\.speedup"):
        write_json(tmp_path / "x.json", {"runs": [{"speedup": float("nan")}]})
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("rounds, tokens", [([], 1), ([{"drafted": 0, "accepted": 0, "emitted": 1}], 2)])
def test_summaries_without_rounds_are_strict_json(tmp_path, rounds, tokens):
    # max_new_tokens 1 (no round) and 2 (one round with no budget to draft)
    samples = [record("baseline", 0, 0, tokens=tokens), record("speculative", 0, 0, tokens=tokens, rounds=rounds)]
    summary = summarize(samples, {"costs": costs(0.3, {"2": 1.2})})
    write_report(tmp_path, summary, "t", with_plots=False)
    written = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert run(written, "speculative")["metrics"]["alpha"] is None
    assert "nan" not in (tmp_path / "summary.md").read_text().lower()


def test_a_nan_from_progress_becomes_null_and_a_note():
    summary = summarize(paired_run(units=2), {"costs": costs(float("nan"), {"2": 1.2})})
    json.loads(json.dumps(summary, allow_nan=False), parse_constant=refuse)
    assert run(summary, "speculative")["metrics"]["draft_cost_ratio_c"] is None
    assert any("not a number" in n and "draft_cost_ratio_c" in n for n in summary["notes"])


# ---- tables -----------------------------------------------------------------------------------------------

def test_cells_show_the_interval_the_flag_and_partial_counts():
    summary = summarize(paired_run(units=8), {"planned": {SPEC_LABEL: 9}})
    spec = run(summary, "speculative")
    assert speedup_cell(spec) == "2.00 [2.00, 2.00]"
    assert cell(spec, Column("status", ("status",), "{}")) == "partial 8/9"
    flagged = summarize(paired_run(units=8, jitter=0.5), {})
    assert speedup_cell(run(flagged, "speculative")).endswith("] !")
    one = summarize(paired_run(units=1), {})
    assert speedup_cell(run(one, "speculative")) == "2.00 (n=1) !"  # no interval: how many prompts, flagged


def test_a_label_with_a_pipe_keeps_the_table_whole():
    samples = [dict(s, draft="a|b") for s in paired_run(units=8)]
    text = markdown(summarize(samples, {}), "t")
    row = next(line for line in text.splitlines() if line.startswith("| speculative"))
    assert row.startswith("| speculative draft=a\\|b gamma=2 constant batch=1 greedy | ok |")
    header = next(line for line in text.splitlines() if line.startswith("| point"))
    assert row.replace("\\|", "").count("|") == header.count("|")


def test_markdown_has_a_table_per_group_best_notes_and_legend():
    samples, progress = sweep()
    progress["drift"] = {"1": {"p1": [0.1, 0.2]}}  # everything flagged drift
    summary = summarize(samples, progress)
    text = markdown(summary, "title")
    assert "## category: a" in text and "## category: b" in text
    assert f"| {SPEC_LABEL} | ok | " in text
    assert "| speculative draft=d gamma=4 constant batch=1 greedy | partial 3/4 |" in text
    assert "! = flagged" in text and "(flagged: few_samples, drift)" in text  # 4 prompts, and the probe moved
    assert "- from the runner" in text and "order: fixed" in text
    assert "- speedup_ci95: 95% paired bootstrap CI" in text and "- flags:" in text
    lines = csv_text(summary).splitlines()
    assert len(lines) == 1 + len(summary["runs"]) and "drift" in lines[2]


# ---- plots and the rebuild ---------------------------------------------------------------------------------

def test_every_plot_is_written(tmp_path):
    samples, progress = sweep()
    summary = summarize(samples, progress)
    assert run(summary, "speculative", gamma=4)["status"] == "partial"
    assert run(summary, "hf_generate")["metrics"]["speedup"] == pytest.approx(2.0 / 1.8)
    write_report(tmp_path, summary, "t")
    for name in ["speedup.png", "acceptance_rate.png", "block_efficiency.png", "methods.png", "speedup_by_group.png"]:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG", name


def test_eval_rebuilds_the_same_summary(tmp_path):
    samples, progress = sweep()
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "constructed"}))
    write_report(tmp_path, summarize(samples, progress), "constructed", with_plots=False)  # what the run wrote
    before = (tmp_path / "summary.json").read_bytes()
    result = subprocess.run([sys.executable, "-m", "eval", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "summary.json").read_bytes() == before  # bootstrap included: seeded
    assert json.loads(before) == json.loads(json.dumps(summarize(samples, progress)))
    assert (tmp_path / "summary.md").read_text().startswith("# constructed")
    assert (tmp_path / "methods.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_keeps_the_runs_choice_of_no_plots(tmp_path):
    samples, progress = sweep()
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "constructed", "report": {"plots": False}}))
    result = subprocess.run([sys.executable, "-m", "eval", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "summary.md").is_file() and not list(tmp_path.glob("*.png"))


def test_eval_does_not_load_the_engine():
    # python -m eval rebuilds figures from records: the registry it reads must not import torch
    code = "import sys, eval.__main__; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_point_without_an_interval_draws_no_error_bar():
    # two runs: one with an interval, one without (few prompts): the second gets no bar (NaN), not a zero-width one
    # that draws caps at the value as if it were exact
    import math

    from eval.report import _errors
    runs = [{"metrics": {"speedup": 1.5, "speedup_ci95": [1.25, 1.75]}}, {"metrics": {"speedup": 2.0}}]
    lows, highs = _errors(runs, "speedup")
    assert lows[0] == pytest.approx(0.25) and highs[0] == pytest.approx(0.25)
    assert math.isnan(lows[1]) and math.isnan(highs[1])
    assert _errors(runs[1:], "speedup") is None


def test_conversations_get_figures_per_category_and_per_turn():
    """Two conversations of category a (turns 1, 2) and one of b (turn 1 only): runs for a, b, turn 1 and turn 2.
    Turn 1: 3 prompts, baseline 2 s and speculative 1 s each -> speedup 2.0; turn 2 (conversation 0's and 1's):
    baseline 2 s, speculative 0.5 s -> 4.0; category a: 4 prompts, 8 s against 3 s -> 2.667."""
    samples = []
    for i, (conversation, turn, group, spec_latency) in enumerate(
            [(0, 1, "a", 1.0), (1, 1, "a", 1.0), (2, 1, "b", 1.0), (0, 2, "a", 0.5), (1, 2, "a", 0.5)]):
        rounds = [{"drafted": 2, "accepted": 2, "emitted": 3}]
        samples += [record("baseline", i, i, tokens=4, latency=2.0, group=group, conversation=conversation, turn=turn),
                    record("speculative", i, i, tokens=4, latency=spec_latency, group=group, rounds=rounds,
                           conversation=conversation, turn=turn)]
    summary = summarize(samples, {"group_by": "category", "costs": costs(0.3, {"2": 1.2})})
    assert summary["groups"] == ["a", "b", "turn 1", "turn 2"]
    assert summary["group_fields"] == {"a": "category", "b": "category", "turn 1": "turn", "turn 2": "turn"}
    speedup = {g: run(summary, "speculative", g)["metrics"]["speedup"] for g in summary["groups"]}
    assert speedup == pytest.approx({"a": 8 / 3, "b": 2.0, "turn 1": 2.0, "turn 2": 4.0})
    text = markdown(summary)
    assert "## category: a" in text and "## turn 2" in text and "## category: turn" not in text
    assert sorted(["turn 10", "turn 2", "turn 1"], key=natural) == ["turn 1", "turn 2", "turn 10"]
    # 5 batches, 3 conversations: the interval rests on 3 (a conversation's turns are resampled together)
    assert run(summary, "speculative")["batches"]["prompts"] == 3


def test_the_batches_of_one_conversations_turns_are_one_cluster():
    from eval.totals import clusters_of

    # batches 0 and 3 hold conversation 7's turns, batch 3 also conversation 8's, whose other turn is in batch 5;
    # batches 1, 2 and 4 hold prompts of no conversation, or conversation 9 alone
    rows = [(0, 7), (1, None), (2, 9), (3, 7), (3, 8), (4, None), (5, 8)]
    assert clusters_of([{"batch_index": b, "conversation": c} for b, c in rows]) == \
        {0: 0, 1: 1, 2: 2, 3: 0, 4: 3, 5: 0}
    assert clusters_of([{"batch_index": b} for b in (2, 0, 1)]) == {0: 0, 1: 1, 2: 2}  # without: a batch each
