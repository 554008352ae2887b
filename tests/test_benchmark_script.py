"""The benchmark script runs end to end (on tiny models here) and prints every ratio."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import base_config, save_tiny_pair, write_prompts

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_benchmark_prints_the_ratio_table(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    data = write_prompts(tmp_path / "prompts.jsonl", count=4)
    config = base_config(target, draft, data, methods=["baseline", "speculative", "hf_generate", "hf_assisted"],
                         batch_size=[1, 4], speculative={"gamma": [2, 3]}, engine={"cpu_linear": "onednn_packed"})
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_bench.py"), "--config", str(path),
                             "--plain-gamma", "2", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "out" / "BENCH.md").read_text()
    assert text in result.stdout
    for label in ["our baseline / hf_generate", "our speculative / hf_assisted", "measured / predicted",
                  "batched speculative / batched baseline", "packed tok/s"]:
        assert label in text
    assert text.count("| baseline, batch") == 2 and "| speculative gamma 2, batch 4 |" in text
