"""Heads through launch.py: an EAGLE-3 head and Medusa heads, saved as folders for a tiny target, run beside the
baseline in one report (exact, their c measured by the probes), eager and with engine.compile; a head folder of the
wrong kind is refused in one line."""
import json

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, LlamaConfig

from decode.head_models import Eagle3Head, MedusaHeads, save_eagle3
from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, write_prompts
from tiny_models import save_medusa


@pytest.fixture(scope="module")
def head_config(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    target, draft = save_tiny_pair(root)
    model = AutoModelForCausalLM.from_pretrained(target)
    width, vocab = model.config.hidden_size, model.config.vocab_size
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=vocab, max_position_embeddings=512)
    save_eagle3(Eagle3Head(config, width, vocab, (0, 1, 2)), root / "eagle3")
    save_medusa(MedusaHeads(width, vocab, 2, 1, 3), root / "medusa")
    config = base_config(target, draft, write_prompts(root / "prompts.jsonl", 4), methods=["baseline", "eagle3", "medusa"],
                         batch_size=[2], speculative={"gamma": [3], "tree": [None, "auto"]}, repeats=1)
    config["generation"]["max_new_tokens"] = 8
    config["draft"] = [{"model": str(root / "eagle3"), "kind": "eagle3"}, {"model": str(root / "medusa"), "kind": "medusa"}]
    return root, config


def _run(root, config, name):
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return run_launch(["--config", path, "--output-dir", root / name], timeout=300)


def test_heads_run_beside_the_baseline(head_config):
    root, config = head_config
    result = _run(root, config, "run")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((root / "run" / "summary.json").read_text())
    runs = {(r["method"], r["tree"]): r for r in summary["runs"] if r["group"] is None}
    for method, label in [("eagle3", "eagle3"), ("medusa", "medusa")]:
        for tree in (None, "auto"):  # a chain, and the tree auto prices with the head's measured c
            assert runs[method, tree]["draft"] == label and runs[method, tree]["metrics"]["exact_match"] == 1.0
        assert runs[method, None]["metrics"]["draft_cost_ratio_c"] > 0
    # Medusa drafts min(gamma, heads) = 2 tokens a round
    assert runs["medusa", None]["metrics"]["max_drafted"] == 2
    assert any("eagle3" in note for note in summary["notes"])


def test_a_head_of_the_wrong_kind_is_refused_and_compiled_heads_run(head_config):
    root, config = head_config
    wrong = {**config, "draft": [{"model": str(root / "medusa"), "kind": "eagle3"}], "methods": ["baseline", "eagle3"]}
    assert_one_clean_line(_run(root, wrong, "wrong"), "describes a medusa head")
    compiled = {**config, "engine": {"compile": True, "compile_backend": "eager"},
                "speculative": {"gamma": [3], "tree": [None, [2, 1]]}}
    result = _run(root, compiled, "compiled")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((root / "compiled" / "summary.json").read_text())
    runs = [r for r in summary["runs"] if r["group"] is None and r["method"] in ("eagle3", "medusa")]
    assert len(runs) == 4 and all(r["metrics"]["exact_match"] == 1.0 for r in runs)  # chains and 2-1 trees
    assert any("engine.compile" in note for note in summary["notes"])


def test_a_head_of_another_width_is_refused_before_the_run(head_config):
    """A head half the target's width with no target_hidden_size (so it reads states as wide as itself) and no
    embed_tokens: one line and exit 2 when it loads, not a failure of the run."""
    from transformers import AutoConfig

    root, config = head_config
    target = AutoConfig.from_pretrained(config["target"]["model"])
    narrow = LlamaConfig(hidden_size=target.hidden_size // 2, intermediate_size=target.hidden_size,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=target.vocab_size,
                         max_position_embeddings=512)
    folder = save_eagle3(Eagle3Head(narrow, target.hidden_size, target.vocab_size, (0, 1, 2)), root / "narrow", "eagle")
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in written.items() if k != "target_hidden_size"}))
    run = {**config, "draft": [{"model": str(folder), "kind": "eagle3"}], "methods": ["baseline", "eagle3"]}
    assert_one_clean_line(_run(root, run, "narrow"), f"reads hidden states {target.hidden_size // 2} wide")


