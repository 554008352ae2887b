"""engine.compile: the static-cache compiled step (decode/static_kv.py) gives the eager engine's tokens, rounds
and distribution (chains and token trees), compiles at its warmup and never after, each model only at the widths it
uses, and attends with grouped-query attention's K/V heads as they are.

Most tests compile with dynamo's "eager" backend: the same graph capture, guards and recompilation as inductor,
without generating code (seconds, not minutes); one test compiles with inductor, as a run does."""
from types import SimpleNamespace

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.early_exit import EarlyExitDrafter
from decode.drafters.draft_tree import DynamicTree, StaticTree
from decode.kv import KVState
from decode.compile_plan import compile_widths
from decode.static_kv import CompiledModel, CompileRefused, StaticKVState, attach, new_state
from decode.tree_layout import static_parents
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts, sampling_pair
from test_sliding_window import tiny_windowed
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model


def compiled_copy(model, widths, max_length, batch_sizes, backend="eager", tree_widths=(), head_layers=()):
    """The same weights, with a compiled step attached (the eager original stays eager)."""
    import copy

    twin = copy.copy(model)  # shares every module and weight; its own attributes
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, batch_sizes, backend=backend, tree_widths=tree_widths,
                               head_layers=head_layers))
    return twin


def point(method, gamma=None, tree=None, draft=None):
    return SimpleNamespace(method=method, draft=draft or ("d" if method == "speculative" else None), gamma=gamma,
                           tree=tree)


def run(target, draft, ids, mask, gamma, max_new_tokens=24, sampling=Sampling(), seed=0):
    generation = Generation(max_new_tokens=max_new_tokens, sampling=sampling)
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        return generate_speculative(target, DraftModelDrafter(draft, VOCAB, sampling, generator), ids, mask,
                                    generation, gamma, generator)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "qwen2-window", "gemma3-window", "mistral-window"])
def test_compiled_greedy_equals_eager_and_baseline(arch):
    torch._dynamo.reset()  # the graph counts below are this test's (an earlier test's graphs of this shape would serve)
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
    plan = compile_widths([point("baseline"), point("speculative", gamma)], 4, ())
    assert plan["target"] == ((1, gamma + 1), ()) and plan["drafts"] == {"d": ((1, 2), ())}
    ctarget = compiled_copy(target, plan["target"][0], max_length, (5,))
    cdraft = compiled_copy(draft, plan["drafts"]["d"][0], max_length, (5,))
    with torch.inference_mode():
        cbase = generate_baseline(ctarget, ids, mask, Generation(max_new_tokens=24))
    compiled = run(ctarget, cdraft, ids, mask, gamma)
    for row in range(len(lengths)):
        assert cbase[row].output_ids == base[row].output_ids, f"compiled baseline, row {row}"
        assert compiled[row].output_ids == base[row].output_ids, f"compiled speculative, row {row}"
        assert compiled[row].rounds == eager[row].rounds, f"row {row}: other drafts or acceptances than eager"
    # a later batch of the same capacity (3 live rows of 5, two dead from the start) compiles nothing new
    for model in (ctarget, cdraft):  # as the runner does after a warmup
        with torch.inference_mode():
            model._speculate_compiled.precompile(ids, mask)
        model._speculate_compiled.warm = True
    ids3, mask3 = ragged_batch([4, 9, 2], seed=3)
    with torch.inference_mode():
        base3 = generate_baseline(target, ids3, mask3, Generation(max_new_tokens=24))
    again = run(ctarget, cdraft, ids3, mask3, gamma)
    assert [r.output_ids for r in again] == [r.output_ids for r in base3]
    assert ctarget._speculate_compiled.recompiles_after_warmup == 0
    assert cdraft._speculate_compiled.recompiles_after_warmup == 0
    # each model compiled only its own widths at capacity 5: the target 1 and gamma + 1, the draft 1 and 2 (its
    # catch-up after a full accept), for the rounds that run step by step (a row's last, short of gamma); the target
    # also holds the fused round's two graphs (its drafts, then its verification: decode/round_graph.py), counted as
    # its own
    assert ctarget._speculate_compiled.compiles == 2 + 2
    assert cdraft._speculate_compiled.compiles == 2


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
    assert ctarget._speculate_compiled.compiles == 2 + 2  # its widths 1 and gamma + 1; the fused round's two graphs
    assert ctarget._speculate_compiled.recompiles_after_warmup == 0
    assert cdraft._speculate_compiled.recompiles_after_warmup == 0


