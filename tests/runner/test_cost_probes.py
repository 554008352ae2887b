"""The cost probes (runner/probes.py): c, v and the draft's prefill line fitted from timed forwards, and read by the
cost-model schedule."""
import pytest
import torch

from tiny_models import VOCAB, ragged_batch, tiny_model


def test_cost_probes_fit_the_draft_prefill_and_the_cost_model_reads_it(monkeypatch):
    """With a clock that advances by what each forward is made to cost (a 1-token target forward 1.0, a draft
    forward 0.3, a draft prefill of P tokens 0.5 + 0.01 P), the fitted line is fixed 0.5, 0.01 per token."""
    import runner.probes as probes
    from decode.methods.speculative import schedule_for
    from decode.methods.base import RunContext
    from eval.records import Point

    class Clock:
        t = 0.0

        def now(self):
            return self.t

        host = mark = now  # the engine's clock reads (decode/generate.py Clock)
        seconds = staticmethod(lambda start, end: end - start)

    clock = Clock()
    target, draft = tiny_model("llama", seed=1), tiny_model("llama", seed=2, layers=1)
    real_prefilled = probes._prefilled

    def prefilled(model, ids, mask):
        if model is draft:
            clock.t += 0.5 + 0.01 * ids.shape[1]
        return real_prefilled(model, ids, mask)

    monkeypatch.setattr(probes, "_prefilled", prefilled)
    monkeypatch.setattr(probes, "_timed_target_step", lambda *args: 1.0)
    monkeypatch.setattr(probes, "_timed_draft_step", lambda *args: 0.3)
    monkeypatch.setattr(probes, "_timed_verification", lambda *args: 1.0)
    ids, mask = ragged_batch([7, 12], seed=3)
    assert probes.measure_costs(target, {"d": draft}, ids, mask, [3, 5], clock).draft_prefill == {}
    costs = probes.measure_costs(target, {"d": draft}, ids, mask, [3, 5], clock, draft_prefill=True)
    line = costs.draft_prefill["d"]
    assert line["width"] == 12 and line["per_token"] == pytest.approx(0.01) and line["fixed"] == pytest.approx(0.5)
    assert costs.c_by_draft == {"d": pytest.approx(0.3)} and costs.v == {2: pytest.approx(1.0), 4: pytest.approx(1.0)}
    # the prefill points: the batch [2, 12] and its first row alone (7 tokens, its padding dropped), per model
    assert {(p["model"], p["rows"], p["tokens"]): p["s"] for p in costs.prefills} == {
        ("target", 2, 12): 0.0, ("target", 1, 7): 0.0,
        ("draft:d", 2, 12): pytest.approx(0.62), ("draft:d", 1, 7): pytest.approx(0.57)}
    context = RunContext(target=target, tokenizer=None, drafts={"d": draft}, target_vocab_size=VOCAB, pad_id=0,
                         clock=clock, costs=costs)
    schedule = schedule_for(context, Point(method="speculative", draft="d", gamma=4, schedule="cost_model",
                                           batch_size=2), "d", max_new_tokens=40)
    assert schedule.prefill_cost == line and schedule.budget == 40
    # the pool is the point's, kept across batches in the context
    assert schedule_for(context, Point(method="speculative", draft="d", gamma=4, schedule="cost_model",
                                       batch_size=2), "d", 40).evidence is schedule.evidence


def test_the_probes_time_the_widths_the_tree_points_verify(monkeypatch):
    """A chain of gamma verifies gamma + 1 tokens, a tree of n nodes n + 1 ([3, 2]: 3 + 6 = 9 nodes, dynamic-24: 24),
    auto a fixed ladder of node counts; v is keyed by the nodes (a clock where a W-token forward costs 1 + 0.1 (W - 1)
    gives v(n) = 1 + 0.1 n)."""
    from types import SimpleNamespace

    import runner.probes as probes

    points = [SimpleNamespace(gamma=3), SimpleNamespace(gamma=4, tree="3-2"), SimpleNamespace(gamma=4, tree="dynamic-24"),
              SimpleNamespace(gamma=None), SimpleNamespace(gamma=2, tree=None)]
    assert probes.verify_widths(points) == {4, 10, 25, 3}
    assert probes.verify_widths([SimpleNamespace(gamma=5, tree="auto")]) == {2, 3, 4, 5, 7, 9, 13, 17, 25, 33}
    monkeypatch.setattr(probes, "_timed_target_step", lambda *args: 1.0)
    monkeypatch.setattr(probes, "_timed_verification", lambda state, model, token, gamma, *args: 1 + 0.1 * gamma)
    monkeypatch.setattr(probes, "_timed_tree_forward", lambda state, model, tokens, clock: 1 + 0.1 * (tokens.shape[1] - 1))
    ids, mask = ragged_batch([4, 6], seed=3)
    costs = probes.measure_costs(tiny_model("llama", seed=1), {}, ids, mask, sorted(probes.verify_widths(points)), None)
    assert costs.v == {n: pytest.approx(1 + 0.1 * n) for n in (2, 3, 9, 24)}
    assert costs.v_at_nodes(6) == pytest.approx(1.6)  # between the measured 3 and 9 nodes


