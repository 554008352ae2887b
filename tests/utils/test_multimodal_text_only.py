"""A multimodal checkpoint whose text model we use (gemma-3 4B and up) loads as its text-only causal LM: no vision
tower in memory, the same logits as the full model's language path."""
import torch
from transformers import Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration

from helpers import WORDS, word_tokenizer
from tiny_models import ragged_batch
from utils.config import ModelConfig
from utils.models import load_model


def tiny_gemma3(folder):
    torch.manual_seed(0)
    text = dict(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                sliding_window=8, layer_types=["sliding_attention", "full_attention"], initializer_range=0.2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=95,
                          boi_token_index=93, eoi_token_index=94)
    full = Gemma3ForConditionalGeneration(config).float().eval()
    full.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return full


def test_gemma3_loads_text_only_with_the_full_models_logits(tmp_path):
    full = tiny_gemma3(tmp_path)
    loaded = load_model(ModelConfig(model=str(tmp_path), dtype="float32"), torch.device("cpu"), "target")
    assert type(loaded.model) is Gemma3ForCausalLM
    names = [name for name, _ in loaded.model.named_parameters()]
    assert not [n for n in names if "vision" in n or "multi_modal" in n]
    text_parameters = sum(p.numel() for p in full.model.language_model.parameters())
    assert sum(p.numel() for p in loaded.model.parameters()) == text_parameters  # the head is tied to the embeddings
    assert "text model alone" in loaded.source
    ids, mask = ragged_batch([10, 6, 12], vocab_size=len(WORDS))  # past the sliding window of 8
    with torch.inference_mode():
        expected = full(input_ids=ids, attention_mask=mask).logits
        got = loaded.model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.allclose(got[real], expected[real], atol=1e-5)
