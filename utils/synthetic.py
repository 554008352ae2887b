"""Synthetic model pairs built from a config: GPU benchmarks of the tool with no weights to download.

    model: synthetic:llama-1b                 # the target: a ~1.1B Llama (TinyLlama's shape), seeded weights
    model: synthetic:llama-1b?layers=2        # a draft: the target's first 2 layers, its embeddings, norm and head
    model: synthetic:llama-1b?layers=2&noise=0.1   # ... with every weight perturbed by 10% of its std

A draft cut from the target shares its embeddings and head, so the two agree far more than two random
models; fewer layers or more noise lowers the agreement. The run measures alpha either way. Both use one
byte-level tokenizer padded to the model's vocabulary, so any dataset's text tokenizes to a realistic
length. Random weights make degenerate text; this pair measures speed, not quality.
"""
from __future__ import annotations

from urllib.parse import parse_qs

import torch

SHAPES = {
    # name: (hidden, intermediate, layers, heads, kv heads, vocab)
    "llama-1b": (2048, 5632, 22, 32, 4, 32000),
    "llama-160m": (768, 2048, 12, 12, 4, 32000),
    "llama-tiny": (64, 128, 4, 4, 2, 512),
}


def parse(spec: str) -> tuple[str, int | None, float, int]:
    """'synthetic:NAME?layers=L&noise=X&seed=S' -> (NAME, L, X, S)."""
    body = spec.removeprefix("synthetic:")
    name, _, query = body.partition("?")
    if name not in SHAPES:
        raise ValueError(f"unknown synthetic model '{name}'; choose one of {', '.join(SHAPES)}")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(params) - {"layers", "noise", "seed"}
    if unknown:
        raise ValueError(f"unknown synthetic parameter {sorted(unknown)[0]!r}; use layers, noise, seed")
    layers = int(params["layers"]) if "layers" in params else None
    if layers is not None and not 1 <= layers <= SHAPES[name][2]:
        raise ValueError(f"layers={layers} is outside 1..{SHAPES[name][2]} for {name}")
    return name, layers, float(params.get("noise", 0.0)), int(params.get("seed", 0))


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(alphabet))}
    for i in range(len(vocab), vocab_size):
        vocab[f"<extra_{i}>"] = i
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def build_model(spec: str, dtype: torch.dtype, attn_implementation: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    name, layers, noise, seed = parse(spec)
    hidden, intermediate, depth, heads, kv_heads, vocab = SHAPES[name]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=depth,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False, attn_implementation=attn_implementation)
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        full = LlamaForCausalLM(config)
    # weights are drawn layer by layer in a fixed order, so a draft's first L layers equal the target's
    state = {}
    for key, tensor in full.state_dict().items():
        if key.endswith("norm.weight"):
            state[key] = torch.ones(tensor.shape)
        else:
            state[key] = torch.randn(tensor.shape, generator=generator) * config.initializer_range
    if layers is not None:
        config.num_hidden_layers = layers
        state = {k: v for k, v in state.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    if noise > 0:
        noise_generator = torch.Generator().manual_seed(seed + 1)
        state = {k: v + torch.randn(v.shape, generator=noise_generator) * v.std() * noise if v.dim() > 1 else v
                 for k, v in state.items()}
    model = LlamaForCausalLM(config)
    model.load_state_dict(state)
    model.generation_config.eos_token_id = 2
    return model.to(dtype), build_tokenizer(vocab)
