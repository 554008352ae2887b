"""decode/round_graph.py: a draft model's chain round (drafts, verification, acceptance, both rollbacks) as one function
over the static caches, traced by torch.compile(fullgraph=True) without a break, never recompiled after its first
round, and giving the eager engine's tokens (greedy and sampled)."""
import copy

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_speculative
from decode.round_graph import fusable, fused_round
from decode.sampling import logits_to_probs, sample
from decode.static_kv import CAPTURED, CompiledModel, attach, new_state
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model


def compiled_copy(model, widths, max_length, batch_sizes, backend="eager", mode=None):
    twin = copy.copy(model)
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, batch_sizes, mode=mode, backend=backend))
    return twin


def fused_generate(target, drafter, ids, mask, max_new_tokens, gamma, sampling=Sampling(), generator=None,
                   most_rounds=None, first_leaves_after=None, on_drafted=None):
    """A static batch's rounds as the engine's loop runs them (no EOS: each row ends at max_new_tokens and leaves),
    every round fused, until a round is not `fusable` (the last ones, whose budgets are below gamma) or after
    most_rounds. first_leaves_after: after that many rounds the first row leaves (as a row at EOS would). Returns
    each row's tokens so far and each round's accepted lengths."""
    with torch.inference_mode():
        state = new_state(target)
        logits = state.forward(target, ids, mask, last_only=True)[:, -1]
    return _rounds(state, target, drafter, logits, ids, mask, max_new_tokens, gamma, sampling, generator, most_rounds,
                   first_leaves_after, on_drafted)


def _rounds(state, target, drafter, logits, ids, mask, max_new_tokens, gamma, sampling, generator, most_rounds,
            first_leaves_after=None, on_drafted=None):
    """The rounds after the target's prefill (logits [B, V] of the first token): fused_generate's loop."""
    with torch.inference_mode():
        token = logits.argmax(dim=-1) if not sampling.do_sample else sample(
            logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p), generator)
        outputs, active = [[t] for t in token.tolist()], list(range(ids.shape[0]))
        drafter.start(ids, mask)
        drafter.observe(token.tolist())
        accepts = []
        while active and (most_rounds is None or len(accepts) < most_rounds):
            budget = [min(gamma, max_new_tokens - len(outputs[row]) - 1) for row in active]
            if not fusable(state, drafter, gamma, budget):
                break
            fused = fused_round(state, drafter, token, budget, gamma, sampling, generator, on_drafted)
            values = fused.readout().tolist()  # the round's one host read
            drafts = [v[3:] for v in values]
            fused.settle([v[0] for v in values], drafts)
            drafter.observe([v[1] for v in values], drafts)
            accepts.append([v[0] for v in values])
            for row, v in zip(active, values):
                outputs[row] += (v[3: 3 + v[0]] + [v[1]])[: max_new_tokens - len(outputs[row])]
            running = [i for i, row in enumerate(active) if len(outputs[row]) < max_new_tokens
                       and not (len(accepts) == first_leaves_after and row == 0)]
            token = fused.token
            if len(running) < len(active):
                state.select_rows(running)
                drafter.select_rows(torch.tensor(running))
                token = token[torch.tensor(running)]
                active = [active[i] for i in running]
    return outputs, accepts


def same_prefix(fused: list[list[int]], eager) -> bool:
    """Each row's fused tokens are the first of the eager engine's, and the fused rounds took most of them."""
    return all(f == e.output_ids[: len(f)] and len(f) > len(e.output_ids) // 2 for f, e in zip(fused, eager))


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 0.8, top_k=20)], ids=["greedy", "sampled"])
def test_fused_rounds_give_the_eager_engines_tokens(sampling):
    """A ragged batch of 3 with a row that ends first: every round but the last ones (budgets below gamma) fused, under
    torch.compile(fullgraph=True) (dynamo's eager backend); tokens equal to generate_speculative's, sampled included
    (the same draws from the same generator)."""
    torch._dynamo.reset()
    target = tiny_model("llama", seed=1, layers=2)
    draft = noisy_copy(target, 0.15)
    gamma, lengths = 3, [5, 9, 2]
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens=20, sampling=sampling)
    generator = torch.Generator().manual_seed(5)  # one generator for the drafter and the engine, as a run has
    with torch.inference_mode():
        eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, sampling, generator), ids, mask,
                                     generation, gamma, generator)
    ctarget = compiled_copy(target, (1, gamma + 1), 64, (3,))
    cdraft = compiled_copy(draft, (1, 2), 64, (3,))
    generator = torch.Generator().manual_seed(5)
    outputs, accepts = fused_generate(ctarget, DraftModelDrafter(cdraft, VOCAB, sampling, generator), ids, mask,
                                      generation.max_new_tokens, gamma, sampling, generator)
    assert same_prefix(outputs, eager)
    assert len(accepts) >= 3 and len({a for round_ in accepts for a in round_}) >= 2  # several, of several acceptances
    # a full accept leaves d_gamma pending: the next round's catch-up feeds it (the width-2 path is exercised)
    assert any(gamma in round_ for round_ in accepts[:-1])


