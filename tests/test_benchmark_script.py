"""The benchmark script runs end to end (on tiny models here) and prints every ratio."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
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


@pytest.mark.e2e
def test_gpu_check_runs_its_cpu_part_and_fails_on_a_bug(tmp_path, monkeypatch):
    """benchmarks/gpu_check.py on a CPU: the CPU-possible checks pass and the CUDA ones say why they are skipped;
    with the engine's greedy acceptance broken, the exactness checks fail and the exit code says so."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import json

    import gpu_check

    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--compile-backend", "eager", "--json", str(out)]) == 0
    rows = {row["check"]: row for row in json.loads(out.read_text())["checks"]}
    assert {label for label, row in rows.items() if row["status"] == "ok"} == {
        "greedy exact, fp32", "greedy exact, bf16 (guard)", "compiled vs eager"}
    assert all(row["status"] == "skipped" and "CUDA" in row["detail"] for label, row in rows.items()
               if label not in ("greedy exact, fp32", "greedy exact, bf16 (guard)", "compiled vs eager"))

    import decode.generate as generate
    real = generate.accept_greedy

    def off_by_one(draft_tokens, target_logits, draft_limit):  # accepts one draft too many where a row rejected
        accepted, token = real(draft_tokens, target_logits, draft_limit)
        extra = (accepted < draft_limit) & (accepted < draft_tokens.shape[1])
        bumped = (accepted + extra.long()).clamp(max=draft_tokens.shape[1])
        return bumped, target_logits.argmax(-1).gather(1, bumped[:, None]).squeeze(1)

    monkeypatch.setattr(generate, "accept_greedy", off_by_one)
    assert gpu_check.check_fp32(torch.device("cpu"))[0] == "FAIL"
