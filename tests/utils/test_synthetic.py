"""Synthetic pairs built from a config: the draft's agreement with the target is controlled."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from helpers import write_prompts
from utils.synthetic import build_model, parse

ROOT = Path(__file__).resolve().parents[2]


def test_draft_is_the_targets_first_layers():
    target, tokenizer = build_model("synthetic:llama-tiny", torch.float32, "sdpa")
    draft, _ = build_model("synthetic:llama-tiny?layers=2", torch.float32, "sdpa")
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    ids = tokenizer("def f(x): return x")["input_ids"]
    assert tokenizer.decode(ids) == "def f(x): return x" and max(ids) < target.config.vocab_size


def acceptance(draft_spec: str) -> float:
    target, tokenizer = build_model("synthetic:llama-tiny", torch.float32, "sdpa")
    draft, _ = build_model(draft_spec, torch.float32, "sdpa")
    ids = torch.tensor([tokenizer("The quick brown fox jumps")["input_ids"]] * 2)
    generation = Generation(max_new_tokens=40)
    with torch.inference_mode():
        base = generate_baseline(target, ids, torch.ones_like(ids), generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, 512, Sampling()), ids, torch.ones_like(ids),
                                    generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    rounds = [r for s in spec for r in s.rounds]
    return sum(r["accepted"] for r in rounds) / sum(r["drafted"] for r in rounds)


def test_agreement_is_controlled_by_depth_and_noise():
    full = acceptance("synthetic:llama-tiny?layers=4")
    assert full == 1.0  # all layers and no noise: the draft is the target
    shallow, noisy = acceptance("synthetic:llama-tiny?layers=1"), acceptance("synthetic:llama-tiny?layers=4&noise=2.0")
    assert shallow < 1.0 and noisy < 1.0


@pytest.mark.parametrize("spec, fragment", [("synthetic:llama-9b", "unknown synthetic model"),
                                            ("synthetic:llama-tiny?layers=9", "outside"),
                                            ("synthetic:llama-tiny?depth=2", "unknown synthetic parameter")])
def test_bad_synthetic_specs(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse(spec)


@pytest.mark.e2e
def test_synthetic_pair_in_a_run(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", count=3)
    config = {"name": "synthetic", "device": "cpu", "target": {"model": "synthetic:llama-tiny"},
              "draft": {"model": "synthetic:llama-tiny?layers=2"},
              "dataset": {"path": str(data), "preset": "none", "prompt_field": "text"},
              "generation": {"max_new_tokens": 16}, "speculative": {"gamma": [3]}, "batch_size": [1, 3]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    runs = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    assert all(r["metrics"]["exact_match"] == 1.0 for r in runs)
    bad = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--set",
                          "draft.model=synthetic:llama-9b"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "draft.model" in bad.stderr and "Traceback" not in bad.stderr
