"""The prepacked CPU engine (utils/cpu_linear.py): a packed linear computes nn.Linear, and greedy speculative decoding
stays exact on packed models."""
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from tiny_models import VOCAB, ragged_batch, tiny_model
from utils.cpu_linear import PackedLinear, pack_linears


def test_packed_linear_matches_nn_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    packed = PackedLinear(linear, batch_hint=4)
    for shape in [(1, 48), (3, 5, 48), (2, 1, 48)]:
        x = torch.randn(*shape)
        assert torch.allclose(packed(x), linear(x), atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_greedy_stays_exact_on_the_packed_engine(arch):
    target, draft = tiny_model(arch, seed=1, layers=3), tiny_model(arch, seed=2, layers=1)
    ids, mask = ragged_batch([4, 9, 2, 6])
    generation = Generation(max_new_tokens=20)
    with torch.inference_mode():
        reference = generate_baseline(target, ids, mask, generation)
        assert pack_linears(target) > 0 and pack_linears(draft) > 0
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base] == [r.output_ids for r in reference]
