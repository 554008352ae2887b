"""Packing gives back each mapped weight's file pages as soon as its packed copy exists (utils/cpu_linear.py,
utils/memory.py): the resident set no longer holds the weights twice while packing."""
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tiny_models import ragged_batch
from utils.cpu_linear import pack_linears
from utils.memory import drop_file_pages, file_mapped_ranges

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc (Linux)")
PAGE = 4096


def mapping_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of one file (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) == 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def mapped_model(tmp_path, tied: bool):
    """A model of linears of 256 KiB each, saved and loaded back by mmap as the runner loads it."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    weights = tmp_path / "model.safetensors"
    with torch.no_grad():
        for parameter in model.parameters():  # read every page, as packing does
            parameter.sum()
    if mapping_rss(weights) < weights.stat().st_size - 2 * PAGE:
        pytest.skip("the loader does not map safetensors any more: nothing to give back")
    return model, weights


def test_packing_gives_back_the_pages_of_each_packed_weight_and_computes_the_same(tmp_path):
    model, weights = mapped_model(tmp_path, tied=False)
    ids, mask = ragged_batch([5, 3], vocab_size=512)
    with torch.inference_mode():
        reference = model(input_ids=ids, attention_mask=mask).logits
    linears = [m.weight for m in model.modules() if type(m) is torch.nn.Linear]
    linear_bytes = sum(w.numel() * 4 for w in linears)  # 7 per layer + the head: ~4 MiB
    before = mapping_rss(weights)
    assert pack_linears(model) == len(linears)
    assert mapping_rss(weights) <= before - linear_bytes + 2 * PAGE * len(linears)  # at most the edge pages stay
    with torch.inference_mode():
        assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, reference, atol=1e-4)


def test_a_head_tied_to_the_embeddings_keeps_its_pages(tmp_path):
    model, weights = mapped_model(tmp_path, tied=True)
    embedding = model.get_input_embeddings().weight
    pack_linears(model)
    assert model.get_input_embeddings().weight is embedding  # still in use: its pages stay resident
    assert mapping_rss(weights) >= embedding.numel() * 4 - 2 * PAGE


def test_memory_of_its_own_is_never_dropped():
    tensor = torch.arange(4 * PAGE, dtype=torch.float32)  # anonymous memory: dropping it would zero it
    assert drop_file_pages(tensor, file_mapped_ranges()) == 0
    assert torch.equal(tensor, torch.arange(4 * PAGE, dtype=torch.float32))