def test_widths_only_trees_verify_are_timed_through_the_tree_mask(monkeypatch):
    """A tree's verification builds a custom mask (KVState.forward_tree): the widths only trees use are timed that way,
    a width a chain uses the chain's way; each probe leaves the prompt's cache as it found it."""
    import runner.probes as probes
    from decode.kv import KVState

    calls = []
    forward, forward_tree = KVState.forward, KVState.forward_tree
    monkeypatch.setattr(KVState, "forward", lambda self, model, ids, *a, **k: calls.append(("chain", ids.shape[1]))
                        or forward(self, model, ids, *a, **k))
    monkeypatch.setattr(KVState, "forward_tree", lambda self, model, ids, *a, **k: calls.append(("tree", ids.shape[1]))
                        or forward_tree(self, model, ids, *a, **k))
    ids, mask = ragged_batch([4, 6], seed=3)
    costs = probes.measure_costs(tiny_model("llama", seed=1), {}, ids, mask, [3, 5, 10], _Clock(), reps=1,
                                 tree_widths={10})
    timed = set(calls[1:-4])  # after the prefill, before the prefill points (the batch's and its first row's, twice)
    assert timed == {("chain", 1), ("chain", 3), ("chain", 5), ("tree", 10)}
    assert calls[-4:] == [("chain", 6)] * 2 + [("chain", 4)] * 2
    assert [(p["model"], p["rows"], p["tokens"], len(p["reps_s"])) for p in costs.prefills] == \
        [("target", 2, 6, 2), ("target", 1, 4, 2)]
    assert set(costs.v) == {2, 4, 9}


class _Clock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        self.t += 1.0
        return self.t


