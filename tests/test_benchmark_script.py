"""The benchmark scripts run end to end (on tiny models here): the engine bench prints every ratio, the GPU check
runs its CPU part and can fail."""
import json
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


CPU_CHECKS = {"fp32", "bf16", "compiled-fp32", "compiled-bf16", "release"}


def _strict_json(path: Path) -> dict:
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.e2e
def test_gpu_check_runs_its_cpu_part_and_fails_on_a_bug(tmp_path, monkeypatch, capsys):
    """benchmarks/gpu_check.py on a CPU: library versions first, the CPU-possible checks pass (compiled vs eager in fp32
    equal, the bf16 ones through the guard, the release) and the CUDA ones say why they are skipped; --require fails a
    skipped check; a wrong token in the compiled step, or in the engine's greedy acceptance, fails its check."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check
    from decode.static_kv import CompiledModel

    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--compile-backend", "eager", "--json", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("device: cpu") and all(f"{name} " in first for name in gpu_check.LIBRARIES)
    data = _strict_json(out)
    assert set(data["versions"]) == {*gpu_check.LIBRARIES, "CUDA"} and data["versions"]["CUDA"] == "absent"
    rows = {row["key"]: row for row in data["checks"]}
    assert {key for key, row in rows.items() if row["status"] == "ok"} == CPU_CHECKS, rows
    assert all(row["status"] == "skipped" and "CUDA" in row["detail"] for key, row in rows.items()
               if key not in CPU_CHECKS)
    assert "1 of 4 rows ended at the EOS" in rows["compiled-fp32"]["detail"]  # a dead row in the batch

    required = tmp_path / "required.json"
    assert gpu_check.main(["--device", "cpu", "--require", "--only", "cuda-graphs,launch", "--json", str(required)]) == 1
    assert [(r["key"], r["status"]) for r in _strict_json(required)["checks"]] == [("cuda-graphs", "FAIL"),
                                                                                   ("launch", "FAIL")]

    real_run, calls = CompiledModel.run, []

    def one_wrong_token(self, buffers, input_ids, *args, compiled=True, **kwargs):
        """After the warmup, the 5th compiled step of the target: its first row's first position gets another argmax."""
        logits, hidden = real_run(self, buffers, input_ids, *args, compiled=compiled, **kwargs)
        if self.warm and compiled and self.num_layers == 2:
            calls.append(1)
            if len(calls) == 5:
                logits = logits.clone()
                logits[0, 0, (int(logits[0, 0].argmax()) + 1) % logits.shape[-1]] += 1e4
        return logits, hidden

    monkeypatch.setattr(CompiledModel, "run", one_wrong_token)
    status, detail = gpu_check.check_compiled_fp32(gpu_check.Context(torch.device("cpu"), "eager", 600))
    assert status == "FAIL" and "equal to eager" in detail, detail
    monkeypatch.undo()

    import decode.generate as generate
    real = generate.accept_greedy

    def off_by_one(draft_tokens, target_logits, draft_limit):  # accepts one draft too many where a row rejected
        accepted, token = real(draft_tokens, target_logits, draft_limit)
        extra = (accepted < draft_limit) & (accepted < draft_tokens.shape[1])
        bumped = (accepted + extra.long()).clamp(max=draft_tokens.shape[1])
        return bumped, target_logits.argmax(-1).gather(1, bumped[:, None]).squeeze(1)

    monkeypatch.setattr(generate, "accept_greedy", off_by_one)
    assert gpu_check.check_fp32(gpu_check.Context(torch.device("cpu"), "eager", 600))[0] == "FAIL"


def test_gpu_check_imports_no_optional_package():
    """The GPU machine has no pydantic (unless its wheels are carried), bitsandbytes, flash-attn or gguf: importing the
    check must not need them."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_check; "
            "print(sorted(m for m in ('pydantic', 'bitsandbytes', 'flash_attn', 'gguf', 'datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