def test_fused_round_compiles_once_and_never_again_over_50_rounds():
    """50 fused rounds of varying acceptance, a row leaving midway: one graph at the first round, none after
    (torch._dynamo's count of graphs, and error_on_recompile)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    target = tiny_model("llama", seed=1, layers=1)
    draft = noisy_copy(target, 0.15)
    gamma, lengths = 3, [4, 7]
    ids, mask = ragged_batch(lengths, seed=2)
    ctarget = compiled_copy(target, (1, gamma + 1), 448, (2,))
    cdraft = compiled_copy(draft, (1, 2), 448, (2,))
    drafter = DraftModelDrafter(cdraft, VOCAB, Sampling())
    graphs = counters["stats"]["unique_graphs"]
    fused_generate(ctarget, drafter, ids, mask, 400, gamma, most_rounds=1)  # warm-up: the round's graph
    assert counters["stats"]["unique_graphs"] == graphs + 1 == graphs + ctarget._speculate_compiled.compiles
    graphs += 1
    torch._dynamo.config.error_on_recompile = True
    try:
        _, accepts = fused_generate(ctarget, drafter, ids, mask, 400, gamma, most_rounds=50, first_leaves_after=20)
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert len(accepts) == 50 and len(accepts[19]) == 2 and len(accepts[20]) == 1
    assert len({a for round_ in accepts for a in round_}) == gamma + 1  # every acceptance from 0 to gamma
    assert counters["stats"]["unique_graphs"] == graphs


def test_captured_mode_runs_the_round_uncaptured_on_a_cpu():
    """engine.compile: cudagraphs on a CPU: the same round function, no torch.compile, the eager engine's tokens."""
    target = tiny_model("llama", seed=1, layers=1)
    draft = noisy_copy(target, 0.3)
    gamma = 2
    ids, mask = ragged_batch([6, 3], seed=1)
    generation = Generation(max_new_tokens=10)
    with torch.inference_mode():
        eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma)
    ctarget = compiled_copy(target, (1, gamma + 1), 64, (2,), mode=CAPTURED)
    cdraft = compiled_copy(draft, (1, 2), 64, (2,), mode=CAPTURED)
    outputs, accepts = fused_generate(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling()), ids, mask,
                                      generation.max_new_tokens, gamma)
    assert same_prefix(outputs, eager) and accepts
    assert ctarget._speculate_compiled.compiles == 0


def test_fused_round_with_inductor_is_exact():
    """One small case through inductor's code generation (slow on a CPU): the eager engine's tokens."""
    torch._dynamo.reset()
    target = tiny_model("llama", seed=1, layers=1)
    draft = noisy_copy(target, 0.3)
    gamma = 2
    ids, mask = ragged_batch([5, 3], seed=4)
    generation = Generation(max_new_tokens=8)
    with torch.inference_mode():
        eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma)
    ctarget = compiled_copy(target, (1, gamma + 1), 64, (2,), backend="inductor")
    cdraft = compiled_copy(draft, (1, 2), 64, (2,), backend="inductor")
    outputs, accepts = fused_generate(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling()), ids, mask,
                                      generation.max_new_tokens, gamma)
    assert same_prefix(outputs, eager) and accepts


def fused_head_generate(target, drafter, ids, mask, max_new_tokens, gamma, sampling=Sampling(), generator=None,
                        most_rounds=None):
    """fused_generate for an EAGLE-3 head: the target's prefill returns the states the head reads, handed over before
    the drafter's start (as the engine's tap does)."""
    compiled = target._speculate_compiled
    compiled.hidden_layers = tuple(drafter.target_layers)
    with torch.inference_mode():
        state = new_state(target)
        logits = state.forward(target, ids, mask, last_only=True)[:, -1]
        drafter.take_features(compiled.hidden_out)
    compiled.hidden_layers = ()
    return _rounds(state, target, drafter, logits, ids, mask, max_new_tokens, gamma, sampling, generator, most_rounds)


