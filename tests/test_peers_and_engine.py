"""The peer methods (transformers' generate and assisted generation) and the prepacked CPU engine."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from helpers import base_config, save_tiny_pair, write_prompts
from tiny_models import VOCAB, ragged_batch, tiny_model
from utils.cpu_linear import PackedLinear, pack_linears
from utils.io import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def test_packed_linear_matches_nn_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    packed = PackedLinear(linear, batch_hint=4)
    for shape in [(1, 48), (3, 5, 48), (2, 1, 48)]:
        x = torch.randn(*shape)
        assert torch.allclose(packed(x), linear(x), atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_greedy_stays_exact_on_the_packed_engine(arch):
    target, draft = tiny_model(arch, seed=1, layers=3), tiny_model(arch, seed=2, layers=1)
    ids, mask = ragged_batch([4, 9, 2, 6])
    generation = Generation(max_new_tokens=20)
    with torch.inference_mode():
        reference = generate_baseline(target, ids, mask, generation)
        assert pack_linears(target) > 0 and pack_linears(draft) > 0
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base] == [r.output_ids for r in reference]


@pytest.mark.e2e
def test_peer_methods_in_a_run(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    data = write_prompts(tmp_path / "prompts.jsonl", count=4)
    config = base_config(target, draft, data, methods=["baseline", "speculative", "hf_generate", "hf_assisted",
                                                       "hf_assisted_default", "hf_prompt_lookup"],
                         batch_size=[1, 2], speculative={"gamma": [2]})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    runs = {(r["method"], r["gamma"], r["batch_size"]): r for r in summary["runs"] if r.get("group") is None}
    for key in [("hf_generate", None, 1), ("hf_assisted", 2, 1), ("hf_generate", None, 2), ("hf_assisted_default", None, 1),
                ("hf_prompt_lookup", 2, 1)]:
        assert runs[key]["status"] == "ok"
        # transformers' own greedy decoding agrees with our baseline, token for token
        assert runs[key]["metrics"]["exact_match"] == 1.0, key
    assert runs[("hf_assisted", 2, 2)]["status"] == "skipped"
    assert "batch size 1" in runs[("hf_assisted", 2, 2)]["error"]
    assert any("oneDNN prepacked linear" in n for n in summary["notes"])
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert {s["method"] for s in samples} == {"baseline", "speculative", "hf_generate", "hf_assisted",
                                              "hf_assisted_default", "hf_prompt_lookup"}

