"""launch.py end to end on tiny models: every report file, and every figure recomputed from samples."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.metrics import summarize
from helpers import base_config, save_tiny_pair, write_prompts
from utils.io import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def launch(*args, cwd=ROOT, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target, draft = save_tiny_pair(root)
    data = write_prompts(root / "prompts.jsonl", count=5)
    return root, target, draft, data


@pytest.fixture(scope="module")
def sweep_run(tiny):
    root, target, draft, data = tiny
    config = root / "sweep.yaml"
    config.write_text(yaml.safe_dump(base_config(target, draft, data)))
    out = root / "report"
    result = launch("--config", config, "--output-dir", out, "--set", "speculative.gamma=[1,2,4]", "--set", "repeats=2")
    return result, out


def test_sweep_writes_every_file(sweep_run):
    result, out = sweep_run
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(out)
    for name in ["config.yaml", "env.json", "samples.jsonl", "summary.json", "summary.csv", "summary.md",
                 "speedup.png", "acceptance_rate.png", "block_efficiency.png"]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert yaml.safe_load((out / "config.yaml").read_text())["speculative"]["gamma"] == [1, 2, 4]
    env = json.loads((out / "env.json").read_text())
    assert env["torch"] and env["transformers"] and env["device"] == "cpu"
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_samples_follow_the_contract(sweep_run):
    _, out = sweep_run
    samples = read_jsonl(out / "samples.jsonl")
    # 5 prompts x (baseline + 3 gammas) x 2 batch sizes x 2 repeats
    assert len(samples) == 5 * 4 * 2 * 2
    for s in samples:
        assert {"sample_id", "method", "gamma", "batch_size", "output_ids", "new_tokens", "latency_s"} <= set(s)
        assert s["new_tokens"] == len(s["output_ids"]) and 1 <= s["new_tokens"] <= 12
        if s["method"] == "speculative":
            assert s["rounds"] and all(set(r) >= {"drafted", "accepted"} for r in s["rounds"])
            assert all(0 <= r["accepted"] <= r["drafted"] <= s["gamma"] for r in s["rounds"])
    base = {(s["batch_size"], s["repeat"], s["sample_id"]): s["output_ids"] for s in samples if s["method"] == "baseline"}
    for s in samples:  # greedy speculative output equals the baseline's, token for token
        assert s["output_ids"] == base[(s["batch_size"], s["repeat"], s["sample_id"])]


def test_summary_is_recomputed_from_samples(sweep_run):
    _, out = sweep_run
    summary = json.loads((out / "summary.json").read_text())
    progress = json.loads((out / "progress.json").read_text())
    again = summarize(read_jsonl(out / "samples.jsonl"), progress["failures"], progress["costs"], greedy=True)
    assert json.loads(json.dumps(again["runs"])) == summary["runs"]
    runs = {(r["method"], r["gamma"], r["batch_size"]): r["metrics"] for r in summary["runs"]}
    assert len(runs) == 8
    for (method, gamma, batch), m in runs.items():
        for key in ["latency_s", "throughput_tok_s", "block_efficiency", "mean_accepted_tokens", "speedup", "exact_match"]:
            assert m.get(key) is not None, (method, gamma, batch, key)
        assert m["exact_match"] == 1.0
        assert len(m["throughput_tok_s_repeats"]) == 2
        if method == "speculative":
            assert 0 <= m["acceptance_rate"] <= 1
            assert 1 <= m["block_efficiency"] <= gamma + 1
            assert len(m["per_position_acceptance"]) == gamma
            for key in ["alpha", "draft_cost_ratio_c", "verify_cost_ratio_v", "predicted_speedup", "efficiency"]:
                assert m[key] > 0 or key == "alpha", key
        else:
            assert m["speedup"] == 1.0 and m["block_efficiency"] == 1.0
    assert set(summary["best"]) == {"1", "3"}
    with open(out / "summary.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 8
    assert "| speculative | 4 | 3 |" in (out / "summary.md").read_text()


def test_seed_style_flat_config(tiny, tmp_path):
    _, target, draft, data = tiny
    flat = {"draft_model": str(draft), "target_model": str(target), "k": 2, "max_new_tokens": 6, "max_length": 64,
            "num_samples": 2, "dataset": {"path": str(data)}, "batch_size": 2, "device": "cpu", "quantized": False,
            "summary_file_name": "seed_summary.json"}
    config = tmp_path / "flat.yaml"
    # a flat config names no prompt field: the preset-less local file needs one, given by --set
    config.write_text(yaml.safe_dump(flat))
    result = launch("--config", config, "--output-dir", tmp_path / "out", "--set", "dataset.prompt_field=text",
                    "--set", "dataset.chat_template=false")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "seed_summary.json").read_text())
    assert {(r["method"], r["gamma"], r["batch_size"]) for r in summary["runs"]} == {("baseline", None, 2), ("speculative", 2, 2)}
    saved = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert saved["dataset"]["max_prompt_tokens"] == 58 and saved["dataset"]["num_samples"] == 2


SHARED = ROOT.parent / "shared" / "data"


@pytest.mark.parametrize("preset, file", [("gsm8k", "gsm8k_test.jsonl"), ("mt_bench", "mt_bench_question.jsonl")])
def test_presets_on_the_shared_data(tiny, tmp_path, preset, file):
    if not (SHARED / file).exists():
        pytest.skip("../shared/data is absent (a clone outside this workplace)")
    _, target, draft, _ = tiny
    config = base_config(target, draft, SHARED / file, batch_size=[2], speculative={"gamma": [2]})
    config["dataset"] = {"path": str(SHARED / file), "preset": preset, "num_samples": 3, "chat_template": "auto",
                         "max_prompt_tokens": 20}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = launch("--config", path, "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert summary["prompts"]["count"] == 3 and summary["prompts"]["truncated"] >= 1
    assert all(s["prompt_tokens"] <= 20 for s in samples)
    if preset == "gsm8k":
        assert all(s["reference"] and "####" in s["reference"] for s in samples)
        assert all(0.0 <= r["metrics"]["accuracy"] <= 1.0 for r in summary["runs"])
    else:
        assert all("accuracy" not in r["metrics"] for r in summary["runs"])
