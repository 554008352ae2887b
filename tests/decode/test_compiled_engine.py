"""engine.compile: the static-cache compiled step (decode/static_kv.py) gives the eager engine's tokens, rounds
and distribution, compiles at its warmup and never after.

Most tests compile with dynamo's "eager" backend: the same graph capture, guards and recompilation as inductor,
without generating code (seconds, not minutes); one test compiles with inductor, as a run does."""
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.early_exit import EarlyExitDrafter
from decode.kv import KVState
from decode.static_kv import CompiledModel, CompileRefused, StaticKVState, attach, new_state
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3
from test_sliding_window import tiny_windowed
from tiny_models import VOCAB, ragged_batch, tiny_model


def compiled_copy(model, widths, max_length, batch_sizes, backend="eager"):
    """The same weights, with a compiled step attached (the eager original stays eager)."""
    import copy

    twin = copy.copy(model)  # shares every module and weight; its own attributes
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, batch_sizes, backend=backend))
    return twin


def run(target, draft, ids, mask, gamma, max_new_tokens=24, sampling=Sampling(), seed=0):
    generation = Generation(max_new_tokens=max_new_tokens, sampling=sampling)
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        return generate_speculative(target, DraftModelDrafter(draft, VOCAB, sampling, generator), ids, mask,
                                    generation, gamma, generator)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "qwen2-window", "gemma3-window", "mistral-window"])
def test_compiled_greedy_equals_eager_and_baseline(arch):
    if arch.endswith("-window"):  # window 4: every row's attention is cut by it within the first rounds
        target = tiny_windowed(arch.split("-")[0], window=4, seed=1)
        draft = tiny_windowed(arch.split("-")[0], window=4, seed=2, layers=1)
    else:
        target, draft = tiny_model(arch, seed=1, layers=2), tiny_model(arch, seed=2, layers=1)
    gamma, lengths = 3, [5, 11, 1, 8, 3]
    ids, mask = ragged_batch(lengths)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, Generation(max_new_tokens=24))
    eager = run(target, draft, ids, mask, gamma)
    # room for the prompt, 24 tokens and a step: rollback holes fill it, so compaction runs too
    max_length = 11 + 24 + gamma + 2
    ctarget = compiled_copy(target, (1, gamma + 1), max_length, (5,))
    cdraft = compiled_copy(draft, (1, gamma + 1), max_length, (5,))
    with torch.inference_mode():
        cbase = generate_baseline(ctarget, ids, mask, Generation(max_new_tokens=24))
    compiled = run(ctarget, cdraft, ids, mask, gamma)
    for row in range(len(lengths)):
        assert cbase[row].output_ids == base[row].output_ids, f"compiled baseline, row {row}"
        assert compiled[row].output_ids == base[row].output_ids, f"compiled speculative, row {row}"
        assert compiled[row].rounds == eager[row].rounds, f"row {row}: other drafts or acceptances than eager"
    # a later batch of the same capacity (3 live rows of 5, two dead from the start) compiles nothing new
    for model in (ctarget, cdraft):
        model._speculate_compiled.warm = True
    ids3, mask3 = ragged_batch([4, 9, 2], seed=3)
    with torch.inference_mode():
        base3 = generate_baseline(target, ids3, mask3, Generation(max_new_tokens=24))
    again = run(ctarget, cdraft, ids3, mask3, gamma)
    assert [r.output_ids for r in again] == [r.output_ids for r in base3]
    assert ctarget._speculate_compiled.recompiles_after_warmup == 0
    assert cdraft._speculate_compiled.recompiles_after_warmup == 0
    assert ctarget._speculate_compiled.compiles == 2  # widths 1 and gamma + 1 at capacity 5


def test_inductor_compiled_run_is_exact_and_compiles_once_per_width():
    target, draft = tiny_model("llama", seed=1, layers=1), tiny_model("llama", seed=2, layers=1)
    ids, mask = ragged_batch([6, 3])
    gamma = 2
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, Generation(max_new_tokens=12))
    ctarget = compiled_copy(target, (1, gamma + 1), 40, (2,), backend="inductor")
    cdraft = compiled_copy(draft, (1, gamma + 1), 40, (2,), backend="inductor")
    with torch.inference_mode():  # the baseline's 1-token steps: the target's second width
        cbase = generate_baseline(ctarget, ids, mask, Generation(max_new_tokens=12))
    first = run(ctarget, cdraft, ids, mask, gamma, max_new_tokens=12)
    for model in (ctarget, cdraft):
        model._speculate_compiled.warm = True
    second = run(ctarget, cdraft, ids, mask, gamma, max_new_tokens=12)
    assert [r.output_ids for r in cbase] == [r.output_ids for r in base]
    assert [r.output_ids for r in first] == [r.output_ids for r in second] == [r.output_ids for r in base]
    assert ctarget._speculate_compiled.compiles == 2
    assert ctarget._speculate_compiled.recompiles_after_warmup == 0
    assert cdraft._speculate_compiled.recompiles_after_warmup == 0