def test_compiled_speculative_sampling_matches_target_distribution():
    sampling = Sampling(True, 1.0)
    target, draft = sampling_pair()
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
    statistic, critical = chi_square(joint_counts(spec), exact_joint_of_tokens_2_and_3(target, sampling))
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
    head_columns = []  # the LM head's input width at the prefill: the last column alone, as the eager cache's
    hook = model.lm_head.register_forward_hook(lambda module, args, out: head_columns.append(args[0].shape[1]))
    with torch.inference_mode():
        torch.testing.assert_close(static.forward(cmodel, ids, mask, last_only=True),
                                   eager.forward(model, ids, mask, last_only=True), rtol=1e-4, atol=1e-4)
        hook.remove()
        assert head_columns == [1, 1]
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


def test_compile_widths_per_model_by_hand():
    """The target compiles its verification widths, each draft 1 and 2 and its trees' draft forwards."""
    points = [point("baseline"), point("speculative", 4), point("speculative", 3, "3-2-1"),
              point("speculative", 4, "dynamic-8"), point("prompt_lookup", 4, "2-2"), point("early_exit", 2)]
    plan = compile_widths(points, tree_top_k=2, auto_nodes=(1, 2))
    # chains: 1 and gamma + 1 (early exit's 3 too); trees: 3 + 6 + 6 + 1 = 16, 8 + 1 = 9, 2 + 4 + 1 = 7
    assert plan["target"] == ((1, 3, 5), (7, 9, 16))
    # the static tree feeds its 3 depth-1 nodes, then 6 at depth 2 (its leaves are never fed); dynamic: top_k 2
    assert plan["drafts"] == {"d": ((1, 2), (2, 3, 6))}
    assert plan["round"] == 16  # the widest: the static tree's verification (its draft region: 3 + 6 + 6 = 15)
    # auto: each node count it may pick, and its warmup's exploring tree [4, 2, 2, ...] trimmed to gamma 3: 28 nodes
    auto = compile_widths([point("speculative", 3, "auto")], tree_top_k=4, auto_nodes=(1, 2, 3, 4, 6))
    assert auto["target"] == ((1,), (2, 3, 4, 5, 7, 29))
    assert auto["drafts"]["d"] == ((1, 2), (1, 2, 4, 8, 16, 32))
    # every method of rounds verifies at gamma + 1 (suffix's chain too); hybrid's draft model steps 1 and 2, and its
    # merged tree of a free chain and the draft's (3 + 3 nodes) verifies at 7, medusa's 3-2 tree (9 nodes) at 10;
    # a head has no compiled widths
    others = compile_widths([point("suffix", 2), point("hybrid", 3, draft="h"), point("eagle3", 4, draft="e3"),
                             point("medusa", 2, "3-2", draft="m")], tree_top_k=4, auto_nodes=())
    assert others["target"] == ((1, 3, 4, 5), (7, 10)) and others["drafts"] == {"h": ((1, 2), ())}


TREES = {"static": lambda: StaticTree(static_parents([2, 2, 1]), Sampling()),
         "dynamic": lambda: DynamicTree(budget=10, top_k=2, sampling=Sampling())}