@pytest.fixture(scope="module")
def eagle3():
    """A 4-layer target and an EAGLE-3 head fit to its greedy continuations (decode/head_models.py;
    tests/decode/test_heads.py fit): its drafts are accepted often, not always."""
    from decode.head_models import MedusaHeads
    from test_heads import eagle3_head, fit

    target = tiny_model("llama", seed=1, layers=4)
    head = eagle3_head(target)
    fit(target, head, MedusaHeads(64, VOCAB, 1, 1, 4), steps=60)
    return target, head.eval()


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 0.8)], ids=["greedy", "sampled"])
def test_fused_eagle3_rounds_give_the_eager_engines_tokens(eagle3, sampling):
    """An EAGLE-3 head's rounds fused (the head's catch-up of up to gamma + 1 pending states, its own states fed back,
    the target's states of the accepted columns for the next round), under torch.compile(fullgraph=True): the eager
    engine's tokens on a ragged batch, and one graph for every round after the first."""
    from torch._dynamo.utils import counters

    from decode.drafters.head_drafters import Eagle3Drafter

    torch._dynamo.reset()
    target, head = eagle3
    gamma = 3
    ids, mask = ragged_batch([6, 4, 6], seed=5)
    generation = Generation(max_new_tokens=16, sampling=sampling)
    generator = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        eager = generate_speculative(target, Eagle3Drafter(head, VOCAB, sampling, generator), ids, mask, generation,
                                     gamma, generator)
    ctarget = copy.copy(target)
    ctarget.__dict__.pop("_speculate_compiled", None)
    attach(ctarget, CompiledModel(ctarget, (1, gamma + 1), 64, (3,), backend="eager", head_layers=head.target_layers))
    chead = copy.copy(head)
    attach(chead, CompiledModel(chead, (1, gamma + 1), 64, (3,), backend="eager"))
    generator = torch.Generator().manual_seed(3)
    drafter = Eagle3Drafter(chead, VOCAB, sampling, generator)
    graphs = counters["stats"]["unique_graphs"]
    outputs, accepts = fused_head_generate(ctarget, drafter, ids, mask, generation.max_new_tokens, gamma, sampling,
                                           generator)
    assert same_prefix(outputs, eager)
    assert len(accepts) >= 3 and len({a for round_ in accepts for a in round_}) >= 3  # of several acceptances
    # the round's graph once (the head's eager prefill and the target's compile no step: every round was fused)
    assert counters["stats"]["unique_graphs"] - graphs == 1


def test_engine_rounds_of_a_compiled_head_give_the_eager_tokens(eagle3):
    """An EAGLE-3 head with a compiled step keeps its cache in static buffers (its features and own states padded into
    the step's inputs, `last_hidden` of the live rows' real columns): the engine's own rounds, those a loop runs where
    a round is not fused, give the eager head's tokens."""
    from decode.drafters.head_drafters import Eagle3Drafter
    from decode.static_kv import StaticKVState

    target, head = eagle3
    gamma = 3
    ids, mask = ragged_batch([6, 4, 6], seed=5)
    generation = Generation(max_new_tokens=12)
    with torch.inference_mode():
        eager = generate_speculative(target, Eagle3Drafter(head, VOCAB, Sampling()), ids, mask, generation, gamma)
    ctarget = copy.copy(target)
    ctarget.__dict__.pop("_speculate_compiled", None)
    attach(ctarget, CompiledModel(ctarget, (1, gamma + 1), 64, (3,), backend="eager", head_layers=head.target_layers))
    chead = copy.copy(head)
    attach(chead, CompiledModel(chead, (1, gamma + 1), 64, (3,), backend="eager"))
    drafter = Eagle3Drafter(chead, VOCAB, Sampling())
    with torch.inference_mode():
        compiled = generate_speculative(ctarget, drafter, ids, mask, generation, gamma)
    assert isinstance(drafter.state, StaticKVState)
    assert [r.output_ids for r in compiled] == [r.output_ids for r in eager]
    assert [r.rounds for r in compiled] == [r.rounds for r in eager]


