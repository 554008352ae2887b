"""Tiny random causal LMs built from a config in milliseconds: the workhorse of the tests."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96


def tiny_model(arch: str = "llama", seed: int = 0, vocab_size: int = VOCAB, layers: int = 2, hidden: int = 64,
               init_range: float = 0.2):
    """A random model; init_range well above the usual 0.02 makes logits peaked, so greedy ties are rare."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, initializer_range=init_range, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
        model = LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
        model = Qwen2ForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, **common)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    return model.float().eval()


def ragged_batch(lengths, vocab_size: int = VOCAB, seed: int = 0, pad_id: int = 0):
    """Left-padded random prompts [B, max(lengths)] avoiding special ids 0..2, and their mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, vocab_size, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids, mask


def noisy_copy(model, scale: float, seed: int = 7):
    """The model with Gaussian noise of `scale` times each tensor's spread added to every weight: a draft that
    agrees with it often, not always."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale * parameter.std())
    return draft


def save_medusa(heads, folder) -> Path:
    """Medusa heads (decode.head_models.MedusaHeads) as a folder in the FasterDecoding layout (medusa_lm_head.pt: the
    heads' own state dict), the folder users download: load_head reads it, nothing in the project writes one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.config.medusa_num_layers,
        "hidden_size": heads.config.hidden_size, "vocab_size": heads.config.vocab_size}, indent=1))
    torch.save({k: v.detach().cpu() for k, v in heads.medusa_head.state_dict().items()}, folder / "medusa_lm_head.pt")
    return folder
