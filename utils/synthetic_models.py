"""Synthetic model pairs built from a config: GPU benchmarks of the tool with no weights to download.

    model: synthetic:qwen3-4b                 # the target: Qwen3-4B's published shape, seeded random weights
    model: synthetic:qwen3-4b?layers=2        # a draft: the target's first 2 layers, its embeddings, norm and head
    model: synthetic:llama-1b?layers=2&noise=0.1   # ... with every weight perturbed by 10% of its std
    model: synthetic:llama-1b?layers=4&draw=cpu    # drawn on the CPU, then moved: the same weights on every device

The shapes (SHAPES) are the published config.json numbers of Qwen3 0.6B-8B, Qwen2.5-Coder 0.5B and 1.5B (the offline
pair's shapes; q/k/v biases), gemma-3 270m/1b/4b (the text model; sliding-window layers, q/k norms), Llama-3.2-1B and
Llama-3.1-8B, plus three small Llamas and test-size Qwen3 and gemma-3 (the families' features, tiny). A draft cut
from the target shares its embeddings and head; fewer layers or more noise lowers its agreement. On a deep model of
random weights the layers' outputs swamp the embedding in the residual stream, so a draft of a few layers agrees with
the target little more than chance (a measured qwen3-0.6b?layers=2 accepted none of its drafts): such a pair measures
the cost of drafting and verifying, not realistic acceptance. The run measures alpha either way. Both use one
byte-level tokenizer padded to the model's vocabulary, so any dataset's text tokenizes to a realistic length. Random
weights make degenerate text; this pair measures speed, not quality.

The model is built where it runs, in the run's dtype: its parameters start on the meta device and each is drawn on
the target device from a generator seeded by (seed, parameter name), so no full copy is ever made on the host and
a draft's tensors equal the target's of the same name whatever the depth.
"""
from __future__ import annotations

import zlib
from typing import NamedTuple
from urllib.parse import parse_qs

import torch


class Shape(NamedTuple):
    """A decoder's architecture numbers; `extra` holds the other config.json keys as published."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int | None = None  # None: hidden // heads
    tied: bool = False  # the head is the input embedding
    # llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM: biases on q, k, v), qwen3 (Qwen3ForCausalLM), gemma3
    # (Gemma3ForCausalLM)
    family: str = "llama"
    extra: dict | None = None


# Llama 3.x rope: rope_theta 500000 with the "llama3" frequency scaling
LLAMA3_ROPE = dict(rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=131072)
QWEN3 = dict(rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, use_sliding_window=False)
QWEN2 = dict(rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768, use_sliding_window=False)
# gemma-3: local (sliding-window) layers rope at 10k, global ones at 1M; 5 local layers, then 1 global
GEMMA3 = dict(rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
              sliding_window_pattern=6)

SHAPES = {
    "llama-1b": Shape(2048, 5632, 22, 32, 4, 32000),  # TinyLlama-1.1B's shape
    "llama-160m": Shape(768, 2048, 12, 12, 4, 32000),
    "llama-tiny": Shape(64, 128, 4, 4, 2, 512),
    # the families' features at test size: tied head, q/k norms; gemma's 5 sliding-window layers then a global one
    "qwen3-tiny": Shape(64, 128, 4, 4, 2, 512, 16, True, "qwen3", dict(QWEN3, max_position_embeddings=512)),
    "gemma-3-tiny": Shape(64, 128, 6, 4, 1, 512, 16, True, "gemma3", dict(
        GEMMA3, sliding_window=8, max_position_embeddings=512)),
    "llama-3.2-1b": Shape(2048, 8192, 16, 32, 8, 128256, 64, True, "llama", dict(
        LLAMA3_ROPE, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8192))),
    "llama-3.1-8b": Shape(4096, 14336, 32, 32, 8, 128256, 128, False, "llama", dict(
        LLAMA3_ROPE, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8192))),
    # the offline pair's (utils/offline_models.py: their GGUF conversions untie the head; the compute is the same)
    "qwen2.5-coder-0.5b": Shape(896, 4864, 24, 14, 2, 151936, 64, True, "qwen2", QWEN2),
    "qwen2.5-coder-1.5b": Shape(1536, 8960, 28, 12, 2, 151936, 128, True, "qwen2", QWEN2),
    "qwen3-0.6b": Shape(1024, 3072, 28, 16, 8, 151936, 128, True, "qwen3", QWEN3),
    "qwen3-1.7b": Shape(2048, 6144, 28, 16, 8, 151936, 128, True, "qwen3", QWEN3),
    "qwen3-4b": Shape(2560, 9728, 36, 32, 8, 151936, 128, True, "qwen3", QWEN3),
    "qwen3-8b": Shape(4096, 12288, 36, 32, 8, 151936, 128, False, "qwen3", QWEN3),
    "gemma-3-270m": Shape(640, 2048, 18, 4, 1, 262144, 256, True, "gemma3", dict(
        GEMMA3, sliding_window=512, max_position_embeddings=32768)),
    "gemma-3-1b": Shape(1152, 6912, 26, 4, 1, 262144, 256, True, "gemma3", dict(
        GEMMA3, sliding_window=512, max_position_embeddings=32768)),
    # gemma-3-4b is multimodal (Gemma3ForConditionalGeneration); this is its text_config, the language model
    "gemma-3-4b": Shape(2560, 10240, 34, 8, 4, 262208, 256, True, "gemma3", dict(
        GEMMA3, sliding_window=1024, max_position_embeddings=131072, rope_scaling=dict(rope_type="linear", factor=8.0))),
}


def parse(spec: str) -> tuple[str, int | None, float, int]:
    """'synthetic:NAME?layers=L&noise=X&seed=S' -> (NAME, L, X, S)."""
    name, params = _spec_params(spec)
    if name not in SHAPES:
        raise ValueError(f"unknown synthetic model '{name}'; choose one of {', '.join(SHAPES)}")
    unknown = set(params) - {"layers", "noise", "seed", "draw"}
    if unknown:
        raise ValueError(f"unknown synthetic parameter {sorted(unknown)[0]!r}; use layers, noise, seed, draw")
    if params.get("draw", "device") not in ("cpu", "device"):
        raise ValueError(f"draw={params['draw']} is neither cpu (the same weights on every device) nor device (drawn "
                         "where the model runs, the default)")
    layers = int(params["layers"]) if "layers" in params else None
    if layers is not None and not 1 <= layers <= SHAPES[name][2]:
        raise ValueError(f"layers={layers} is outside 1..{SHAPES[name][2]} for {name}")
    return name, layers, float(params.get("noise", 0.0)), int(params.get("seed", 0))


def _spec_params(spec: str) -> tuple[str, dict[str, str]]:
    """'synthetic:NAME?k=v&...' -> (NAME, {k: v}), the last value of a repeated key."""
    name, _, query = spec.removeprefix("synthetic:").partition("?")
    return name, {k: v[-1] for k, v in parse_qs(query).items()}


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


def build_config(spec: str, attn_implementation: str = "sdpa"):
    """-> (model class, its config) for a spec, `?layers=L` applied; special token ids are the byte tokenizer's."""
    import transformers

    name, layers, _, _ = parse(spec)
    shape = SHAPES[name]
    depth = layers or shape.layers
    kwargs = dict(hidden_size=shape.hidden, intermediate_size=shape.intermediate, num_hidden_layers=depth,
                  num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                  tie_word_embeddings=shape.tied, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  attn_implementation=attn_implementation, **(shape.extra or {"max_position_embeddings": 4096}))
    if shape.head_dim is not None:
        kwargs["head_dim"] = shape.head_dim
    if shape.family == "gemma3":
        pattern = kwargs.pop("sliding_window_pattern")  # the published layer_types: every pattern-th layer is global
        kwargs["layer_types"] = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                 for i in range(shape.layers)][:depth]
        return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(**kwargs)
    if shape.family == "qwen3":
        kwargs["max_window_layers"] = depth
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**kwargs)
    if shape.family == "qwen2":
        kwargs["max_window_layers"] = depth
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**kwargs)
    return transformers.LlamaForCausalLM, transformers.LlamaConfig(**kwargs)


