"""KV cache compaction: it frees rollback holes only (left padding is not a hole), keeps each row's slots in order,
and the tokens do not depend on it."""
import pytest
import torch

import decode.kv as kv
from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from tiny_models import VOCAB, ragged_batch, tiny_model


def prefilled(lengths, arch="llama"):
    model = tiny_model(arch, seed=1, layers=2)
    ids, mask = ragged_batch(lengths, seed=3)
    state = kv.KVState()
    state.forward(model, ids, mask, last_only=True)
    return model, state


@torch.inference_mode()
def test_left_padding_alone_triggers_no_compaction():
    model, state = prefilled([1, 2, 1, 30])  # about 70% of the cache is left padding
    for _ in range(3):  # rounds that keep every new slot: no rollback holes
        state.forward(model, torch.full((4, 4), 7))
        state.keep_prefix_of_last(4, torch.full((4,), 4), 4)
    assert state.hole_counts()[:2] == (0, 0)
    assert state.compactions == 0 and state.slots_freed == 0
    assert state.length == 30 + 12


@torch.inference_mode()
def test_rollback_holes_past_the_threshold_are_compacted():
    model, state = prefilled([4, 4])
    state.forward(model, torch.full((2, 8), 7))
    state.keep_prefix_of_last(8, torch.tensor([1, 6]), 6)  # row 0: 5 holes of 20 slots past padding, below 25%
    assert state.compactions == 0 and state.hole_counts()[:2] == (5, 0)
    state.forward(model, torch.full((2, 4), 7))
    state.keep_prefix_of_last(4, torch.tensor([1, 4]), 4)  # row 0: 8 holes of 28, past 25%
    assert state.compactions == 1
    assert state.hole_counts()[:2] == (0, 0)
    assert state.mask.sum(dim=1).tolist() == [6, 14] and state.length == 14
    assert all(layer.keys.shape[2] == 14 for layer in state.cache.layers)


@torch.inference_mode()
def test_columns_no_row_uses_are_dropped_without_a_copy():
    model, state = prefilled([2, 20, 3])
    state.select_rows(torch.tensor([0, 2]))  # the longest row finished: 17 leading columns are padding of all rows
    assert state.compactions == 0 and state.slots_freed == 17 * 2
    assert state.length == 3 and all(layer.keys.shape[2] == 3 for layer in state.cache.layers)


def spy_on_compaction(monkeypatch) -> list[int]:
    """The cache length at each compaction, of every KVState (target's and draft's)."""
    compacted = []
    real_compact = kv.KVState.compact
    monkeypatch.setattr(kv.KVState, "compact", lambda self: (compacted.append(self.length), real_compact(self)))
    return compacted


def test_heavy_padding_costs_no_compaction_in_a_run(monkeypatch):
    compacted = spy_on_compaction(monkeypatch)
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([1, 2, 30, 1], seed=5)
    generation = Generation(max_new_tokens=12)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        # draft == target: every draft is accepted, so the target's cache never has a rollback hole
        same = generate_speculative(target, DraftModelDrafter(target, VOCAB, Sampling()), ids, mask, generation, 3)
    assert [s.output_ids for s in same] == [b.output_ids for b in base]
    assert not compacted


@pytest.mark.parametrize("hole_fraction", [0.0, 1.0], ids=["compact-every-round", "never-compact"])
def test_outputs_do_not_depend_on_compaction(monkeypatch, hole_fraction):
    monkeypatch.setattr(kv, "COMPACT_HOLE_FRACTION", hole_fraction)
    compacted = spy_on_compaction(monkeypatch)
    target, draft = tiny_model("qwen2", seed=1, layers=2), tiny_model("qwen2", seed=5, layers=1)
    ids, mask = ragged_batch([3, 10, 6, 1, 8], seed=3)
    generation = Generation(max_new_tokens=30)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert bool(compacted) == (hole_fraction == 0.0)  # the rollbacks left holes, compacted or kept


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
