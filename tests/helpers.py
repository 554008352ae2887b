"""Tiny models saved to a folder, and configs that use them."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tiny_models import tiny_model

WORDS = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(93)]


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="w0")


def save_tiny_pair(root: Path, arch: str = "llama") -> tuple[Path, Path]:
    paths = []
    for name, seed, layers in [("target", 1, 3), ("draft", 2, 1)]:
        folder = root / f"{arch}-{name}"
        if not folder.exists():
            tiny_model(arch, seed=seed, layers=layers, vocab_size=len(WORDS)).save_pretrained(folder)
            word_tokenizer().save_pretrained(folder)
        paths.append(folder)
    return paths[0], paths[1]


def write_prompts(path: Path, count: int = 6) -> Path:
    with open(path, "w") as handle:
        for i in range(count):
            words = " ".join(f"w{(i * 7 + j) % 90 + 3}" for j in range(3 + (i * 5) % 11))
            handle.write(json.dumps({"text": words, "answer": f"#### {i}"}) + "\n")
    return path


def base_config(target: Path, draft: Path, data: Path, **extra) -> dict:
    config = {
        "name": "tiny", "device": "cpu", "seed": 0,
        "target": {"model": str(target)}, "draft": {"model": str(draft)},
        "dataset": {"path": str(data), "preset": "none", "prompt_field": "text", "chat_template": False},
        "generation": {"max_new_tokens": 12},
        "speculative": {"gamma": [1, 3]},
        "batch_size": [1, 3],
        "warmup": 1,
    }
    config.update(extra)
    return config