def _generator(device: torch.device, seed: int, key: str) -> torch.Generator:
    """A generator on `device` seeded by (seed, a parameter's name): each tensor is drawn on its own."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))


def build_model(spec: str, dtype: torch.dtype, attn_implementation: str, device: torch.device | str = "cpu"):
    """-> (model on `device` in `dtype`, eval mode, no grad; its byte-level tokenizer padded to the vocabulary)."""
    model = build_decoder(spec, dtype, attn_implementation, device)
    return model, build_tokenizer(model.config.vocab_size)


def build_decoder(spec: str, dtype: torch.dtype, attn_implementation: str, device: torch.device | str = "cpu"):
    """The model alone, on `device` in `dtype`, eval mode, no grad. On the meta device nothing is drawn (shapes
    only). A parameter's values depend on the seed, its name, the device type and the dtype only; with draw=cpu
    they are drawn on the CPU and moved, so a CPU and a GPU run the same model (a transfer check, docs/predict.md)."""
    from accelerate import init_empty_weights

    name, _, noise, seed = parse(spec)
    target_device = torch.device(device)
    host = _spec_params(spec)[1].get("draw") == "cpu" and target_device.type != "meta"
    device = torch.device("cpu") if host else target_device
    cls, config = build_config(spec, attn_implementation)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rope frequencies) computed
        model = cls(config)
    # a norm scales by its weight (Llama, Qwen3) or by 1 + its weight (gemma)
    norm_value = 0.0 if SHAPES[name].family == "gemma3" else 1.0
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for key, parameter in list(module._parameters.items()):
                if parameter is None:
                    continue
                full_name = f"{module_name}.{key}" if module_name else key
                tensor = torch.empty(parameter.shape, dtype=dtype, device=device)
                if device.type != "meta":
                    if full_name.endswith("norm.weight"):
                        tensor.fill_(norm_value)
                    else:
                        tensor.normal_(0.0, config.initializer_range, generator=_generator(device, seed, full_name))
                        if noise > 0:
                            tensor += torch.randn(tensor.shape, dtype=dtype, device=device,
                                                  generator=_generator(device, seed + 1, full_name)) \
                                * tensor.std() * noise
                module._parameters[key] = torch.nn.Parameter(tensor, requires_grad=False)
        if config.tie_word_embeddings:
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
    model = model.to(target_device).eval()  # the buffers (and, drawn on the host, the weights)
    model.generation_config.eos_token_id = 2
    return model