def test_compiled_speculative_sampling_matches_target_distribution():
    sampling = Sampling(True, 1.0)
    target = tiny_model("llama", seed=1, vocab_size=V, layers=2, hidden=32, init_range=0.3)
    draft = tiny_model("llama", seed=7, vocab_size=V, layers=1, hidden=32, init_range=0.3)
    rows = 20_000
    ids = PROMPT.expand(rows, -1).contiguous()
    mask = torch.ones_like(ids)
    ctarget = compiled_copy(target, (1, 3), 16, (rows,))
    cdraft = compiled_copy(draft, (1, 3), 16, (rows,))
    generation = Generation(max_new_tokens=4, sampling=sampling)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        spec = generate_speculative(ctarget, DraftModelDrafter(cdraft, V, sampling, generator), ids, mask,
                                    generation, gamma=2, generator=generator)
    assert all(r.rounds[0]["drafted"] == 2 for r in spec)
    pairs = torch.tensor([r.output_ids[1] * V + r.output_ids[2] for r in spec])
    statistic, critical = chi_square(torch.bincount(pairs, minlength=V * V), exact_joint_of_tokens_2_and_3(target, sampling))
    assert statistic < critical, f"compiled speculative sampling is off the target's distribution: chi2 {statistic:.1f}"


def test_steps_pad_to_the_compiled_widths_and_padding_is_rolled_back():
    """A 2-token step at widths (1, 4) runs at 4; its 2 padding columns leave no trace: the next token's logits
    equal the eager cache's."""
    model = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([5, 3])
    cmodel = compiled_copy(model, (1, 4), 32, (2,))
    seen = []
    real_run = cmodel._speculate_compiled.run
    cmodel._speculate_compiled.run = lambda buffers, ids_, *rest, **kw: seen.append(ids_.shape[1]) or real_run(
        buffers, ids_, *rest, **kw)
    static, eager = new_state(cmodel), new_state(model)
    assert isinstance(static, StaticKVState) and not isinstance(eager, StaticKVState)
    step = torch.tensor([[7, 8], [9, 10]])
    with torch.inference_mode():
        for state, m in ((static, cmodel), (eager, model)):
            state.forward(m, ids, mask, last_only=True)
            state.forward(m, step)
        logits = [state.forward(m, torch.tensor([[11], [12]])) for state, m in ((static, cmodel), (eager, model))]
    assert seen == [5, 4, 1]  # the prefill eager at its own width, then 2 -> 4, then 1
    assert static.length == 5 + 2 + 1
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_early_exit_view_gets_its_own_compiled_step_once():
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch([5, 7])
    ctarget = compiled_copy(target, (1, 3), 40, (2,))
    drafters = [EarlyExitDrafter(ctarget, 1, VOCAB, Sampling()) for _ in range(2)]
    assert drafters[0].model is drafters[1].model  # one view per depth: compiled once, not per batch
    view_compiled = drafters[0].model._speculate_compiled
    assert view_compiled is not ctarget._speculate_compiled and view_compiled.model is drafters[0].model
    generation = Generation(max_new_tokens=10)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(ctarget, drafters[0], ids, mask, generation, 2)
    assert [r.output_ids for r in spec] == [r.output_ids for r in base]


def test_refusals_are_one_line():
    model = tiny_model("llama", seed=1, layers=1)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(CompileRefused, match="'flash_attention_2' takes no prebuilt mask"):
        CompiledModel(model, (1, 3), 32, (1,))
    model.config._attn_implementation = "sdpa"
    compiled = CompiledModel(model, (1, 3), 32, (1, 4))
    assert compiled.capacity(3) == 4 and compiled.capacity(1) == 1
    with pytest.raises(CompileRefused, match="above the configured batch sizes"):
        compiled.capacity(5)


def test_static_state_follows_the_eager_cache_through_multi_step_rollbacks_and_compactions():
    """As a drafter uses it: several steps, then a rollback of all of them keeping a prefix per row. One row keeps
    2 tokens a round, a different one each round: the columns in use grow twice as fast as any row, so the small
    static buffers compact in the middle of rounds; every step's logits equal the eager cache's."""
    model = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([6, 2, 4])
    cmodel = compiled_copy(model, (1, 2, 3), 20, (3,))
    static, eager = new_state(cmodel), KVState()
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        static.forward(cmodel, ids, mask, last_only=True)
        eager.forward(model, ids, mask, last_only=True)
        for round_index in range(12):
            for _ in range(3):  # a last token and two drafts, one step each
                tokens = torch.randint(3, VOCAB, (3, 1), generator=generator)
                torch.testing.assert_close(static.forward(cmodel, tokens), eager.forward(model, tokens),
                                           rtol=1e-4, atol=1e-4)
            fed = 3
            kept = torch.zeros(3, dtype=torch.long)
            kept[round_index % 3] = 2
            for state in (static, eager):
                state.keep_prefix_of_last(fed, kept, int(kept.max()))
    assert static.compactions >= 1