def test_a_round_split_at_its_drafts_gives_the_same_tokens():
    """on_drafted (a clock's mark between the drafts and the verification): the round runs as two functions, a graph
    each, the mark between them every round; the tokens are the whole round's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    target = tiny_model("llama", seed=1, layers=1)
    draft = noisy_copy(target, 0.15)
    gamma = 2
    ids, mask = ragged_batch([6, 3], seed=1)
    runs = []
    for split in (False, True):
        ctarget = compiled_copy(target, (1, gamma + 1), 64, (2,))
        cdraft = compiled_copy(draft, (1, 2), 64, (2,))
        marks, graphs = [], counters["stats"]["unique_graphs"]
        runs.append(fused_generate(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling()), ids, mask, 12, gamma,
                                   on_drafted=(lambda: marks.append(1)) if split else None))
        if split:
            assert len(marks) == len(runs[1][1]) and counters["stats"]["unique_graphs"] - graphs == 2
    assert runs[0] == runs[1] and runs[0][1]


def test_the_engines_loop_runs_fused_rounds_and_gives_the_eager_tokens(monkeypatch):
    """generate_speculative with a compiled target and draft (eager backend): the rounds where every row can take gamma
    run as one function (counted), the rest as the eager round does, and the tokens and rounds are the eager engine's;
    a row ends at its EOS mid-batch."""
    import decode.generate as engine

    target = tiny_model("llama", seed=1, layers=2)
    draft = noisy_copy(target, 0.1)
    ids, mask = ragged_batch([5, 9, 3], seed=4)
    gamma = 3
    with torch.inference_mode():
        eos = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask,
                                   Generation(14), gamma)[1].output_ids[6]
        generation = Generation(14, eos_token_ids=(eos,))
        eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma)
        fused, real = [], engine.fused_round
        monkeypatch.setattr(engine, "fused_round", lambda *a, **k: fused.append(1) or real(*a, **k))
        widths, batches = (1, 2, gamma + 1), (3,)
        compiled = generate_speculative(compiled_copy(target, widths, 64, batches),
                                        DraftModelDrafter(compiled_copy(draft, widths, 64, batches), VOCAB, Sampling()),
                                        ids, mask, generation, gamma)
    assert [r.output_ids for r in compiled] == [r.output_ids for r in eager]
    assert [r.rounds for r in compiled] == [r.rounds for r in eager]
    assert any(r.stop_reason == "eos" for r in eager) and len(fused) >= 2


@pytest.mark.parametrize("served", [False, True], ids=["static", "served"])
def test_overlapped_rounds_give_the_baselines_tokens_and_read_after_the_next_launch(monkeypatch, served):
    """engine.overlap: round k + 1 is launched from round k's device results before round k is read (the op order,
    logged: every read but the last follows the next round's launch, whose drafts run first); greedy output equals the
    baseline's with a row ending at its EOS and the others at their budget mid-overlap, static and served."""
    import decode.generate as engine
    from decode import generate_baseline
    from decode.arrivals import Load

    target = tiny_model("llama", seed=1, layers=2)
    draft = noisy_copy(target, 0.05)
    ids, mask = ragged_batch([5, 9, 3], seed=4)
    gamma = 2
    with torch.inference_mode():
        eos = generate_baseline(target, ids, mask, Generation(24))[1].output_ids[9]
        generation = Generation(24, eos_token_ids=(eos,))
        base = generate_baseline(target, ids, mask, generation)
        log, launch, read = [], engine._Loop._launch, engine._Flight.read
        monkeypatch.setattr(engine._Loop, "_launch", lambda self, rows, budget, token, carry: log.append(
            ("launch", carry)) or launch(self, rows, budget, token, carry))
        monkeypatch.setattr(engine._Flight, "read", lambda self: log.append(("read",)) or read(self))
        widths, batches = (1, 2, gamma + 1), (1, 2, 4)
        out = generate_speculative(compiled_copy(target, widths, 96, batches),
                                   DraftModelDrafter(compiled_copy(draft, widths, 96, batches), VOCAB, Sampling()),
                                   ids, mask, generation, gamma, overlap=True,
                                   load=Load([0.0, 0.0, 0.0], 2) if served else None)
    assert [r.output_ids for r in out] == [r.output_ids for r in base]
    assert any(r.stop_reason == "eos" for r in base) and any(r.stop_reason == "length" for r in base)
    carried = [i for i, e in enumerate(log) if e == ("launch", True)]
    assert len(carried) >= 3, log
    # each carried launch comes before the read of the round launched just before it
    assert all(log[i + 1] == ("read",) for i in carried), log
