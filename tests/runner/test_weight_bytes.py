"""What the cost probe records for host_bound: each model's weight bytes as held (packed, tied, quantized), and on CUDA
the GPU's busy time of a forward (the union of its kernels' spans). Counts worked out by hand from the configs."""
from types import SimpleNamespace

import pytest
import torch

from eval.records import CostProbe
from runner.probes import busy_time_s, measure_costs, weight_bytes
from tiny_models import VOCAB, ragged_batch, tiny_model

# tiny Llama, width 64, MLP 128, 4 heads of 16, 2 KV heads: q 64x64, k and v 64x32, o 64x64, MLP 3 x 64x128, 2 norms
LAYER = 4096 + 2048 + 2048 + 4096 + 3 * 8192 + 2 * 64  # 36,992 parameters
ROTARY = 2 * 8 * 4  # inv_freq and original_inv_freq: 8 fp32 each (head dim 16 / 2)


def llama_bytes(layers: int) -> int:
    """fp32: the layers, untied embeddings and head (96 x 64 each), the final norm, the rotary buffers."""
    return 4 * (layers * LAYER + 2 * VOCAB * 64 + 64) + ROTARY


def test_a_model_s_bytes_by_hand():
    assert llama_bytes(1) == 197_440
    assert weight_bytes(tiny_model("llama", layers=1)) == 197_440
    assert weight_bytes(tiny_model("llama", layers=3)) == llama_bytes(3) == 493_376


def test_a_tied_embedding_is_counted_once():
    # GPT-2, width 64, 1 block: wte 96x64 (the head shares it), wpe 512x64, ln_1, c_attn 64x192+192, c_proj 64x64+64,
    # ln_2, c_fc 64x256+256, c_proj 256x64+64, ln_f; a LayerNorm has weight and bias
    model = tiny_model("gpt2", layers=1)
    assert model.lm_head.weight is model.transformer.wte.weight
    params = 6144 + 32768 + 128 + 12480 + 4160 + 128 + 16640 + 16448 + 128
    assert weight_bytes(model) == 4 * params == 356_096


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not available")
def test_packed_linears_are_counted():
    from utils.cpu_linear import pack_linears

    model = tiny_model("llama", layers=1)
    assert pack_linears(model) == 8  # q, k, v, o, gate, up, down, the head
    # its parameters are now the embedding and the norms: the packed weights are plain attributes of PackedLinear
    assert sum(p.numel() for p in model.parameters()) == VOCAB * 64 + 3 * 64
    assert weight_bytes(model) == 197_440


def test_what_a_quantized_parameter_carries_is_counted():
    """bitsandbytes keeps a 4-bit weight as packed uint8 data with a quant_state beside it (absmax, a code shared
    between weights, a nested state2); built here as such (bitsandbytes is not installed)."""
    code = torch.zeros(256)  # 1,024 bytes, shared
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.zeros(32, dtype=torch.uint8), requires_grad=False)  # 64 4-bit values
    module.weight.quant_state = SimpleNamespace(absmax=torch.zeros(4, dtype=torch.uint8), code=code,
                                                state2=SimpleNamespace(absmax=torch.zeros(1), code=code))
    assert weight_bytes(module) == 32 + 4 + 1024 + 4


def test_busy_time_counts_overlapping_spans_once():
    assert busy_time_s([(5, 6), (0, 2), (1, 3)]) == 4  # [0, 3] and [5, 6]
    assert busy_time_s([(0, 10), (2, 3)], unit_s=1e-6) == pytest.approx(10e-6)  # one inside another
    assert busy_time_s([]) == 0


def test_the_cost_probe_records_the_weight_bytes_and_no_busy_time_on_a_cpu(monkeypatch):
    import runner.probes as probes

    target, draft = tiny_model("llama", seed=1, layers=3), tiny_model("llama", seed=2, layers=1)
    monkeypatch.setattr(probes, "_timed_target_step", lambda *args: 1.0)
    monkeypatch.setattr(probes, "_timed_draft_step", lambda *args: 0.4)
    monkeypatch.setattr(probes, "_timed_verification", lambda *args: 1.0)
    ids, mask = ragged_batch([7, 12], seed=3)
    costs = measure_costs(target, {"d": draft}, ids, mask, [3], clock=None)
    assert costs.target_weight_bytes == 493_376 and costs.draft_weight_bytes == {"d": 197_440}
    assert costs.target_busy_s is None and costs.draft_busy_s == {}
    again = CostProbe.from_json(costs.to_json())  # as progress.json keeps it
    assert again.bytes_ratio_for("d") == pytest.approx(197_440 / 493_376) and again.busy_share_for("d") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_busy_times_are_recorded():
    from decode import Clock

    device = torch.device("cuda")
    target, draft = tiny_model("llama", seed=1, layers=3).to(device), tiny_model("llama", seed=2, layers=1).to(device)
    ids, mask = ragged_batch([7, 12], seed=3)
    with torch.inference_mode():
        costs = measure_costs(target, {"d": draft}, ids.to(device), mask.to(device), [3], Clock(device), reps=3)
    assert costs.target_busy_s > 0 and costs.draft_busy_s["d"] > 0
    # a forward's kernels run inside its wall time: a busy share past 1 would be a measuring error
    # (20% allowed: busy and wall are medians of different repetitions)
    assert 0 < costs.busy_share_for("d") < 1.2 and 0 < costs.busy_share_for(None) < 1.2
