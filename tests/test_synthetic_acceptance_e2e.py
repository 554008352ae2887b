"""speculative.synthetic_acceptance end to end through launch.py on tiny models: the estimated alpha against the set
one, the point marked synthetic in every file, no exact match claimed, strict JSON; and each refusal as one line
with exit code 2."""
import csv
import json
import math

import pytest
import yaml

from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, write_prompts
from utils.config import ConfigError, validate
from utils.io import read_jsonl

pytestmark = pytest.mark.e2e
VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


def no_constant(name):
    raise ValueError(f"not strict JSON: {name}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    target, draft = save_tiny_pair(root)
    return root, base_config(target, draft, write_prompts(root / "prompts.jsonl", count=16))


@pytest.fixture(scope="module")
def synthetic_run(tiny):
    root, config = tiny
    config = {**config, "batch_size": [1], "generation": {"max_new_tokens": 32},
              "speculative": {"gamma": [4], "synthetic_acceptance": [0.7]}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    out = root / "report"
    result = run_launch(["--config", root / "config.yaml", "--output-dir", out], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_alpha_is_estimated_near_the_set_one(synthetic_run):
    samples = read_jsonl(synthetic_run / "samples.jsonl")
    synthetic = [s for s in samples if s["method"] == "speculative"]
    assert len(synthetic) == 16 and all(s["synthetic_acceptance"] == 0.7 for s in synthetic)
    assert all(s["synthetic_acceptance"] is None for s in samples if s["method"] == "baseline")
    rounds = [r for s in synthetic for r in s["rounds"] if r["drafted"] > 0]
    summary = json.loads((synthetic_run / "summary.json").read_text(), parse_constant=no_constant)
    run = next(r for r in summary["runs"] if r["method"] == "speculative")
    metrics = run["metrics"]
    alpha = metrics["alpha"]
    assert abs(alpha - 0.7) <= 0.06
    # the estimate solves sum_r alpha (1 - alpha^g_r) / (1 - alpha) = sum_r a_r, the closed form written out here
    expected = sum(alpha * (1 - alpha ** r["drafted"]) / (1 - alpha) for r in rounds)
    assert math.isclose(expected, sum(r["accepted"] for r in rounds), rel_tol=1e-6)
    low, high = metrics["alpha_ci95"]
    assert low < alpha < high and high - low < 0.2 and metrics["alpha_prompts"] == 16
    assert math.isclose(metrics["alpha_minus_set"], alpha - 0.7)
    assert run["synthetic_acceptance"] == 0.7 and metrics["synthetic"] is True
    assert "synthetic=0.7" in run["label"]
    # the prediction uses the measured alpha, c and v: Leviathan's formula written out
    c, v = metrics["draft_cost_ratio_c"], metrics["verify_cost_ratio_v"]
    assert math.isclose(metrics["predicted_speedup"], (1 - alpha ** 5) / ((1 - alpha) * (4 * c + v)), rel_tol=1e-9)
    assert math.isclose(metrics["efficiency"], metrics["speedup"] / metrics["predicted_speedup"], rel_tol=1e-9)
    assert metrics["predicted_speedup_ci95"][0] < metrics["predicted_speedup"] < metrics["predicted_speedup_ci95"][1]
    assert [x * metrics["predicted_speedup"] for x in metrics["efficiency_ci95"]] == pytest.approx(metrics["speedup_ci95"])


def test_no_exact_match_is_claimed(synthetic_run):
    samples = read_jsonl(synthetic_run / "samples.jsonl")
    base = {s["sample_id"]: s["output_ids"] for s in samples if s["method"] == "baseline"}
    # the outputs are not the target's: some differ from the baseline, and nothing flags it
    assert any(s["output_ids"] != base[s["sample_id"]] for s in samples if s["method"] == "speculative")
    summary = json.loads((synthetic_run / "summary.json").read_text(), parse_constant=no_constant)
    run = next(r for r in summary["runs"] if r["method"] == "speculative")
    assert run["metrics"]["exact_match"] is None and run["metrics"]["mismatches"] is None
    assert "possible_bug" not in {f["code"] for f in run["flags"]}
    assert not any("exact match" in note and "synthetic" in note for note in summary["notes"])
    assert "speculative" not in str(summary["best"])  # a synthetic point is not the method's best


def test_the_report_marks_the_point_synthetic(synthetic_run):
    markdown = (synthetic_run / "summary.md").read_text()
    table = markdown.split("\n\n")[1].splitlines()
    header = [h.strip() for h in table[0].strip("|").split("|")]
    row = next([c.strip() for c in line.strip("|").split("|")] for line in table[2:] if "synthetic=0.7" in line)
    assert row[header.index("synthetic")] == "0.7" and row[header.index("exact")] == "-"
    assert row[header.index("alpha")].count("[") == 1  # the estimate with its interval
    assert "Synthetic acceptance" in markdown and "- synthetic_acceptance:" in markdown
    with open(synthetic_run / "summary.csv") as handle:
        rows = {r["method"]: r for r in csv.DictReader(handle)}
    assert rows["speculative"]["synthetic_acceptance"] == "0.7" and rows["baseline"]["synthetic_acceptance"] == ""
    assert rows["speculative"]["exact_match"] == "" and rows["speculative"]["alpha_ci95"].startswith("[")


@pytest.mark.parametrize("value, fragment", [
    (0, "strictly between 0 and 1"),
    (1, "strictly between 0 and 1"),
    ([0.5, 1.2], "strictly between 0 and 1"),
    ("high", "strictly between 0 and 1"),
    (True, "strictly between 0 and 1"),
    ([0.5, 0.5], "repeats a value"),
    ([], "list is empty"),
])
def test_bad_values_name_the_key(value, fragment):
    with pytest.raises(ConfigError, match="speculative.synthetic_acceptance") as error:
        validate({**VALID, "speculative": {"synthetic_acceptance": value}})
    assert fragment in str(error.value)


def test_values_and_where_they_apply():
    assert validate(VALID).speculative.synthetic_acceptance == [None]
    assert validate({**VALID, "speculative": {"synthetic_acceptance": 0.5}}).speculative.synthetic_acceptance == [0.5]
    both = validate({**VALID, "speculative": {"synthetic_acceptance": [None, 0.9]},
                     "methods": ["baseline", "speculative", "prompt_lookup", "hf_generate"]})
    assert both.speculative.synthetic_acceptance == [None, 0.9]
    for methods, fragment in [(["baseline", "speculative", "hf_assisted"], "hf_assisted has no equivalent"),
                              (["baseline", "hf_assisted_default"], "hf_assisted_default has no equivalent"),
                              (["baseline", "vllm_generate", "vllm_draft"], "vllm_draft has no equivalent"),
                              (["baseline"], "methods has none of them")]:
        with pytest.raises(ConfigError, match=fragment):
            validate({**VALID, "methods": methods, "speculative": {"synthetic_acceptance": 0.5}})
    with pytest.raises(ConfigError, match="not to token trees"):
        validate({**VALID, "speculative": {"synthetic_acceptance": 0.5, "tree": [None, [2, 2]]}})


@pytest.mark.parametrize("speculative, extra, fragment", [
    ({"synthetic_acceptance": [0.5, 1.0]}, {}, "speculative.synthetic_acceptance"),
    ({"synthetic_acceptance": 0.5, "tree": "auto"}, {}, "not to token trees"),
])
def test_launch_refuses_with_one_line(tiny, tmp_path, speculative, extra, fragment):
    _, config = tiny
    config = {**config, **extra, "speculative": {**config["speculative"], **speculative}}
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    assert_one_clean_line(run_launch(["--config", file, "--output-dir", tmp_path / "out"]), fragment)
    assert not (tmp_path / "out").exists()