@pytest.mark.parametrize("arch, kind", [("llama", "static"), ("llama", "dynamic"), ("mistral-window", "static")])
def test_compiled_trees_greedy_equal_eager_and_baseline(arch, kind):
    """Token trees through the compiled tree step (the ancestor term of the in-graph mask): the baseline's tokens and
    the eager tree engine's rounds, at batch 1 and on a ragged batch with dead rows, nothing compiled after."""
    torch._dynamo.reset()  # dynamo's graphs serve any model of the same structure: an earlier test's would serve here
    target = tiny_windowed("mistral", window=4, seed=1, layers=3) if arch.endswith("-window") \
        else tiny_model(arch, seed=1, layers=3)
    draft = noisy_copy(target, 0.1)  # less one layer: not the target's shape, so no graph of one serves the other
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    label = "2-2-1" if kind == "static" else "dynamic-10"
    gamma = 3
    plan = compile_widths([point("speculative", gamma, label)], tree_top_k=2, auto_nodes=())
    steps, trees = plan["target"]
    assert trees == (11,)  # 2 + 4 + 4 nodes and the root; the dynamic tree: its budget 10 and the root
    ctarget = compiled_copy(target, steps, 64, (1, 4), tree_widths=trees)
    cdraft = compiled_copy(draft, *plan["drafts"]["d"][:1], 64, (1, 4), tree_widths=plan["drafts"]["d"][1])
    generation = Generation(16, Sampling(), (2,))
    rounds = []
    for index, lengths in enumerate(([6], [5, 9, 1, 7], [4, 8, 2])):  # the last: a later batch, a dead row
        ids, mask = ragged_batch(lengths, seed=index)
        if index == 2:  # as the runner does after a warmup: every width at every capacity, then no more compiles
            for model in (ctarget, cdraft):
                with torch.inference_mode():
                    model._speculate_compiled.precompile(*ragged_batch([5, 9, 1, 7]))
                model._speculate_compiled.warm = True
        with torch.inference_mode():
            base = generate_baseline(target, ids, mask, generation)
            eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling(), tree=TREES[kind]()),
                                         ids, mask, generation, gamma)
            compiled = generate_speculative(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling(), tree=TREES[kind]()),
                                            ids, mask, generation, gamma)
        assert [r.output_ids for r in compiled] == [r.output_ids for r in base], f"batch {lengths}"
        assert [r.rounds for r in compiled] == [r.rounds for r in eager], f"batch {lengths}: other rounds than eager"
        rounds += [r for c in compiled for r in c.rounds]
    # the test bites: a round accepts a node other than the draft's first choice, and one accepts deep
    assert any(any(rank > 0 for rank in r["ranks"]) for r in rounds) and any(r["accepted"] >= 2 for r in rounds)
    for model in (ctarget, cdraft):
        assert model._speculate_compiled.recompiles_after_warmup == 0
    # each model its own widths at capacities 1 and 4: the target 1 and the tree's 11, the draft 1, 2 and its tree
    # forwards' (the static tree feeds 2 nodes at depth 1 and 4 at depth 2; the dynamic one its top_k 2 a depth)
    fed = (2, 4) if kind == "static" else (2,)
    assert plan["drafts"]["d"] == ((1, 2), fed)
    assert ctarget._speculate_compiled.compiles == 2 * 2
    assert cdraft._speculate_compiled.compiles == (2 + len(fed)) * 2


def test_compiled_step_attends_with_the_kv_heads_as_they_are():
    """Grouped-query attention (4 query heads, 2 K/V heads): the compiled step's graph hands scaled_dot_product_attention
    K and V of 2 heads (enable_gqa), where transformers' sdpa path would repeat them to 4 (a copy per layer per step)."""
    model = tiny_model("llama", seed=1, layers=2)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def key_heads(compiled_model):
        state = StaticKVState(compiled_model)
        ids, mask = ragged_batch([5, 3])
        graphs.clear()
        with torch.inference_mode():
            state.forward(compiled_model.model, ids, mask, last_only=True)
            logits = state.forward(compiled_model.model, torch.tensor([[7], [8]]))
        calls = [n for g in graphs for n in g.graph.nodes if n.op == "call_function"
                 and "scaled_dot_product_attention" in str(n.target)]
        assert len(calls) == 2  # one per layer
        return [n.args[1].meta["example_value"].shape[1] for n in calls], logits

    compiled = CompiledModel(model, (1,), 32, (2,), backend=capture)
    assert compiled.summary()["gqa_attention"]
    heads, logits = key_heads(compiled)
    assert heads == [2, 2]
    assert model.config._attn_implementation == "sdpa"  # swapped only around the step's own calls
    stock = CompiledModel(model, (1,), 32, (2,), backend=capture)
    stock.gqa_configs = []  # transformers' own sdpa path: K and V repeated to the 4 query heads
    stock_heads, stock_logits = key_heads(stock)
    assert stock_heads == [4, 4]
    torch.testing.assert_close(logits, stock_logits, rtol=1e-5, atol=1e-5)


