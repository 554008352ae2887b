"""Sweeps over methods, drafts, schedules and temperatures in one run; repeats: auto; cost probes that fail."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import base_config, save_tiny_pair, write_prompts
from utils.io import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def launch(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=400, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    target, draft = save_tiny_pair(root)
    other_target, other_draft = save_tiny_pair(root / "second")  # the same weights under another label
    data = write_prompts(root / "prompts.jsonl", count=4)
    return root, target, draft, other_draft, data


def run_config(root: Path, name: str, config: dict, *args, env=None):
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    out = root / name
    return launch("--config", path, "--output-dir", out, *args, env=env), out


def test_methods_drafts_schedules_and_temperatures_in_one_run(tiny):
    root, target, draft, other_draft, data = tiny
    config = base_config(target, draft, data, batch_size=[1, 2], speculative={"gamma": [2], "schedule":
                         ["constant", "heuristic", "cost_model"], "exit_layer": [1]},
                         methods=["baseline", "speculative", "prompt_lookup", "early_exit"],
                         generation={"max_new_tokens": 10, "do_sample": True, "temperature": [0, 0.8]})
    config["draft"] = [{"model": str(draft), "label": "d1"}, {"model": str(other_draft), "label": "d2"}]
    result, out = run_config(root, "methods", config)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    runs = [r for r in summary["runs"] if r["group"] is None]
    # per (batch size, temperature): baseline + 2 drafts x 3 schedules + prompt lookup + early exit
    assert len(runs) == 2 * 2 * (1 + 6 + 1 + 1)
    assert all(r["status"] == "ok" for r in runs), [(r["label"], r.get("error")) for r in runs if r["status"] != "ok"]
    samples = read_jsonl(out / "samples.jsonl")
    greedy = [s for s in samples if s["temperature"] is None]
    base = {(s["batch_size"], s["sample_id"]): s["output_ids"] for s in greedy if s["method"] == "baseline"}
    for s in greedy:  # every greedy method, schedule and draft gives the baseline's tokens
        assert s["output_ids"] == base[(s["batch_size"], s["sample_id"])], (s["method"], s["schedule"], s["draft"])
    for r in runs:  # each temperature has its own baseline: greedy points match exactly, sampled ones are not compared
        if r["temperature"] is None:
            assert r["metrics"]["exact_match"] == 1.0
        else:
            assert r["metrics"].get("exact_match") is None
    cost_model = [s for s in samples if s["schedule"] == "cost_model"]
    assert cost_model and all(0 <= r["drafted"] <= 2 for s in cost_model for r in s["rounds"])
    assert {s["draft"] for s in samples if s["method"] == "speculative"} == {"d1", "d2"}


def test_repeats_auto_stops_when_the_interval_is_narrow_enough(tiny):
    root, target, draft, _, data = tiny
    wide = base_config(target, draft, data, batch_size=[1], speculative={"gamma": [2]}, repeats="auto",
                       max_repeats=3, ci_target=100.0)
    result, out = run_config(root, "auto-wide", wide)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {s["repeat"] for s in read_jsonl(out / "samples.jsonl")} == {0}
    assert any("repeats: auto stopped after 1 repeat" in n for n in json.loads((out / "summary.json").read_text())["notes"])
    # never narrow enough: max_repeats is the limit, with 8 prompts (6 are too few for an interval, which repeats
    # cannot change: auto stops after one repeat and says so)
    few = dict(wide, ci_target=1e-9)
    result, out = run_config(root, "auto-few", few)
    assert {s["repeat"] for s in read_jsonl(out / "samples.jsonl")} == {0}
    assert any("few_samples" in n for n in json.loads((out / "summary.json").read_text())["notes"])
    narrow = dict(few, dataset=dict(few["dataset"], path=str(write_prompts(root / "prompts8.jsonl", 8))))
    result, out = run_config(root, "auto-narrow", narrow)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {s["repeat"] for s in read_jsonl(out / "samples.jsonl")} == {0, 1, 2}


def test_failing_cost_probes_fail_no_point(tiny):
    root, target, draft, _, data = tiny
    config = base_config(target, draft, data, batch_size=[1], speculative={"gamma": [2], "schedule": ["constant", "cost_model"]})
    result, out = run_config(root, "costs", config, env={"SPECULATE_INJECT_FAILURE": "costs"})
    assert result.returncode == 3, result.stderr[-2000:]  # cost_model cannot run without costs: that point fails
    summary = json.loads((out / "summary.json").read_text())
    status = {r["label"]: r["status"] for r in summary["runs"] if r["group"] is None}
    assert status["speculative draft=llama-draft gamma=2 constant batch=1 greedy"] == "ok"
    assert status["speculative draft=llama-draft gamma=2 cost_model batch=1 greedy"] == "failed"
    constant = next(r for r in summary["runs"] if r["schedule"] == "constant" and r["group"] is None)
    assert constant["metrics"].get("predicted_speedup") is None and constant["metrics"]["speedup"] is not None
    assert any("cost probes failed" in n for n in summary["notes"])


def test_methods_benchmark_prints_its_table(tiny, tmp_path):
    root, target, draft, _, _ = tiny
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "methods_bench.py"), "--per-category", "1",
                             "--out", str(tmp_path / "out"), "--set", f"target.model={target}",
                             "--set", f"draft.model={draft}", "--set", "generation.max_new_tokens=4",
                             "--set", "dataset.chat_template=false", "--set", "dataset.max_prompt_tokens=16",
                             "--set", "methods=[baseline,speculative,prompt_lookup,hf_generate]"],
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "out" / "METHODS.md").read_text()
    for column in ["coding", "humaneval", "writing", "overall"]:
        assert column in table.splitlines()[2]
    assert "| prompt_lookup gamma=2 batch=1 greedy |" in table


def test_trees_chains_and_auto_in_one_run(tiny, tmp_path):
    """A chain, a static tree, a dynamic tree and auto, greedy and sampled, batch 1 and 2; prompt lookup with
    several matches. Greedy outputs equal the baseline's; tree rounds carry their facts; the report and the trees
    benchmark print the tree figures."""
    root, target, draft, _, data = tiny
    config = base_config(target, draft, data, batch_size=[1, 2], methods=["baseline", "speculative", "prompt_lookup"],
                         speculative={"gamma": [3], "tree": [None, [2, 1, 1], {"dynamic": 5}, "auto"]},
                         generation={"max_new_tokens": 10, "do_sample": True, "temperature": [0, 0.8]})
    result, out = run_config(root, "trees", config)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    runs = [r for r in summary["runs"] if r["group"] is None]
    assert all(r["status"] == "ok" for r in runs), [(r["label"], r.get("error")) for r in runs if r["status"] != "ok"]
    labels = {r["label"] for r in runs}
    for tree in ["tree=2-1-1", "tree=dynamic-5", "tree=auto"]:
        assert any(tree in label and label.startswith("speculative") for label in labels), (tree, labels)
    samples = read_jsonl(out / "samples.jsonl")
    greedy = [s for s in samples if s["temperature"] is None]
    base = {(s["batch_size"], s["sample_id"]): s["output_ids"] for s in greedy if s["method"] == "baseline"}
    for s in greedy:
        assert s["output_ids"] == base[(s["batch_size"], s["sample_id"])], (s["method"], s["tree"])
    tree_rounds = [r for s in samples if s["tree"] not in (None, "auto") for r in s["rounds"] if r["drafted"]]
    assert tree_rounds and all(len(r["ranks"]) == r["accepted"] and len(r["parents"]) == r["drafted"]
                               for r in tree_rounds)
    static = [r for s in samples if s["tree"] == "2-1-1" and s["method"] == "speculative" for r in s["rounds"]]
    assert all(r["drafted"] <= 6 for r in static) and any(r["drafted"] == 6 for r in static)  # 2 + 2 + 2 nodes
    for r in runs:
        if r.get("tree") and r["method"] == "speculative":
            assert r["metrics"]["acceptance_by_depth_rank"], r["label"]
    report = (out / "summary.md").read_text()
    assert "nodes/rd" in report and "v(n)" in report


def test_trees_benchmark_prints_its_table(tiny, tmp_path):
    root, target, draft, _, _ = tiny
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trees_bench.py"), "--per-category", "1",
                             "--humaneval", "1", "--heldout", "1", "--out", str(tmp_path / "out"),
                             "--set", f"target.model={target}", "--set", f"draft.model={draft}",
                             "--set", "generation.max_new_tokens=4", "--set", "dataset.chat_template=false",
                             "--set", "dataset.max_prompt_tokens=16", "--set", "speculative.gamma=[2]",
                             "--set", "speculative.tree=[null, [2, 1]]"],
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "out" / "TREES.md").read_text()
    header = text.splitlines()[2]
    for column in ["humaneval", "translation*", "sql*", "writing", "overall"]:
        assert f" {column} " in header, header
    assert "| speculative draft=coder-0.5b gamma=2 tree=2-1 batch=1 greedy |" in text
    assert "acceptance by depth and rank: d1: r0" in text