def test_synthetic_heads_of_the_targets_shape(head_config):
    """synthetic:head: a head of the target's shape with seeded random weights and no folder (the cost of heads on a
    device with no weights): run beside the baseline, exact, its c measured; a parameter it does not have is one
    line."""
    from decode.head_models import synthetic_head

    root, config = head_config
    target = AutoModelForCausalLM.from_pretrained(config["target"]["model"])
    head = synthetic_head("synthetic:head?draft_vocab=40&seed=3", "eagle3", target)
    assert head.lm_head.out_features == 40 and head.fc.in_features == 3 * target.config.hidden_size
    assert head.embed_tokens.weight is target.get_input_embeddings().weight  # shared, one copy
    again = synthetic_head("synthetic:head?draft_vocab=40&seed=3", "eagle3", target)
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), again.parameters()))
    assert synthetic_head("synthetic:head?heads=2", "medusa", target).num_heads == 2
    synthetic = {**config, "draft": [{"model": "synthetic:head?draft_vocab=40", "kind": "eagle3"},
                                     {"model": "synthetic:head?heads=2", "kind": "medusa"}]}
    result = _run(root, synthetic, "synthetic")
    assert result.returncode == 0, result.stderr[-2000:]
    runs = [r for r in json.loads((root / "synthetic" / "summary.json").read_text())["runs"]
            if r["group"] is None and r["method"] in ("eagle3", "medusa") and r["tree"] is None]
    assert len(runs) == 2 and all(r["metrics"]["exact_match"] == 1.0 for r in runs)
    assert all(r["metrics"]["draft_cost_ratio_c"] > 0 for r in runs)
    bad = {**config, "draft": [{"model": "synthetic:head?layers=2", "kind": "eagle3"}], "methods": ["baseline", "eagle3"]}
    assert_one_clean_line(_run(root, bad, "bad-synthetic"), "unknown synthetic head parameter 'layers'")


def test_the_training_script_saves_a_head_that_loads(head_config, monkeypatch):
    """benchmarks/train_eagle3.py end to end on the tiny target (a few seconds of training): a speculators folder
    that load_head reads, with its facts (token counts, the loss log, the weights' checksum)."""
    import hashlib
    import sys

    from decode.head_models import load_head
    from helpers import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import train_eagle3

    root, config = head_config
    out = root / "trained"
    assert train_eagle3.main(["--target", config["target"]["model"], "--out", str(out), "--minutes", "0.02",
                              "--limit", "4", "--answer-tokens", "6", "--window", "16", "--ttt", "2", "--solutions",
                              "--python-source", "2"]) == 0
    facts = json.loads((out / "train.json").read_text())
    assert facts["prompts"] == 4 and facts["steps"] >= 1 and facts["log"][0]["step"] == 1
    assert set(facts["tokens_by_source"]) == {"answered", "solutions", "python_source"}
    assert facts["tokens"] == sum(facts["tokens_by_source"].values())
    assert len(facts["held_out_accuracy_per_step"]) == 2
    assert facts["sha256"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    head = load_head(out, "eagle3", AutoModelForCausalLM.from_pretrained(config["target"]["model"]))
    assert head.target_layers == (0, 1, 2) and head.lm_head.out_features == facts["draft_vocab"]
    assert "train_eagle3" in sys.modules


def test_the_training_time_test_reads_what_drafting_reads(monkeypatch):
    """EAGLE-3's training-time test (train_eagle3.ttt_logits): step k at anchor i gives the logits of the head's
    (k + 1)-th draft after it has read the target's states up to i, drafted token by token with its cache as the
    engine drafts (each step one forward at the next position, fed the head's previous output)."""
    from transformers import DynamicCache, LlamaConfig

    from decode.head_models import Eagle3Head
    from helpers import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import train_eagle3

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=50, max_position_embeddings=64, initializer_range=0.3)
    head = Eagle3Head(config, 16, 20, (0, 1, 2)).eval()
    width, steps = 7, 3
    tokens, features = torch.randint(0, 50, (2, width + steps)), torch.randn(2, width, 48)
    with torch.no_grad():
        trained = train_eagle3.ttt_logits(head, tokens, features, steps)
        for i in range(width - 1):
            cache = DynamicCache()
            logits = head(tokens[:, 1: i + 2], position_ids=torch.arange(i + 1)[None].expand(2, -1),
                          past_key_values=cache, features=features[:, : i + 1]).logits[:, -1]
            for k in range(steps):
                torch.testing.assert_close(trained[k][:, i], logits, rtol=1e-4, atol=1e-5)
                logits = head(tokens[:, i + k + 2: i + k + 3], position_ids=torch.full((2, 1), i + k + 1),
                              past_key_values=cache, hidden=head.last_hidden[:, -1:]).logits[:, -1]
    # the labels: step k at anchor i is scored on the sequence's token i + k + 2 from the window's start (ids 0, 1, 2,
    # ... whose greedy next token is the next id), nothing past the window's last state; two windows of different
    # lengths in one batch
    ids = torch.arange(40)
    x, f, y = train_eagle3._batch([(3, 10), (20, 25)], ids, torch.zeros(40, 2), ids + 1, torch.arange(41), steps)
    for k in range(steps):
        got = train_eagle3.step_targets(y, k, f.shape[1])
        for row, (start, n) in enumerate(((3, 6), (20, 4))):
            assert got[row].tolist() == [start + i + k + 2 if i + k < n else -100 for i in range(f.shape[1])]
