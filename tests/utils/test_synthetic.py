"""Synthetic pairs built from a config: the draft's agreement with the target is controlled."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.kv import sliding_window_of, tree_support_problem
from decode.numerics import ragged_batch_problem
from helpers import write_prompts
from utils.synthetic_models import SHAPES, build_config, build_decoder, build_model, build_tokenizer, parse

ROOT = Path(__file__).resolve().parents[2]


def test_draft_is_the_targets_first_layers():
    target, tokenizer = build_model("synthetic:llama-tiny", torch.float32, "sdpa")
    draft, _ = build_model("synthetic:llama-tiny?layers=2", torch.float32, "sdpa")
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    ids = tokenizer("def f(x): return x")["input_ids"]
    assert tokenizer.decode(ids) == "def f(x): return x" and max(ids) < target.config.vocab_size


# The published config.json numbers (huggingface.co/<org>/<model>/config.json; gemma-3-4b: its text_config):
# hidden, intermediate, layers, heads, kv heads, head_dim, vocab, tied head, rope theta (gemma: global / local),
# sliding window (None: no sliding-window layers)
PUBLISHED = {
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True, 1000000, None),  # Qwen/Qwen3-0.6B
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936, True, 1000000, None),  # Qwen/Qwen3-1.7B
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936, True, 1000000, None),  # Qwen/Qwen3-4B
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, False, 1000000, None),  # Qwen/Qwen3-8B
    # the offline pair's shapes: Qwen/Qwen2.5-Coder-0.5B-Instruct, Qwen/Qwen2.5-Coder-1.5B-Instruct
    "qwen2.5-coder-0.5b": (896, 4864, 24, 14, 2, 64, 151936, True, 1000000, None),
    "qwen2.5-coder-1.5b": (1536, 8960, 28, 12, 2, 128, 151936, True, 1000000, None),
    "gemma-3-270m": (640, 2048, 18, 4, 1, 256, 262144, True, (1000000, 10000), 512),  # google/gemma-3-270m
    "gemma-3-1b": (1152, 6912, 26, 4, 1, 256, 262144, True, (1000000, 10000), 512),  # google/gemma-3-1b-it
    "gemma-3-4b": (2560, 10240, 34, 8, 4, 256, 262208, True, (1000000, 10000), 1024),  # google/gemma-3-4b-it
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, True, 500000, None),  # meta-llama/Llama-3.2-1B
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256, False, 500000, None),  # meta-llama/Llama-3.1-8B
}
# non-embedding parameters as the model cards state them (Qwen3: "0.44B" ...; gemma-3-270m: "100M transformer
# parameters"), to the figures' last digit
NON_EMBEDDING = {"qwen3-0.6b": (0.44e9, 0.005e9), "qwen3-1.7b": (1.4e9, 0.05e9), "qwen3-4b": (3.6e9, 0.05e9),
                 "qwen3-8b": (6.95e9, 0.005e9), "gemma-3-270m": (100e6, 0.5e6),
                 # Qwen2.5-Coder: "Number of Parameters (Non-Embedding): 0.36B" / "1.31B"
                 "qwen2.5-coder-0.5b": (0.36e9, 0.005e9), "qwen2.5-coder-1.5b": (1.31e9, 0.005e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_shapes(name):
    hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tied, theta, window = PUBLISHED[name]
    model = build_decoder(f"synthetic:{name}", torch.bfloat16, "sdpa", "meta")  # shapes only: nothing drawn
    config = model.config
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.vocab_size) == (hidden, intermediate, layers, heads,
                                                                                kv_heads, head_dim, vocab)
    assert len(model.model.layers) == layers and model.lm_head.weight.shape == (vocab, hidden)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (heads * head_dim, hidden)
    assert attention.k_proj.weight.shape == (kv_heads * head_dim, hidden)
    assert hasattr(attention, "q_norm") == name.startswith(("qwen3", "gemma"))  # they norm q and k per head
    qkv_biases = name.startswith("qwen2")  # Qwen2 (Qwen2.5-Coder) has biases on q, k, v, not on o
    assert [getattr(attention, f"{x}_proj").bias is not None for x in "qkvo"] == [qkv_biases] * 3 + [False]
    if name.startswith("gemma"):
        assert config.model_type == "gemma3_text" and config.sliding_window == window
        assert config.layer_types == [("full_attention" if i % 6 == 5 else "sliding_attention") for i in range(layers)]
        rope = config.rope_parameters
        assert (rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]) == theta
        assert rope["full_attention"].get("factor", 1.0) == (8.0 if name == "gemma-3-4b" else 1.0)  # 4b: linear x8
    else:
        assert config.rope_parameters["rope_theta"] == theta
        assert config.model_type == {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama"}[name[:5]]
        assert sliding_window_of(config) is None
    if name.startswith("qwen2"):
        assert (config.rms_norm_eps, config.max_position_embeddings) == (1e-6, 32768)
    if name.startswith("llama-3"):
        assert config.rope_parameters["rope_type"] == "llama3"
        assert config.rope_parameters["factor"] == (32.0 if name == "llama-3.2-1b" else 8.0)
    if name in NON_EMBEDDING:
        figure, rounding = NON_EMBEDDING[name]
        embedding = vocab * hidden * (1 if tied else 2)
        assert abs(sum(p.numel() for p in model.parameters()) - embedding - figure) <= rounding
    draft = build_config(f"synthetic:{name}?layers=3")[1]
    assert draft.num_hidden_layers == 3 and (not name.startswith("gemma") or draft.layer_types == config.layer_types[:3])


@pytest.mark.parametrize("name", ["qwen3-tiny", "gemma-3-tiny"])
def test_tied_draft_shares_the_targets_first_layers(name):
    target, tokenizer = build_model(f"synthetic:{name}", torch.float32, "sdpa")
    draft, _ = build_model(f"synthetic:{name}?layers=2", torch.float32, "sdpa")
    assert draft.lm_head.weight is draft.model.embed_tokens.weight and target.lm_head.weight is target.model.embed_tokens.weight
    target_state = target.state_dict()
    for key, value in draft.state_dict().items():  # the first 2 layers, embeddings, final norm, head
        assert torch.equal(value, target_state[key]), key
    assert not torch.equal(target.model.layers[0].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    ids = torch.tensor([tokenizer("The quick brown fox jumps over the lazy dog")["input_ids"]] * 2)
    generation = Generation(max_new_tokens=24)  # past gemma-3-tiny's window of 8
    with torch.inference_mode():
        base = generate_baseline(target, ids, torch.ones_like(ids), generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, 512, Sampling()), ids, torch.ones_like(ids),
                                    generation, 3)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]


def test_built_in_the_dtype_with_a_large_vocabulary():
    model, tokenizer = build_model("synthetic:qwen3-tiny?seed=3", torch.bfloat16, "sdpa")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and not any(p.requires_grad for p in model.parameters())
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # computed, not drawn: the same as a loaded model's
    other = build_decoder("synthetic:qwen3-tiny?seed=4", torch.bfloat16, "sdpa")
    assert not torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)
    big = build_tokenizer(262144)  # gemma-3's vocabulary: the byte alphabet, padded
    text = "x = {'a': 1}  # ü"
    ids = big(text)["input_ids"]
    assert len(big) == 262144 and big.decode(ids) == text and max(ids) < 262


@pytest.mark.parametrize("spec", ["synthetic:qwen3-0.6b?layers=1", "synthetic:gemma-3-1b?layers=1",
                                  "synthetic:gemma-3-4b?layers=1", "synthetic:qwen2.5-coder-1.5b?layers=1"])
def test_real_shapes_pass_the_load_time_checks(spec):
    """A one-layer cut of the real shape with a small vocabulary (the checks do not depend on it): tree masks
    accepted, ragged batches decode as alone."""
    cls, config = build_config(spec)
    config.vocab_size = 512
    torch.manual_seed(0)
    model = cls(config).eval()
    assert tree_support_problem(model) is None
    with torch.inference_mode():
        assert ragged_batch_problem(model) is None


def acceptance(draft_spec: str) -> float:
    target, tokenizer = build_model("synthetic:llama-tiny", torch.float32, "sdpa")
    draft, _ = build_model(draft_spec, torch.float32, "sdpa")
    ids = torch.tensor([tokenizer("The quick brown fox jumps")["input_ids"]] * 2)
    generation = Generation(max_new_tokens=40)
    with torch.inference_mode():
        base = generate_baseline(target, ids, torch.ones_like(ids), generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, 512, Sampling()), ids, torch.ones_like(ids),
                                    generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    rounds = [r for s in spec for r in s.rounds]
    return sum(r["accepted"] for r in rounds) / sum(r["drafted"] for r in rounds)


def test_agreement_is_controlled_by_depth_and_noise():
    full = acceptance("synthetic:llama-tiny?layers=4")
    assert full == 1.0  # all layers and no noise: the draft is the target
    shallow, noisy = acceptance("synthetic:llama-tiny?layers=1"), acceptance("synthetic:llama-tiny?layers=4&noise=2.0")
    assert shallow < 1.0 and noisy < 1.0


def test_drawn_on_the_host_is_the_cpu_model():
    """draw=cpu draws every weight on the CPU (then moves it): a GPU runs the very model a CPU run ran."""
    plain = build_decoder("synthetic:llama-tiny?noise=0.1", torch.float32, "sdpa").state_dict()
    hosted = build_decoder("synthetic:llama-tiny?noise=0.1&draw=cpu", torch.float32, "sdpa").state_dict()
    assert plain.keys() == hosted.keys() and all(torch.equal(plain[k], hosted[k]) for k in plain)


@pytest.mark.parametrize("spec, fragment", [("synthetic:llama-9b", "unknown synthetic model"),
                                            ("synthetic:llama-tiny?layers=9", "outside"),
                                            ("synthetic:llama-tiny?depth=2", "unknown synthetic parameter"),
                                            ("synthetic:llama-tiny?draw=gpu", "draw=gpu")])
def test_bad_synthetic_specs(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse(spec)


@pytest.mark.e2e
def test_synthetic_pair_in_a_run(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", count=3)
    config = {"name": "synthetic", "device": "cpu", "target": {"model": "synthetic:llama-tiny"},
              "draft": {"model": "synthetic:llama-tiny?layers=2"},
              "dataset": {"path": str(data), "preset": "none", "prompt_field": "text"},
              "generation": {"max_new_tokens": 16}, "speculative": {"gamma": [3]}, "batch_size": [1, 3]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    runs = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    assert all(r["metrics"]["exact_match"] == 1.0 for r in runs)
    bad = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--set",
                          "draft.model=synthetic:llama-9b"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "draft.model" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.e2e
def test_qwen3_shape_in_a_run(tmp_path):
    """The published Qwen3-0.6B shape and its first 2 layers as the draft, through launch.py on a CPU in fp32."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": f"def add_{i}(a, b):"}) + "\n" for i in range(2)))
    config = {"name": "qwen3", "device": "cpu", "target": {"model": "synthetic:qwen3-0.6b", "dtype": "float32",
                                                           "attn_implementation": "sdpa"},
              "draft": {"model": "synthetic:qwen3-0.6b?layers=2", "dtype": "float32", "attn_implementation": "sdpa"},
              "dataset": {"path": str(data), "preset": "none", "prompt_field": "text"},
              "generation": {"max_new_tokens": 8}, "speculative": {"gamma": [3]}, "batch_size": [1], "warmup": 0}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    runs = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    assert len(runs) == 2 and all(r["metrics"]["exact_match"] == 1.0 for r in runs)


