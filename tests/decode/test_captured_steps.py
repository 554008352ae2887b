"""engine.compile: cudagraphs (decode/static_kv.py CAPTURED): every tensor a step reads lives in a buffer allocated once
per (buffer set, width) and written in place, so a graph captured over them replays on the same addresses; on a CPU
the same steps run uncaptured through the same buffers and give the eager engine's tokens and rounds."""
import copy

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.draft_tree import StaticTree
from decode.static_kv import CAPTURED, CompiledModel, attach
from decode.tree_layout import static_parents
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model


def captured_copy(model, widths, max_length, batch_sizes, tree_widths=()):
    """The same weights with the captured mode's step attached; the original stays eager."""
    twin = copy.copy(model)
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, batch_sizes, mode=CAPTURED, tree_widths=tree_widths))
    return twin


class AddressBook:
    """Wraps a CompiledModel's `_forward`: per step shape (width, tree or not) the addresses of what the step read,
    holding every tensor it saw (so a tensor allocated anew could not reuse a freed one's address)."""

    def __init__(self, compiled: CompiledModel):
        self.seen, self.held, self.real = {}, [], compiled._forward
        compiled._forward = self

    def __call__(self, buffers, input_ids, query_positions, query_valid, ancestors=None, last_only=False):
        if not last_only:  # the prefill runs eager at its own width: not a step
            tensors = (input_ids, query_positions, query_valid, ancestors, buffers.start, buffers.valid)
            self.held.append(tensors)
            key = (input_ids.shape[1], ancestors is not None)
            self.seen.setdefault(key, []).append(tuple(t.data_ptr() if t is not None else None for t in tensors))
        return self.real(buffers, input_ids, query_positions, query_valid, ancestors, last_only)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_captured_steps_read_fixed_buffers_and_give_eager_tokens(monkeypatch, kind):
    """Greedy, a ragged batch of 5 with a short row: the captured mode (uncaptured on a CPU) gives the eager engine's
    tokens and rounds, compiles nothing, and each step shape reads the same tensors step after step. The chain's
    rounds run step by step here (not fused: a fused round's steps read tensors made inside its one graph, whose
    addresses a capture fixes and an uncaptured CPU run does not)."""
    import decode.generate as engine

    monkeypatch.setattr(engine, "fusable", lambda *args: False)
    target = tiny_model("llama", seed=1, layers=2)
    draft = noisy_copy(target, 0.1)
    gamma, lengths, new = 3, [5, 11, 1, 8, 3], 20
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens=new)
    tree = (lambda: StaticTree(static_parents([2, 2, 1]), Sampling())) if kind == "tree" else (lambda: None)
    # the target's widths: 1 and the chain's gamma + 1, or the tree's 2 + 4 + 4 nodes and its root; the draft's 1 and 2
    # and its tree forwards' (2 nodes at depth 1, 4 at depth 2)
    target_trees, draft_trees = ((11,), (2, 4)) if kind == "tree" else ((), ())
    max_length = 11 + new + 16
    ctarget = captured_copy(target, (1, gamma + 1), max_length, (5,), target_trees)
    cdraft = captured_copy(draft, (1, 2), max_length, (5,), draft_trees)
    books = [AddressBook(m._speculate_compiled) for m in (ctarget, cdraft)]
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling(), tree=tree()), ids, mask,
                                     generation, gamma)
        captured = generate_speculative(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling(), tree=tree()), ids, mask,
                                        generation, gamma)
    assert [r.output_ids for r in captured] == [r.output_ids for r in base]
    assert [r.rounds for r in captured] == [r.rounds for r in eager]
    assert any(round_["accepted"] >= 1 for r in captured for round_ in r.rounds)  # drafts were accepted
    verify = (11, True) if kind == "tree" else (gamma + 1, False)
    assert len(books[0].seen[verify]) >= 4 and len(books[1].seen[(1, False)]) >= 4  # several rounds
    for book in books:
        for shape, addresses in book.seen.items():
            assert len(set(addresses)) == 1, f"step {shape} read new tensors: {len(set(addresses))} address sets"
    for model in (ctarget, cdraft):
        summary = model._speculate_compiled.summary()
        assert summary["mode"] == "cudagraphs" and summary["graphs"] == 0  # no dynamo
        assert summary["captures"] == 0 and summary["capture_s"] == []  # a CPU captures nothing


def test_compile_cudagraphs_is_a_setting_of_the_engine():
    from utils.config import EngineConfig

    assert EngineConfig(compile="cudagraphs").compile == "cudagraphs"
    assert EngineConfig(compile=True).compile is True
    with pytest.raises(ValueError):
        EngineConfig(compile="inductor")