def test_cuda_graph_recordings_and_skips_are_counted(monkeypatch):
    """No GPU here: a fake compiled step announces recordings as cudagraph trees do (dynamo's CUDAGRAPH_RECORDING
    callback) and bumps inductor's skip counter; the model counts both, and the recordings after its warmup. With
    CUDA graphs precompile runs every shape three times (capture at the second call)."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler
    from torch._dynamo.utils import counters

    model = tiny_model("llama", seed=1, layers=1)
    compiled = CompiledModel(model, (1, 3), 32, (2,), backend="eager")
    calls = []
    real_forward = compiled._forward

    def fake_step(buffers, ids, *rest):
        calls.append(ids.shape[1])
        if calls.count(ids.shape[1]) == 2:  # cudagraph trees: the second call of a shape records it
            with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "fake"):
                pass
        if ids.shape[1] == 3 and calls.count(3) == 1:
            counters["inductor"]["cudagraph_skips"] += 1
        return real_forward(buffers, ids, *rest)

    monkeypatch.setattr(compiled, "_step", fake_step)
    compiled.cudagraphs = True
    ids, mask = ragged_batch([4, 2])
    with torch.inference_mode():
        compiled.precompile(ids, mask)
    assert calls == [1, 3] * 3
    summary = compiled.summary()
    assert (summary["recordings"], summary["skips"], summary["recordings_after_warmup"]) == (2, 1, 0)
    compiled.warm = True
    calls.clear()
    state = StaticKVState(compiled)
    with torch.inference_mode():
        state.forward(model, ids, mask, last_only=True)
        state.forward(model, ids[:, -1:])  # the first call of this list: no recording
        state.forward(model, ids[:, -1:])  # its second: a recording after the warmup
    assert compiled.summary()["recordings_after_warmup"] == 1 and compiled.recordings == 3


def test_static_tree_rounds_follow_the_eager_cache_through_compactions():
    """As a tree drafter uses a cache: rounds of two tree forwards (the region grows between them), each ending with a
    path kept. The static buffers are small, so compaction runs in the middle of rounds too (the columns before the
    region compacted, the region moved as one block); every forward's logits equal the eager cache's."""
    import numpy as np

    model = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([6, 2, 4])
    cmodel = compiled_copy(model, (1,), 48, (3,), tree_widths=(2, 4))
    static, eager = new_state(cmodel), KVState()
    generator = torch.Generator().manual_seed(0)
    compactions_mid_round = 0
    with torch.inference_mode():
        static.forward(cmodel, ids, mask, last_only=True)
        eager.forward(model, ids, mask, last_only=True)
        for round_index in range(10):
            # depth 1: two nodes after the prefix (row 1's second is padding); depth 2: children of each, 3 of them
            first = torch.randint(3, VOCAB, (3, 2), generator=generator)
            parents1, valid1 = np.full((3, 2), -1), np.array([[True, True], [True, False], [True, True]])
            second = torch.randint(3, VOCAB, (3, 3), generator=generator)
            parents2, valid2 = np.array([[0, 0, 1]] * 3), np.array([[True, True, True], [True, True, False]] + [[True] * 3])
            for tokens, parents, valid, new_round in ((first, parents1, valid1, True), (second, parents2, valid2, False)):
                before = static.compactions
                logits = [state.forward_tree(m, tokens, parents, valid, new_round)
                          for state, m in ((static, cmodel), (eager, model))]
                valid_columns = torch.as_tensor(valid)
                torch.testing.assert_close(logits[0][valid_columns], logits[1][valid_columns], rtol=1e-4, atol=1e-4)
                compactions_mid_round += static.compactions > before and not new_round
            assert static.region_width == eager.region_width == 5
            keep = np.zeros((3, 5), dtype=bool)
            keep[:, round_index % 2] = True  # a path: a depth-1 node and one of its children
            keep[:, 2 + round_index % 2] = True
            keep[1, 1] = keep[1, 4] = False  # row 1's padding node and its child are never kept
            for state in (static, eager):
                state.keep_region(keep)
            tokens = torch.randint(3, VOCAB, (3, 1), generator=generator)  # the next round's root, a plain step
            torch.testing.assert_close(static.forward(cmodel, tokens), eager.forward(model, tokens), rtol=1e-4, atol=1e-4)
    assert compactions_mid_round >= 1
