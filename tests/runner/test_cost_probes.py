"""The cost probes (runner/probes.py): c, v and the draft's prefill line fitted from timed forwards, and read by the
cost-model schedule."""
import pytest

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

    clock = Clock()
    target, draft = tiny_model("llama", seed=1), tiny_model("llama", seed=2, layers=1)
    real_prefilled = probes._prefilled

    def prefilled(model, ids, mask):
        if model is draft:
            clock.t += 0.5 + 0.01 * ids.shape[1]
        return real_prefilled(model, ids, mask)

    monkeypatch.setattr(probes, "_prefilled", prefilled)
    monkeypatch.setattr(probes, "_timed_forward", lambda state, model, tokens, clock: 1.0 if model is target else 0.3)
    ids, mask = ragged_batch([7, 12], seed=3)
    assert probes.measure_costs(target, {"d": draft}, ids, mask, [3, 5], clock).draft_prefill == {}
    costs = probes.measure_costs(target, {"d": draft}, ids, mask, [3, 5], clock, draft_prefill=True)
    line = costs.draft_prefill["d"]
    assert line["width"] == 12 and line["per_token"] == pytest.approx(0.01) and line["fixed"] == pytest.approx(0.5)
    assert costs.c_by_draft == {"d": pytest.approx(0.3)} and costs.v == {2: pytest.approx(1.0), 4: pytest.approx(1.0)}
    context = RunContext(target=target, tokenizer=None, drafts={"d": draft}, target_vocab_size=VOCAB, pad_id=0,
                         clock=clock, costs=costs)
    schedule = schedule_for(context, Point(method="speculative", draft="d", gamma=4, schedule="cost_model",
                                           batch_size=2), "d", max_new_tokens=40)
    assert schedule.prefill_cost == line and schedule.budget == 40
    # the pool is the point's, kept across batches in the context
    assert schedule_for(context, Point(method="speculative", draft="d", gamma=4, schedule="cost_model",
                                       batch_size=2), "d", 40).evidence is schedule.evidence
