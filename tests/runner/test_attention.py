"""attn_implementation auto with a choice (runner/attention.py): the fastest implementation that gives the
reference's greedy tokens on a padded batch with rollback holes is kept. The choosing rule is checked with
injected timings; the measurement runs for real on a CPU with eager and sdpa (no GPU, no flash-attn here), and a
mask-blind implementation is caught."""
import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from decode import Clock
from tiny_models import tiny_model
from runner.attention import AttentionReading, pick_attention, settle_attention
from utils.models import LoadedModel


def reading(name, ms, mismatches=0):
    return AttentionReading(name, ms / 1e3, mismatches, 40)


def test_the_faster_exact_implementation_is_kept_and_the_note_says_why():
    name, why = pick_attention([reading("sdpa", 3.0), reading("flash_attention_2", 2.0)], 8, 5)
    assert name == "flash_attention_2"
    assert why == ("auto -> flash_attention_2: a 5-token forward at batch 8 after a ragged prompt batch: sdpa 3.00 ms, "
                   "flash_attention_2 2.00 ms; all gave sdpa's greedy tokens (one measurement at load)")
    assert pick_attention([reading("sdpa", 1.5), reading("flash_attention_2", 2.0)], 8, 5)[0] == "sdpa"


def test_a_faster_implementation_with_other_greedy_tokens_is_not_kept():
    name, why = pick_attention([reading("sdpa", 3.0), reading("flash_attention_2", 1.0, mismatches=7)], 8, 5)
    assert name == "sdpa"
    assert "flash_attention_2 gave other greedy tokens than sdpa at 7 of 40 positions" in why


def tiny_loaded(candidates):
    model = tiny_model("llama", layers=2)
    model.set_attn_implementation(candidates[0])
    return LoadedModel(model, None, "tiny", "float32", candidates[0], "none", model.config.vocab_size,
                       attention_candidates=candidates)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_both_exact_implementations_are_measured_and_the_model_runs_the_pick(batch_size):
    loaded = tiny_loaded(("eager", "sdpa"))
    settle_attention(loaded, batch_size=batch_size, width=3, clock=Clock("cpu"))
    assert loaded.attn_implementation in ("eager", "sdpa")
    assert loaded.model.config._attn_implementation == loaded.attn_implementation
    assert loaded.attention_note.startswith(f"auto -> {loaded.attn_implementation}: a 3-token forward at batch "
                                            f"{batch_size}")
    assert "all gave sdpa's greedy tokens" in loaded.attention_note


@pytest.fixture
def mask_blind(monkeypatch):
    """An attention that ignores the mask (padding and holes attended to), registered for this test only."""
    def forward(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "mask_blind", forward)
    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "mask_blind", sdpa_mask)
    return "mask_blind"


@pytest.mark.parametrize("batch_size", [1, 4])
def test_an_implementation_blind_to_padding_and_holes_is_refused(mask_blind, batch_size):
    loaded = tiny_loaded((mask_blind, "sdpa"))
    settle_attention(loaded, batch_size=batch_size, width=3, clock=Clock("cpu"))
    assert loaded.attn_implementation == "sdpa"
    assert loaded.model.config._attn_implementation == "sdpa"
    assert "mask_blind gave other greedy tokens than sdpa at" in loaded.attention_note


def test_on_a_cpu_auto_is_sdpa_with_nothing_to_measure_and_the_note_says_why(tmp_path):
    from helpers import WORDS, word_tokenizer
    from utils.config import ModelConfig
    from utils.models import load_model

    tiny_model("llama", vocab_size=len(WORDS)).save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(ModelConfig(model=str(tmp_path)), torch.device("cpu"), "target")
    assert (loaded.attn_implementation, loaded.attention_candidates) == ("sdpa", ())
    assert loaded.attention_note == "auto -> sdpa (flash_attention_2 not usable: it needs a CUDA device, not cpu)"
    explicit = load_model(ModelConfig(model=str(tmp_path), attn_implementation="eager"), torch.device("cpu"), "target")
    assert (explicit.attn_implementation, explicit.attention_note) == ("eager", "")
