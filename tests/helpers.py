"""Tiny models saved to a folder, configs that use them, and launch.py run in a subprocess."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[1]  # the repository
# the interpreter of an environment with vLLM's CPU build (.ci/vllm-env DIR builds one); "" where none is given
VLLM_PYTHON = os.environ.get("SPECULATE_VLLM_PYTHON", "")


@functools.cache
def vllm_imports() -> bool:
    """Whether VLLM_PYTHON imports vllm (from /, so that no folder of the repository shadows a package); asked once
    per test session."""
    if not VLLM_PYTHON:
        return False
    try:
        return subprocess.run([VLLM_PYTHON, "-c", "import vllm"], capture_output=True, timeout=120,
                              cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def needs_vllm():
    """A module's pytestmark: skipped unless VLLM_PYTHON imports vllm."""
    return pytest.mark.skipif(not vllm_imports(), reason="SPECULATE_VLLM_PYTHON does not name a python with vllm")


# word tokenizer ids (word_tokenizer: 3..95 are words) for vLLM's engine: repeated phrases give the n-gram proposer
# matches
WORD_PROMPTS = [
    [1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7],
    [1, 20, 21, 22, 20, 21, 22, 20, 21],
    [1, 40, 41, 42, 43, 44, 45],
    [1, 60, 61, 60, 61, 60],
    [1, 9, 30, 9, 30, 11, 9, 30, 11, 9],
    [1, 70, 71, 72, 73, 70, 71],
]

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


def save_vllm_pair(root: Path) -> tuple[Path, Path]:
    """A tiny Llama pair vLLM's CPU build serves: 2 layers, hidden 256, 4 heads of 64. The draft is the target's first
    layer with its embeddings, final norm and head, so that it agrees with the target now and then."""
    target = tiny_model("llama", seed=1, layers=2, hidden=256, vocab_size=len(WORDS))
    draft = tiny_model("llama", seed=2, layers=1, hidden=256, vocab_size=len(WORDS))
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if ".layers.1." not in k})
    paths = []
    for name, model in [("target", target), ("draft", draft)]:
        model.save_pretrained(root / name)
        word_tokenizer().save_pretrained(root / name)
        paths.append(root / name)
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


def run_launch(args, env_extra=None, timeout=180):
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env_extra or {}))
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_one_clean_line(result, fragment):
    """Bad input: exit code 2 and one line on stderr, naming what is wrong, with no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment in lines[0], lines[0]
    assert lines[0].startswith("error: ")