@pytest.mark.parametrize("mode", [None, CAPTURED], ids=["compiled", "captured"])
def test_rows_join_a_static_batch_in_row_buckets_and_compile_nothing_new(mode):
    """Continuous batching's join on the static buffers: 2 rows decode, 1 joins (its own prefill; the batch moves to
    the bucket of 4 rows), 1 more joins (a free row of that bucket), one leaves; every step's greedy token equals the
    eager cache's (decode/kv.py KVState.join), and once each bucket's width compiled, joins and departures compile
    nothing."""
    from decode.kv import KVState
    from decode.static_kv import StaticKVState

    torch._dynamo.reset()
    model = tiny_model("llama", seed=1, layers=2)
    twin = copy.copy(model)
    twin.__dict__.pop("_speculate_compiled", None)
    compiled = CompiledModel(twin, (1,), 64, (1, 2, 4, 8), mode=mode, backend="eager")
    attach(twin, compiled)
    prompts = [ragged_batch([5, 3], seed=1), ragged_batch([7], seed=2), ragged_batch([2], seed=3)]

    def decode(state, m, token, steps):
        tokens = []
        for _ in range(steps):
            token = state.forward(m, token[:, None])[:, -1].argmax(dim=-1)
            tokens.append(token.tolist())
        return token, tokens

    def run(m, fresh):
        with torch.inference_mode():
            state = fresh()
            token = state.forward(m, *prompts[0], last_only=True)[:, -1].argmax(dim=-1)
            token, first = decode(state, m, token, 3)
            seen = [first]
            for ids, mask in prompts[1:]:
                joining = fresh()
                joined_token = joining.forward(m, ids, mask, last_only=True)[:, -1].argmax(dim=-1)
                state.join(joining)
                token, tokens = decode(state, m, torch.cat([token, joined_token]), 3)
                seen.append(tokens)
            state.select_rows([0, 2, 3])
            token, tokens = decode(state, m, token[torch.tensor([0, 2, 3])], 3)
            seen.append(tokens)
        return seen, state

    eager, _ = run(model, KVState)
    run(twin, lambda: StaticKVState(compiled))  # the buckets' steps: 2 and 4 rows, width 1
    graphs = compiled.compiles
    compiled.warm = True
    static, state = run(twin, lambda: StaticKVState(compiled))
    assert static == eager
    assert state.buffers.valid.shape[0] == 4 and len(state.rows) == 3
    assert compiled.recompiles_after_warmup == 0 and compiled.compiles == graphs


@pytest.mark.parametrize("mode", ["compiled", "captured"])
def test_served_on_compiled_steps_is_greedy_exact_and_compiles_nothing_after_warmup(mode):
    """Continuous batching over compiled (eager backend) or captured steps in row buckets (1, 2, 4, 8): 6 requests at
    concurrency 3 (the next joins as a row ends), a draft model at gamma 3; the tokens are the eager engine's under the same load,
    and a second run of the same load (the first its warmup) compiles nothing."""
    from decode.arrivals import Load

    torch._dynamo.reset()
    target = tiny_model("llama", seed=1, layers=2)
    draft = noisy_copy(target, 0.1)
    ids, mask = ragged_batch([5, 9, 3, 7, 2, 6], seed=4)
    gamma, generation = 3, Generation(10)
    load = Load([0.0] * 6, 3)  # all waiting: each join follows a row's end, so both runs join alike

    def fast(model):
        twin = copy.copy(model)
        twin.__dict__.pop("_speculate_compiled", None)
        attach(twin, CompiledModel(twin, (1, 2, gamma + 1), 64, (1, 2, 4, 8), mode=CAPTURED if mode == "captured"
                                   else None, backend="eager"))
        return twin
    with torch.inference_mode():
        eager = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma,
                                     load=load)
        ctarget, cdraft = fast(target), fast(draft)
        first = generate_speculative(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling()), ids, mask, generation,
                                     gamma, load=load)
        for model in (ctarget, cdraft):
            model._speculate_compiled.warm = True
        second = generate_speculative(ctarget, DraftModelDrafter(cdraft, VOCAB, Sampling()), ids, mask, generation,
                                      gamma, load=load)
    assert [r.output_ids for r in first] == [r.output_ids for r in second] == [r.output_ids for r in eager]
    assert ctarget._speculate_compiled.recompiles_after_warmup == cdraft._speculate_compiled.recompiles_after_warmup == 0


def test_a_capture_runs_warm_restores_and_counts_one_recording(monkeypatch):
    """Fake CUDA (graphs that run their body once): a capture, a step's or a fused round's, runs fn warm on a side
    stream, restores, captures it in the model's pool and counts one recording with its seconds (after the warmup
    too once warm); a round's warm run is undone, so its state moves once, as its replay moves it."""
    import contextlib

    from decode.round_graph import _capture_round

    log = []

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(_, pool):
        log.append(("capture", pool))
        yield

    for name, fake in [("Stream", Stream), ("current_stream", Stream), ("stream", lambda s: contextlib.nullcontext()),
                       ("CUDAGraph", object), ("graph", graph), ("graph_pool_handle", lambda: "pool")]:
        monkeypatch.setattr(torch.cuda, name, fake)
    compiled = object.__new__(CompiledModel)
    compiled._pool, compiled.capture_s, compiled.recordings, compiled.recordings_after_warmup = None, [], 0, 0
    compiled.warm = False
    _, out = compiled.capture_graph(lambda x: log.append(("run", x)) or x + 1, 1, restore=lambda: log.append("restore"))
    assert out == 2 and log == [("run", 1), "restore", ("capture", "pool"), ("run", 1)]
    assert (compiled.recordings, compiled.recordings_after_warmup, len(compiled.capture_s)) == (1, 0, 1)
    compiled.warm = True
    state = torch.zeros(2, dtype=torch.long)
    _capture_round(lambda t: t.add_(1), compiled, (state,))
    assert state.tolist() == [1, 1]  # warm run undone, the capture's run kept
    assert (compiled.recordings, compiled.recordings_after_warmup, len(compiled.capture_s)) == (2, 1, 2)
