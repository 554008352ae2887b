"""KVState hands the model no mask where every slot is real and a prebuilt 4-D mask elsewhere (for the model types
that take one): the logits are those of transformers' own path from the 2-D mask, which reads the mask on the host
first to decide (a sync at every one-token forward)."""
import pytest
import torch

from decode.kv import KVState, to_device
from tiny_models import ragged_batch, tiny_model


def steps(state: KVState, model, lengths) -> list[torch.Tensor]:
    """Prefill, a 4-token verification rolled back unevenly (holes), one-token steps, a finished row."""
    ids, mask = ragged_batch(lengths, seed=5)
    rows = len(lengths)
    logits = [state.forward(model, ids, mask, last_only=True)]
    logits.append(state.forward(model, torch.arange(4).repeat(rows, 1) + 10))
    kept = [1 + row % 4 for row in range(rows)]
    state.keep_prefix_of_last(4, torch.tensor(kept), max(kept), kept)
    for token in (20, 21):
        logits.append(state.forward(model, torch.full((rows, 1), token)))
    if rows > 1:
        state.select_rows(list(range(1, rows)))
        logits.append(state.forward(model, torch.full((rows - 1, 2), 22)))
    return logits


@pytest.mark.parametrize("arch,attention", [("llama", "sdpa"), ("llama", "eager"), ("gpt2", "sdpa"), ("qwen2", "sdpa")])
@pytest.mark.parametrize("lengths", [[6], [3, 8, 1]], ids=["batch1", "ragged3"])
@torch.inference_mode()
def test_masks_give_transformers_own_logits(monkeypatch, arch, attention, lengths):
    model = tiny_model(arch, seed=1, layers=2)
    model.set_attn_implementation(attention)
    ours = steps(KVState(), model, lengths)
    handed = []
    real = KVState._attention_mask
    monkeypatch.setattr(KVState, "_attention_mask", lambda self, model, feed, position_ids: handed.append(
        real(self, model, feed, position_ids)) or to_device(self.mask, feed))  # transformers builds from the 2-D mask
    theirs = steps(KVState(), model, lengths)
    kinds = {"none" if m is None else f"{m.dim()}-d" for m in handed}
    assert kinds == ({"none"} if len(lengths) == 1 else {"4-d"})  # ragged rows keep their left padding
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, b), f"step {step}"


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@torch.inference_mode()
def test_sliding_window_masks_built_on_the_device_give_transformers_own_logits(monkeypatch, arch, attention):
    """A windowed model's cache is hole-free; its masks are built on the device from the 2-D mask (no host read):
    the logits are those of transformers' own path from the 2-D mask, with a window (3) shorter than the rows."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, sliding_window=3, initializer_range=0.2)
    torch.manual_seed(0)
    model = (Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=0, **common)) if arch == "qwen2"
             else MistralForCausalLM(MistralConfig(**common))).eval()
    model.set_attn_implementation(attention)
    ours = steps(KVState(), model, [3, 8, 1])
    handed = []
    real = KVState._attention_mask
    monkeypatch.setattr(KVState, "_attention_mask", lambda self, model, feed, position_ids: handed.append(
        real(self, model, feed, position_ids)) or to_device(self.mask, feed))
    theirs = steps(KVState(), model, [3, 8, 1])
    assert all(isinstance(m, dict) or m.dim() == 4 for m in handed)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.allclose(a, b, atol=1e-5), f"step {step}"
