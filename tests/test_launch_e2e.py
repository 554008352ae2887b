"""launch.py end to end on tiny models: every report file, and every figure recomputed from samples."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.summary import summarize
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
        assert s["worker"] is None and s["draft"] in (None, "llama-draft")
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
    again = summarize(read_jsonl(out / "samples.jsonl"), progress)
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
                assert m[key] is not None, key
            # 5 prompts x 2 repeats at batch 1: repeats add no prompts, 5 are too few for an interval
            assert m["speedup_ci95"] is None
        else:
            assert m["speedup"] == 1.0 and m["block_efficiency"] == 1.0
    assert set(summary["best"]) == {"batch=1 greedy", "batch=3 greedy"}
    assert all(set(best) == {"speculative"} for best in summary["best"].values())
    with open(out / "summary.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 8
    assert "| speculative draft=llama-draft gamma=4 constant batch=3 greedy | ok |" in (out / "summary.md").read_text()


def test_report_files_are_strict_json_with_probes_and_memory(sweep_run):
    _, out = sweep_run

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    for name in ["summary.json", "progress.json", "env.json"]:
        json.loads((out / name).read_text(), parse_constant=refuse)
    for line in (out / "samples.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)
    summary = json.loads((out / "summary.json").read_text())
    for role in [summary["numerics"]["target"], summary["numerics"]["drafts"]["llama-draft"]]:
        assert role["verify_vs_stepwise_max_logit_diff"] < 1e-3  # fp32: one forward of many tokens ~ token by token
        assert role["dtype"] == "float32"
    memory = json.loads((out / "progress.json").read_text())["memory"]
    assert memory["peak_rss_bytes"] >= memory["rss_bytes"] > 0 and memory["peak_anon_bytes"] > 0


def test_the_cost_probes_record_each_model_s_weight_bytes(sweep_run):
    _, out = sweep_run
    # fp32 tiny Llamas, width 64, 96 words: 36,992 parameters a layer, untied embedding and head 6,144 each, a final
    # norm of 64, and 64 bytes of rotary buffers. Target 3 layers: 493,376 bytes; draft 1 layer: 197,440 bytes
    probes = [probe for entry in json.loads((out / "progress.json").read_text())["costs"].values()
              for probe in entry.values()]
    assert len(probes) == 2  # batch sizes 1 and 3, one process
    for probe in probes:
        assert probe["target_weight_bytes"] == 493_376 and probe["draft_weight_bytes"] == {"llama-draft": 197_440}
        assert probe["target_busy_s"] is None and probe["draft_busy_s"] == {}  # a CPU: no GPU busy time
    summary = json.loads((out / "summary.json").read_text())
    ratios = [r["metrics"]["weight_bytes_ratio"] for r in summary["runs"] if r["method"] == "speculative"]
    assert len(ratios) == 6 and ratios == [pytest.approx(197_440 / 493_376)] * 6  # 3 gammas x 2 batch sizes


def test_a_piped_run_prints_a_line_per_batch(sweep_run):
    result, _ = sweep_run  # stdout and stderr are pipes here, as in CI logs or under nohup
    lines = [line for line in result.stderr.splitlines() if "tok/s so far" in line]
    # 5 prompts x 4 points at batch 1 + 2 batches x 4 points at batch 3, per repeat
    assert len(lines) == (5 * 4 + 2 * 4) * 2
    assert any("speculative draft=llama-draft gamma=4 constant batch=3 greedy batch 2/2 repeat 1" in line for line in lines)


def test_no_rounds_and_two_tokens_make_a_report(tiny, tmp_path):
    _, target, draft, data = tiny
    for tokens in (1, 2):
        path = tmp_path / f"c{tokens}.yaml"
        path.write_text(yaml.safe_dump(base_config(target, draft, data, generation={"max_new_tokens": tokens},
                                                   batch_size=[1])))
        result = launch("--config", path, "--output-dir", tmp_path / f"out{tokens}")
        assert result.returncode == 0, result.stderr
        json.loads((tmp_path / f"out{tokens}" / "summary.json").read_text(),
                   parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_seed_style_flat_config(tiny, tmp_path):
    _, target, draft, data = tiny
    flat = {"draft_model": str(draft), "target_model": str(target), "k": 2, "max_new_tokens": 6, "max_length": 64,
            "num_samples": 2, "dataset": {"path": str(data)}, "batch_size": 2, "device": "cpu", "quantized": False,
            "summary_file_name": "seed_summary.json"}
    config = tmp_path / "flat.yaml"
    config.write_text(yaml.safe_dump(flat))
    # a flat config names no prompt field: the file's one common prompt column ('text') is guessed
    result = launch("--config", config, "--output-dir", tmp_path / "out", "--set", "dataset.chat_template=false")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "seed_summary.json").read_text())
    assert {(r["method"], r["gamma"], r["batch_size"]) for r in summary["runs"]} == {("baseline", None, 2), ("speculative", 2, 2)}
    assert any("'text' column" in n for n in summary["notes"])
    saved = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert saved["dataset"]["max_prompt_tokens"] == 58 and saved["dataset"]["num_samples"] == 2


SHIPPED = ROOT / "configs" / "data"


@pytest.mark.parametrize("preset, file", [("gsm8k", "gsm8k_test_50.jsonl"), ("mt_bench", "mt_bench_question.jsonl")])
def test_presets_on_the_shipped_data(tiny, tmp_path, preset, file):
    _, target, draft, _ = tiny
    config = base_config(target, draft, SHIPPED / file, batch_size=[1], speculative={"gamma": [2]},
                         generation={"max_new_tokens": 6})
    config["dataset"] = {"path": str(SHIPPED / file), "preset": preset, "num_samples": 4, "chat_template": "auto",
                         "max_prompt_tokens": 20}
    if preset == "mt_bench":  # rows 0-3 are all 'writing': take them across two categories
        config["dataset"].update(group_by="category", num_samples=12)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = launch("--config", path, "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert summary["prompts"]["truncated"] >= 1
    assert all(s["prompt_tokens"] <= 20 for s in samples)
    overall = [r for r in summary["runs"] if r["group"] is None]
    if preset == "gsm8k":
        assert all(s["reference"] and "####" in s["reference"] for s in samples)
        # 6 new tokens never reach '####': every answer is cut, and the report says the accuracy means nothing
        assert all(r["metrics"]["accuracy_cut"] == 4 for r in overall)
        assert any("accuracy" in n and "max_new_tokens" in n for n in summary["notes"])
    else:
        assert all("accuracy" not in r["metrics"] for r in summary["runs"])
        assert {s["group"] for s in samples} == {"writing", "roleplay"}
        groups = {(r["method"], r["group"]): r for r in summary["runs"] if r["group"] is not None}
        assert set(groups) == {(m, g) for m in ("baseline", "speculative") for g in ("writing", "roleplay")}
        assert groups[("speculative", "writing")]["metrics"]["samples"] == 10
        assert (tmp_path / "out" / "speedup_by_group.png").is_file()
