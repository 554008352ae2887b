"""The peer methods (decode/methods/hf.py: transformers' generate, assisted generation and prompt lookup) in a run:
greedy output equal to our baseline's, token for token."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import base_config, save_tiny_pair, write_prompts
from utils.io import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


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