def test_the_probed_costs_predict_what_the_run_measures(monkeypatch):
    """With a clock that only moves when a step does work (a target forward of W tokens costs 1 + 0.1 (W - 1), a draft
    forward 0.3, and the baseline's top-2 gap, which only the baseline takes, 0.5), c and v are the run's own step
    times in baseline steps: the baseline's step costs 1.5, so c = 0.3 / 1.5 = 0.2 and v_2 = 1.2 / 1.5 = 0.8 (a
    forward alone would give 0.3 and 1.2). Every round drafts gamma 2 (the draft is the target: all accepted, 4 rounds
    of 3 tokens), so the measured decode speedup is Leviathan's prediction exactly: 3 / (2 x 0.2 + 0.8) = 2.5. And the
    probes run at the prompt's cache plus `context` tokens."""
    import decode.generate as generate
    import runner.probes as probes
    from decode.drafters.draft_model import DraftModelDrafter
    from decode.settings import Generation, Sampling
    from eval.leviathan import predicted_speedup, solve_alpha

    class Clock:
        t = 0.0

        def now(self):
            return self.t

        host = mark = now  # the engine's clock reads (decode/generate.py Clock)
        seconds = staticmethod(lambda start, end: end - start)

    clock, positions = Clock(), []
    target, draft = tiny_model("llama", seed=1), tiny_model("llama", seed=1)

    def charge(cost):
        def hook(module, args, kwargs, output):
            clock.t += cost(kwargs["input_ids"].shape[1])
            positions.append((kwargs["input_ids"].shape[1], int(kwargs["position_ids"][0, 0])))
        return hook

    target.register_forward_hook(charge(lambda width: 1.0 + 0.1 * (width - 1)), with_kwargs=True)
    draft.register_forward_hook(charge(lambda width: 0.3), with_kwargs=True)
    top2_gap = generate.top2_gap

    def charged_top2_gap(logits):
        clock.t += 0.5
        return top2_gap(logits)

    monkeypatch.setattr(generate, "top2_gap", charged_top2_gap)
    ids, mask = ragged_batch([9], seed=3)
    gamma, greedy = 2, Sampling(False)
    generation = Generation(1 + 4 * (gamma + 1), greedy, ())
    with torch.inference_mode():
        base = generate.generate_baseline(target, ids, mask, generation, clock=clock)[0]
        spec = generate.generate_speculative(target, DraftModelDrafter(draft, VOCAB, greedy), ids, mask, generation,
                                             gamma, clock=clock)[0]
        del positions[:]
        costs = probes.measure_costs(target, {"d": draft}, ids, mask, [gamma + 1], clock, reps=2, context=5,
                                     target_vocab_size=VOCAB)
    assert [r["drafted"] for r in spec.rounds] == [gamma] * 4 and base.new_tokens == spec.new_tokens == 13
    assert costs.target_forward_s == pytest.approx(1.5)
    assert costs.c_by_draft == {"d": pytest.approx(0.2)} and costs.v == {gamma: pytest.approx(0.8)}
    # each step (not the prefills of 14 tokens, nor the prefill points' of the prompt's 9) appends after the prompt's
    # 9 tokens and 5 more; the draft's steps as a round chains them, gamma of them: its second at 15
    assert costs.context_tokens == 14 and {position for width, position in positions if width < 9} == {14, 15}
    assert sorted(position for width, position in positions if width == 1).count(15) == 3  # 1 untimed + 2 reps
    measured = ((spec.new_tokens - 1) / (spec.latency_s - spec.prefill_s - spec.draft_prefill_s)) / \
        ((base.new_tokens - 1) / (base.latency_s - base.prefill_s))
    assert measured == pytest.approx(2.5)
    assert predicted_speedup(solve_alpha(spec.rounds), gamma, costs.c_by_draft["d"], costs.v[gamma]) == \
        pytest.approx(measured)


def test_the_drafts_two_token_catch_up_is_timed_beside_its_step(monkeypatch):
    """A round after a full accept feeds the draft its last draft and the last token in one forward: the probes time
    that 2-token forward against a 1-token one alone and price it in the chain (the chained step times their ratio),
    each back to the cache it found; the profile reads it as the draft's step of width 2."""
    import runner.probes as probes
    from decode.kv import KVState
    from eval.costs import from_probe

    class Clock:  # a reading costs 0.1 s (a host sync); a draft forward 0.2 s a token, the target's 1.0 s
        t = 0.0

        def now(self):
            self.t += 0.1
            return self.t

    target, draft = tiny_model("llama", seed=1), tiny_model("llama", seed=2, layers=1)
    clock, forward, fed = Clock(), KVState.forward, []

    def timed_forward(self, model, ids, *args, **kwargs):
        if model is draft:
            fed.append(ids.shape[1])
        clock.t += 0.2 * ids.shape[1] if model is draft else 1.0
        return forward(self, model, ids, *args, **kwargs)

    monkeypatch.setattr(KVState, "forward", timed_forward)
    ids, mask = ragged_batch([5, 8], seed=3)
    costs = probes.measure_costs(target, {"d": draft}, ids, mask, [3], clock, reps=2, prefills=False)
    # a draft step chained over 2 steps (the widest chain) reads (2 x 0.2 + 0.1) / 2 = 0.25, one alone 0.3, the
    # 2-token forward 0.5: priced in the chain 0.25 x 0.5 / 0.3
    assert costs.draft_reps_s == {"d": [pytest.approx(0.25)] * 2}
    assert costs.draft_catch_up_reps_s == {"d": [pytest.approx(0.25 * 0.5 / 0.3)] * 2}
    assert fed.count(2) == 3  # the untimed pass and 2 repetitions
    steps, _ = from_probe(costs, 2)
    assert {(p["model"], p["width"]): p["s"] for p in steps if p["model"] == "draft:d"} == {
        ("draft:d", 1): pytest.approx(0.25), ("draft:d", 2): pytest.approx(0.25 * 0.5 / 0.3)}
