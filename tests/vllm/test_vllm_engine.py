"""vLLM as a second engine through launch.py, for real (the CPU build), on a tiny Llama pair.

Skipped unless SPECULATE_VLLM_PYTHON names an interpreter that imports vllm (.ci/vllm-env DIR builds one; .ci/run sets
it). Each engine start takes 20-40 s on 2 cores: the module runs two sweeps, one per pairing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, VLLM_PYTHON, needs_vllm, save_vllm_pair, write_prompts

PYTHON = VLLM_PYTHON
pytestmark = needs_vllm()


def _config(root: Path, pairing: str, methods: list[str], **extra) -> Path:
    target, draft = root / "target", root / "draft"
    config = {
        "name": "vllm", "device": "cpu", "seed": 0,
        "target": {"model": str(target)},
        "draft": [{"model": str(draft), "label": "d"}],
        "dataset": {"path": str(root / "prompts.jsonl"), "prompt_field": "text", "chat_template": False},
        "generation": {"max_new_tokens": 16}, "speculative": {"gamma": [2], "ngram_max": 2},
        "batch_size": [1], "warmup": 1, "methods": methods,
        "vllm": {"python": PYTHON, "pairing": pairing, "enforce_eager": True, "kv_cache_memory_bytes": 64 * 2**20},
        **extra,
    }
    path = root / f"{pairing}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _launch(args, mark: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECULATE_TEST_MARK=mark)
    # SIGINT at its default in the child (ignored in the parent, as in a shell's background job, the child would
    # inherit it ignored and a test's Ctrl-C would do nothing)
    return subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def _marked(mark: str) -> list[int]:
    """Processes alive with SPECULATE_TEST_MARK=mark in their environment: launch.py, its vLLM workers, their engines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"SPECULATE_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes().split(b"\0") and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _none_left(mark: str, wait: float = 60.0) -> list[int]:
    deadline = time.monotonic() + wait
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(1.0)
    return _marked(mark)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-engine")
    save_vllm_pair(root)
    write_prompts(root / "prompts.jsonl", count=4)
    return root


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _run(summary: dict, method: str) -> dict:
    return next(r for r in summary["runs"] if r["method"] == method and r["group"] is None)


def test_batch_pairing_run_with_a_failing_engine(root):
    """Every engine resident (batch pairing); an EAGLE-3 'head' that is a plain Llama fails its point with vLLM's
    message and nothing else; vLLM's figures from its counters; no process is left."""
    (root / "head").mkdir(exist_ok=True)
    config = _config(root, "batch", ["baseline", "vllm_generate", "vllm_draft", "vllm_ngram", "vllm_eagle"],
                     draft=[{"model": str(root / "draft"), "label": "d"},
                            {"model": str(root / "head"), "label": "head", "kind": "eagle3"}])
    mark = uuid.uuid4().hex
    out = root / "out-batch"
    proc = _launch(["--config", config, "--output-dir", out], mark)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 3, stderr[-3000:]  # a point failed, the rest measured
    assert not _none_left(mark), "a vLLM worker or engine process outlived the run"
    summary = _summary(out)
    assert summary["engine_info"]["vllm"]["pairing"] == "batch"
    eagle = _run(summary, "vllm_eagle")
    assert eagle["status"] == "failed" and "vLLM engine did not start" in eagle["error"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for method in ("vllm_generate", "vllm_draft", "vllm_ngram"):
        run = _run(summary, method)
        assert run["status"] == "ok" and run["batches"]["done"] == 4, run
        assert run["metrics"]["exact_match"] == 1.0  # vLLM's greedy speculation is exact against its own reference
    draft = [s for s in samples if s["method"] == "vllm_draft"]
    # two counters of vLLM's agree: the per-request detailed metrics (our rounds) and the per-batch Prometheus ones
    accepted = sum(r["accepted"] for s in draft for r in s["rounds"])
    drafted = sum(r["drafted"] for s in draft for r in s["rounds"])
    counters = [s["extra"]["vllm_batch_counters"] for s in draft if "vllm_batch_counters" in s["extra"]]
    assert len(counters) == 4
    assert accepted == sum(c["num_accepted_tokens"] for c in counters)
    assert drafted == sum(c["num_draft_tokens"] for c in counters)
    assert all(r["drafted"] == 2 for s in draft for r in s["rounds"])
    for s in draft:  # every token after the prefill's is a round's
        assert 1 + sum(r["emitted"] for r in s["rounds"]) == s["new_tokens"]
    metrics = _run(summary, "vllm_draft")["metrics"]
    assert metrics["acceptance_rate"] == accepted / drafted
    assert metrics["predicted_speedup"] is None and metrics["draft_cost_ratio_c"] is None
    (engines,) = summary["engines"]
    assert engines["reference"]["prompt_batches"] == 4
    assert "Engines" in (out / "summary.md").read_text()


def test_engine_pairing_interrupted_then_resumed(root):
    """One engine at a time; SIGINT while vLLM points run leaves no engine process and exit 130; --resume measures
    what is missing and nothing twice."""
    config = _config(root, "engine", ["baseline", "vllm_generate", "vllm_draft"])
    mark = uuid.uuid4().hex
    out = root / "out-engine"
    proc = _launch(["--config", config, "--output-dir", out], mark)
    deadline = time.monotonic() + 600
    seen = False
    while time.monotonic() < deadline and not seen:  # the first vLLM batch on disk, then interrupt
        time.sleep(1.0)
        if (out / "samples.jsonl").is_file():
            seen = any(json.loads(line)["method"].startswith("vllm_")
                       for line in (out / "samples.jsonl").read_text().splitlines() if line.strip())
        assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert seen, "no vLLM batch within 600 s"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]
    assert not _none_left(mark), "a vLLM worker or engine process outlived the interrupt"
    before = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert _summary(out)["status"] == "interrupted"

    proc = _launch(["--resume", out], mark)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert not _none_left(mark)
    after = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    keys = [(s["method"], s["repeat"], s["batch_index"]) for s in after]
    assert len(keys) == len(set(keys)) == 3 * 4  # every batch of every point once
    assert after[:len(before)] == before  # what was measured is kept as it was
    summary = _summary(out)
    assert summary["engine_info"]["vllm"]["pairing"] == "engine"
    for method in ("vllm_generate", "vllm_draft"):
        assert _run(summary, method)["status"] == "ok"
    assert _run(summary, "vllm_draft")["metrics"]["exact_match"] == 1.0


def test_an_architecture_vllm_does_not_serve_is_one_line(root, tmp_path):
    import shutil

    from helpers import assert_one_clean_line, run_launch

    odd = tmp_path / "odd"
    shutil.copytree(root / "target", odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    path = _config(root, "engine", ["vllm_generate"])
    raw = yaml.safe_load(path.read_text())
    raw["target"]["model"] = str(odd)
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"], timeout=600)
    assert_one_clean_line(result, "target.model: vLLM cannot serve it: NoSuchModelForCausalLM")