def test_saved_synthetic_models_load_as_local_folders(tmp_path):
    """benchmarks/save_synthetic.py: the folders load through the runner's loader (where bitsandbytes can quantize
    them) as the very models the config builds: the same logits, the same tokens."""
    from utils.config import ModelConfig
    from utils.models import load_model

    config = tmp_path / "pair.yaml"
    config.write_text(yaml.safe_dump({"target": {"model": "synthetic:llama-tiny?draw=cpu"},
                                      "draft": {"model": "synthetic:llama-tiny?layers=2&noise=0.1&draw=cpu"}}))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "save_synthetic.py"), str(config), str(tmp_path / "m")],
                   check=True, capture_output=True, cwd=ROOT)
    ids = torch.tensor([[5, 9, 200, 31]])
    for role, spec in (("target", "synthetic:llama-tiny"), ("draft", "synthetic:llama-tiny?layers=2&noise=0.1")):
        built, tokenizer = build_model(spec, torch.float32, "sdpa")
        loaded = load_model(ModelConfig(model=str(tmp_path / "m" / role), dtype="float32"), torch.device("cpu"), role)
        assert torch.equal(built(ids).logits, loaded.model(ids).logits)
        assert loaded.tokenizer("a b").input_ids == tokenizer("a b").input_ids
