"""Early-exit self-speculation: the draft is a view of the target's first layers that shares every weight, computes
what a truncated copy computes, refuses what it cannot build, drafts for greedy output equal to the baseline, and
keeps the target's distribution under sampling."""
import copy

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from torch import nn

import decode.sampling
from decode import Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters import EarlyExitDrafter
from decode.drafters.early_exit import early_exit_view, num_layers
from decode.drafters.schedules import HeuristicSchedule
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts
from tiny_models import VOCAB, ragged_batch, tiny_model

ARCHS = ["llama", "gpt2", "qwen2"]


def layers_of(model) -> nn.ModuleList:
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def truncated_copy(model, exit_layer: int):
    """An independent deep copy cut to exit_layer layers: what the view must compute."""
    truncated = copy.deepcopy(model)
    if hasattr(truncated, "transformer"):
        truncated.transformer.h = nn.ModuleList(list(truncated.transformer.h)[:exit_layer])
    else:
        truncated.model.layers = nn.ModuleList(list(truncated.model.layers)[:exit_layer])
        if getattr(truncated.config, "layer_types", None) is not None:
            truncated.config.layer_types = truncated.config.layer_types[:exit_layer]
    truncated.config.num_hidden_layers = exit_layer
    return truncated


@pytest.mark.parametrize("arch", ARCHS)
def test_view_shares_the_targets_weights_and_leaves_it_whole(arch):
    target = tiny_model(arch, seed=1, layers=3)
    view = early_exit_view(target, 2)
    target_pointers = {p.data_ptr() for p in target.parameters()}
    view_parameters = list(view.parameters())
    assert all(p.data_ptr() in target_pointers for p in view_parameters)  # no weight copied
    assert len(view_parameters) < len(list(target.parameters()))  # the third layer is not part of the view
    assert len(layers_of(view)) == 2 and layers_of(view)[1] is layers_of(target)[1]
    assert view.get_output_embeddings() is target.get_output_embeddings()  # the LM head, shared
    norm = "ln_f" if arch == "gpt2" else "norm"
    body = view.transformer if arch == "gpt2" else view.model
    target_body = target.transformer if arch == "gpt2" else target.model
    assert getattr(body, norm) is getattr(target_body, norm)  # the final norm, shared
    # the target is untouched: all its layers, its config
    assert len(layers_of(target)) == 3 and target.config.num_hidden_layers == 3
    assert view.config.num_hidden_layers == 2 and num_layers(view) == 2
    if getattr(target.config, "layer_types", None) is not None:
        assert len(view.config.layer_types) == 2 and len(target.config.layer_types) == 3


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("exit_layer", [1, 2])
def test_view_computes_the_truncated_model(arch, exit_layer):
    target = tiny_model(arch, seed=1, layers=3)
    ids, mask = ragged_batch([5, 8])
    with torch.inference_mode():
        view_logits = early_exit_view(target, exit_layer)(input_ids=ids, attention_mask=mask).logits
        reference = truncated_copy(target, exit_layer)(input_ids=ids, attention_mask=mask).logits
        full = target(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(view_logits, reference)
    assert not torch.allclose(view_logits, full)  # and not the full model's


def test_refuses_bad_exit_layers_and_layouts():
    target = tiny_model("llama", seed=1, layers=3)
    for bad in (0, 3, 4, -1):
        with pytest.raises(ValueError, match="exit_layer"):
            EarlyExitDrafter(target, bad, VOCAB, Sampling())

    class Unsupported(nn.Module):  # e.g. an encoder-decoder, or a layout other than model.layers / transformer.h
        def __init__(self):
            super().__init__()
            self.decoder = nn.ModuleList([nn.Linear(2, 2)])

    with pytest.raises(ValueError, match="not supported"):
        EarlyExitDrafter(Unsupported(), 1, VOCAB, Sampling())


def test_view_of_a_hooked_target_runs_only_its_layers():
    """accelerate's device-map hooks replace a module's forward with one bound to that module; the view rebinds
    it, or it would run the whole target."""
    target = tiny_model("llama", seed=1, layers=3)
    add_hook_to_module(target, AlignDevicesHook(io_same_device=True))
    add_hook_to_module(target.model, AlignDevicesHook(io_same_device=True))
    ran = []
    for index, layer in enumerate(target.model.layers):
        layer.register_forward_hook(lambda module, args, output, index=index: ran.append(index))
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        view_logits = early_exit_view(target, 1)(ids).logits
        assert ran == [0]
        ran.clear()
        target(ids)
        assert ran == [0, 1, 2]
        torch.testing.assert_close(view_logits, truncated_copy(target, 1)(ids).logits)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("exit_layer", [1, 2])
@pytest.mark.parametrize("lengths", [[9], [6, 13, 2, 9]], ids=["batch1", "ragged4"])
def test_greedy_output_equals_the_baseline(arch, exit_layer, lengths):
    target = tiny_model(arch, seed=1, layers=3)
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens=20)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        drafter = EarlyExitDrafter(target, exit_layer, VOCAB, Sampling())
        spec = generate_speculative(target, drafter, ids, mask, generation, 4)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"row {row} diverged"
        assert sum(r["emitted"] for r in s.rounds) + 1 == s.new_tokens
        assert s.target_forwards == 1 + len(s.rounds) and s.draft_forwards > len(s.rounds)
    assert len(layers_of(target)) == 3  # drafting left the target whole
    if len(lengths) > 1:
        assert sum(r["accepted"] for s in spec for r in s.rounds) > 0


def test_greedy_with_a_schedule():
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch([6, 13, 2, 9])
    generation = Generation(max_new_tokens=20)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        drafter = EarlyExitDrafter(target, 2, VOCAB, Sampling(), schedule=HeuristicSchedule(4))
        spec = generate_speculative(target, drafter, ids, mask, generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert len({r["drafted"] for s in spec for r in s.rounds}) > 1


def test_sampling_keeps_the_target_distribution(monkeypatch):
    """The joint of the 2nd and 3rd new tokens (both drafted by the first layer in the first round) against the
    target's exact joint; the same test rejects resampling from p after a rejection (its power)."""
    sampling = Sampling(True, 1.0)
    target = tiny_model("llama", seed=1, vocab_size=V, layers=2, hidden=32, init_range=0.3)
    rows = 12_000
    ids = PROMPT.expand(rows, -1).contiguous()
    generation = Generation(max_new_tokens=4, sampling=sampling)  # tokens 2..4 come from one round of 2 drafts

    def joint():
        generator = torch.Generator().manual_seed(0)
        drafter = EarlyExitDrafter(target, 1, V, sampling, generator)
        with torch.inference_mode():
            spec = generate_speculative(target, drafter, ids, torch.ones_like(ids), generation, 2, generator)
        return joint_counts(spec), spec

    counts, spec = joint()
    drafted = sum(s.rounds[0]["drafted"] for s in spec)
    assert drafted == 2 * rows
    assert 0.05 * drafted < sum(s.rounds[0]["accepted"] for s in spec) < 0.95 * drafted, "accepts and rejects occur"
    expected = exact_joint_of_tokens_2_and_3(target, sampling, PROMPT)
    statistic, critical = chi_square(counts, expected)
    assert statistic < critical, f"off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"
    monkeypatch.setattr(decode.sampling, "residual_distribution", lambda p, q: p)
    buggy, _ = joint()
    assert chi_square(buggy, expected)[0] > 2 * critical
