"""engine.compile_scope: regional (decode/static_kv.py CompiledModel._regional): torch.compile traces one decoder layer
and every layer runs that one compiled code, giving the whole-compiled step's tokens and rounds. Dynamo's `eager`
backend: the same capture, guards and recompilation as inductor, without code generation."""
import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.static_kv import CompiledModel, StaticKVState, attach
from tiny_models import VOCAB, ragged_batch, tiny_model


def compiled_copy(model, widths, max_length, batch_sizes, backend="eager", scope="whole"):
    twin = copy.copy(model)  # shares every module and weight; its own attributes
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, batch_sizes, backend=backend, scope=scope))
    return twin


def speculative(target, draft, ids, mask, gamma):
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        return generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling(), generator), ids, mask,
                                    Generation(max_new_tokens=20), gamma, generator)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_regional_gives_the_whole_compiled_tokens_and_rounds(arch):
    torch._dynamo.reset()
    target, draft = tiny_model(arch, seed=1, layers=4), tiny_model(arch, seed=2, layers=2)
    gamma, ids_mask = 3, ragged_batch([5, 9, 2])
    ids, mask = ids_mask
    max_length = 9 + 20 + gamma + 2  # rollback holes fill it: compaction runs too
    runs = {}
    for scope in ("regional", "whole"):
        ctarget = compiled_copy(target, (1, gamma + 1), max_length, (3,), scope=scope)
        cdraft = compiled_copy(draft, (1, 2), max_length, (3,), scope=scope)
        with torch.inference_mode():
            base = generate_baseline(ctarget, ids, mask, Generation(max_new_tokens=20))
        if scope == "regional":  # the baseline's width-1 step: one layer's graph, run by all 4 layers
            assert ctarget._speculate_compiled.compiles == 1
        runs[scope] = (base, speculative(ctarget, cdraft, ids, mask, gamma), ctarget, cdraft)
    (wbase, wspec, *_), (rbase, rspec, rtarget, rdraft) = runs["whole"], runs["regional"]
    for row in range(3):
        assert rbase[row].output_ids == wbase[row].output_ids, f"baseline, row {row}"
        assert rspec[row].output_ids == wbase[row].output_ids, f"speculative, row {row}"
        assert rspec[row].rounds == wspec[row].rounds, f"row {row}: other drafts or acceptances"
    assert rdraft._speculate_compiled.summary()["scope"] == "regional"
    # after its steps the model is its eager self again: no forward left on a layer, every layer_idx back
    layers = rtarget._speculate_compiled.layers
    assert all("forward" not in layer.__dict__ for layer in layers)
    indices = [m.layer_idx for layer in layers for m in layer.modules() if hasattr(m, "layer_idx")]
    assert indices == list(range(4))


def test_regional_compiles_one_layer_once_for_every_layer():
    """Steps of a 2-layer and a 6-layer model: one graph each, of one layer's ops (the same count at both depths;
    the whole step's graph of 6 layers holds about 3 times the 2-layer one's)."""
    ops = {}
    for layers in (2, 6):
        torch._dynamo.reset()
        model = tiny_model("llama", seed=1, layers=layers)
        counter = CompileCounter()
        compiled = CompiledModel(model, (1,), 32, (1,), backend=counter, scope="regional")
        attach(model, compiled)
        ids, mask = ragged_batch([4])
        with torch.inference_mode():
            state = StaticKVState(compiled)
            state.forward(model, ids, mask, last_only=True)
            for token in (5, 6):
                state.forward(model, torch.tensor([[token]]))
        assert counter.frame_count == 1 and compiled.compiles == 1, f"{layers} layers"
        ops[layers] = counter.op_count
    assert ops[2] == ops[6] > 0
