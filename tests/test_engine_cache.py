"""Rollback by masking, compaction and the vocabulary check."""
import pytest
import torch

import decode.kv as kv
from decode import DraftModelDrafter, Generation, Sampling, VocabMismatch, check_vocab_compatible, generate_baseline, generate_speculative
from tiny_models import VOCAB, ragged_batch, tiny_model


@pytest.mark.parametrize("hole_fraction", [0.0, 1.0], ids=["compact-every-round", "never-compact"])
def test_outputs_do_not_depend_on_compaction(monkeypatch, hole_fraction):
    monkeypatch.setattr(kv, "COMPACT_HOLE_FRACTION", hole_fraction)
    target, draft = tiny_model("qwen2", seed=1, layers=2), tiny_model("qwen2", seed=5, layers=1)
    ids, mask = ragged_batch([3, 10, 6, 1, 8], seed=3)
    generation = Generation(max_new_tokens=30)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]


def test_compaction_keeps_each_row_in_order():
    state = kv.KVState()
    state.mask = torch.tensor([[0, 1, 0, 1, 1], [1, 1, 0, 0, 1]])
    keys = torch.arange(10.).view(2, 1, 5, 1)

    class Layer:
        is_initialized = True

    layer = Layer()
    layer.keys, layer.values = keys.clone(), keys.clone()
    state.cache = type("C", (), {"layers": [layer]})()
    state.compact()
    assert state.mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert layer.keys.flatten().tolist() == [1., 3., 4., 5., 6., 9.]


class FakeTokenizer:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_vocab_check_accepts_padded_rows_and_refuses_other_tokenizers():
    vocab = {f"t{i}": i for i in range(100)}
    assert check_vocab_compatible(FakeTokenizer(vocab), FakeTokenizer(vocab), 128, 112) == 112
    other = dict(vocab); other["t5"], other["t6"] = 6, 5
    with pytest.raises(VocabMismatch, match="tokenizers differ"):
        check_vocab_compatible(FakeTokenizer(vocab), FakeTokenizer(other), 128, 128)
    with pytest.raises(VocabMismatch, match="output rows"):
        check_vocab_compatible(FakeTokenizer(vocab), FakeTokenizer(vocab), 64, 128)
