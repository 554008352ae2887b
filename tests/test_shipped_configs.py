"""Every shipped config runs from a clone: it validates, names no file outside the repository, and runs
end to end with tiny models substituted for weights that cannot be had here."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from decode.methods import caps_of, spec
from helpers import save_tiny_pair
from utils.config import load_config
from utils.data import resolve_path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
HUB_DATASETS = {"openai/gsm8k": "configs/data/gsm8k_test_50.jsonl"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates_and_reads_only_repository_files(path):
    config, raw = load_config(path)
    dataset = config.dataset.path
    assert "../" not in dataset, f"{path.name} reads {dataset}, outside the repository"
    if dataset in HUB_DATASETS:
        return  # the hub id is kept: the real loading code; the test run below uses the shipped copy
    where, loader = resolve_path(dataset)
    if loader is not None:  # a local file: it must be inside the repository (or an installed package)
        assert Path(where).is_file()
        assert ROOT in Path(where).resolve().parents or "site-packages" in where, where


@pytest.mark.e2e
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_runs_with_tiny_models(path, tmp_path_factory, tmp_path):
    run_shipped(path, tmp_path_factory, tmp_path, {})


# the compiled configs cover the fixed-batch ones (a serving config compiles in row buckets: tests/decode/test_captured_steps.py)
CPU_CONFIGS = [p for p in CONFIGS if load_config(p)[0].device == "cpu" and load_config(p)[0].load is None]


def compiled(method: str) -> bool:
    """A method engine.compile compiles: our engine's own, not transformers' peers run beside it."""
    return caps_of(method).compiles and not spec(method).peer


def compiled_features(path: Path) -> set:
    """What a config asks of the compiled engine: our methods, schedules, gammas, batch sizes and turns."""
    config = load_config(path)[0]
    spec = config.speculative
    return ({("method", m) for m in config.methods if compiled(m)}
            | {("schedule", s) for s in spec.schedule} | {("gamma", str(g)) for g in spec.gamma}
            | {("batch_size", b) for b in config.batch_size} | {("turns", str(config.dataset.turns))})


def covering(paths: list[Path]) -> list[Path]:
    """The fewest configs (greedy, in name order on ties) that ask every feature any of `paths` asks."""
    asks = {p: compiled_features(p) for p in paths}  # each config read once
    left, chosen = set().union(*asks.values()), []
    while left:
        best = max(paths, key=lambda p: (len(asks[p] & left), -paths.index(p)))
        chosen.append(best)
        left -= asks[best]
    return chosen


@pytest.mark.e2e
@pytest.mark.parametrize("path", covering(CPU_CONFIGS), ids=lambda p: p.name)
def test_cpu_config_runs_exactly_compiled(path, tmp_path_factory, tmp_path):
    """engine.compile: true on every method, schedule, gamma, batch size and turns setting of the shipped CPU configs
    (the fewest configs that ask them all; each config's run takes half a minute to a minute on 2 cores): our
    engine's greedy points give the baseline's tokens, and nothing compiles after a comparison's warmup (dynamo's
    graphs, without inductor's code generation: CI's time)."""
    uncompiled = {"speculative.hybrid_max_draft": None} if load_config(path)[0].speculative.hybrid_max_draft else {}
    summary = run_shipped(path, tmp_path_factory, tmp_path, {"engine.compile": True, "engine.compile_backend": "eager",
                                                             "warmup": 1, "generation.max_new_tokens": 12,
                                                             **uncompiled})
    ours = [r for r in summary["runs"] if compiled(r["method"]) and r["status"] == "ok"]
    assert any(r["metrics"].get("rounds") for r in ours), "no speculative point of ours ran"
    for run in ours:
        if run["temperature"] is None:
            assert run["metrics"]["exact_match"] == 1.0, run["label"]
    assert any(n.startswith("engine.compile: static KV caches") for n in summary["notes"])
    assert not [n for n in summary["notes"] if "compiled a graph inside a timed batch" in n]
    counters = summary["engine_info"]["ours"]["compiled"]  # the compiled models' own counters, kept in the report
    assert counters["target"]["graphs"] > 0 and all(m["recompiles_after_warmup"] == 0 for m in counters.values())


def random_head(target: Path, kind: str, root: Path) -> Path:
    """A random head of `kind` for the tiny target saved at `target`, as a folder."""
    import torch
    from transformers import AutoConfig, LlamaConfig

    from decode.head_models import Eagle3Head, MedusaHeads, default_aux_layers, save_eagle3
    from tiny_models import save_medusa

    folder = root / f"{kind}-head"
    if not folder.exists():
        tc = AutoConfig.from_pretrained(target)
        torch.manual_seed(0)
        if kind == "eagle3":
            config = LlamaConfig(hidden_size=tc.hidden_size, intermediate_size=2 * tc.hidden_size, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=tc.vocab_size, max_position_embeddings=512)
            save_eagle3(Eagle3Head(config, tc.hidden_size, tc.vocab_size, default_aux_layers(tc.num_hidden_layers)),
                        folder)
        elif kind == "medusa":
            save_medusa(MedusaHeads(tc.hidden_size, tc.vocab_size, 2, 1, tc.num_hidden_layers), folder)
        else:
            raise AssertionError(f"no random head of kind {kind!r} here: add one to random_head")
    return folder


def run_shipped(path, tmp_path_factory, tmp_path, extra: dict) -> dict:
    target, draft = save_tiny_pair(tmp_path_factory.getbasetemp() / "shipped")
    config, raw = load_config(path)
    overrides = {"device": "cpu", "dataset.num_samples": 2, "generation.max_new_tokens": 4, "warmup": 0, "repeats": 1,
                 "dataset.chat_template": False, "dataset.max_prompt_tokens": 24, **extra}
    if config.load is not None:  # a serving config: a few requests per load point
        overrides["load.requests"] = 4
        if config.load.request_rate:  # arrivals are real seconds: a light rate would wait for them (0.05/s: 20 s apart)
            overrides["load.request_rate"] = [rate if rate == "inf" else rate * 100 for rate in config.load.request_rate]
    # vLLM's methods run in tests/vllm, every one end to end where vLLM is (each starts an engine: 40-70 s on 2 cores,
    # CI's time); llama.cpp's load GGUF files, which the tiny pair is not (tests/llama_cpp runs llama.cpp)
    overrides["methods"] = [m for m in config.methods if caps_of(m).home]
    for role, folder in (("target", target), ("draft", draft)):
        overrides[role] = {"model": str(folder), "dtype": "float32"}
    # a head our engine runs (its draft kind is not a draft model's): no trained head here, a random one of that kind
    ours_heads = list(dict.fromkeys(kind for m in overrides["methods"] for kind in spec(m).draft_kinds
                                    if kind != "model"))
    if ours_heads:
        overrides["draft"] = [overrides["draft"]] + [
            {"model": str(random_head(target, kind, tmp_path_factory.getbasetemp() / "shipped")), "kind": kind,
             "label": next(d.name for d in config.draft if d.kind == kind)} for kind in ours_heads]
    if config.dataset.path in HUB_DATASETS:
        overrides["dataset.path"] = HUB_DATASETS[config.dataset.path]
        overrides["dataset.name"] = None
    args = [a for key, value in overrides.items() for a in ("--set", f"{key}={json.dumps(value)}")]
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir", str(out),
                             *args], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"] + (summary.get("serving") or {}).get("runs", [])  # a serving config's are under serving
    assert runs and all(r["status"] in ("ok", "skipped") for r in runs)
    if config.load is not None:
        assert summary["serving"]["runs"] and not summary["runs"]
    return summary
