"""An engine outside the tree is its package alone (tests/engines/toy/: its declaration, config section, executor and
worker), found through $SPECULATE_ENGINES as runner/engines' packages are: a run of its methods, its figures from its
own rounds."""
import json
from pathlib import Path

import pytest
import yaml

from helpers import run_launch, write_prompts

ENGINES = Path(__file__).resolve().parents[1] / "engines"


def test_a_toy_engine_in_its_own_package_runs_and_reports(tmp_path):
    config = {"name": "toy", "device": "cpu", "seed": 0, "target": {"model": "smollm2-135m-instruct"},
              "dataset": {"path": str(write_prompts(tmp_path / "prompts.jsonl", 2)), "prompt_field": "text",
                          "chat_template": False},
              "generation": {"max_new_tokens": 7}, "speculative": {"gamma": [2]}, "batch_size": [1], "warmup": 1,
              "methods": ["toy_generate", "toy_pairs"], "toy": {"pairing": "batch"}}
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    result = run_launch(["--config", tmp_path / "toy.yaml", "--out", out], {"SPECULATE_ENGINES": str(ENGINES)})
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {r["method"]: r["metrics"] for r in json.loads((out / "summary.json").read_text())["runs"]}
    # 7 tokens: the prefill's, then 3 steps of 2 (2 drafted, 1 accepted each)
    assert runs["toy_pairs"]["acceptance_rate"] == pytest.approx(3 / 6)
    assert runs["toy_pairs"]["block_efficiency"] == pytest.approx(7 / 4)
    assert runs["toy_pairs"]["exact_match"] == 1.0  # the same count as toy_generate's
    progress = json.loads((out / "progress.json").read_text())
    assert progress["engine_info"]["toy"]["pairing"] == "batch"
