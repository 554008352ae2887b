"""Probes: a slot-position bias (MPT's ALiBi) refuses ragged batches; rounding does not."""
import math

import pytest
import torch
from transformers import MptConfig, MptForCausalLM

from decode.probes import numerics_probe, position_bias_probe, ragged_batch_problem
from tiny_models import VOCAB, ragged_batch, tiny_model


def tiny_mpt():
    torch.manual_seed(0)
    config = MptConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=VOCAB, max_seq_len=512)
    return MptForCausalLM(config).float().eval()


def test_mpt_ragged_batch_is_refused():
    model = tiny_mpt()
    reason = ragged_batch_problem(model)
    assert reason is not None and "MptForCausalLM" in reason and "batch_size 1" in reason
    assert "\n" not in reason


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_position_id_models_are_not_refused(arch):
    assert ragged_batch_problem(tiny_model(arch, seed=1)) is None


def test_position_bias_probe_returns_a_finite_difference():
    value = position_bias_probe(tiny_model("llama", seed=1))
    assert math.isfinite(value) and value >= 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_numerics_probe_reports_finite_drifts(arch):
    ids, mask = ragged_batch([3, 9, 5], seed=2)
    result = numerics_probe(tiny_model(arch, seed=1), ids, mask, num_tokens=4)
    assert set(result) == {"verify_vs_stepwise_max_logit_diff", "batched_vs_single_max_logit_diff", "tokens"}
    assert result["tokens"] == 4
    for key in ("verify_vs_stepwise_max_logit_diff", "batched_vs_single_max_logit_diff"):
        assert isinstance(result[key], float) and math.isfinite(result[key]) and result[key] >= 0
    if arch == "llama":  # fp32 rounding is far below 1e-3 on logits of this scale
        assert result["verify_vs_stepwise_max_logit_diff"] < 1e-3


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
    assert probes.measure_costs(target, {"d": draft}, ids, mask, [3, 5], clock)["draft_prefill"] == {}
    costs = probes.measure_costs(target, {"d": draft}, ids, mask, [3, 5], clock, draft_prefill=True)
    line = costs["draft_prefill"]["d"]
    assert line["width"] == 12 and line["per_token"] == pytest.approx(0.01) and line["fixed"] == pytest.approx(0.5)
    assert costs["c_by_draft"] == {"d": pytest.approx(0.3)}
    context = RunContext(target=target, tokenizer=None, drafts={"d": draft}, target_vocab_size=VOCAB, pad_id=0,
                         clock=clock, costs=costs)
    schedule = schedule_for(context, Point(method="speculative", draft="d", gamma=4, schedule="cost_model",
                                           batch_size=2), "d", max_new_tokens=40)
    assert schedule.prefill_cost == line and schedule.budget == 40
    # the pool is the point's, kept across batches in the context
    assert schedule_for(context, Point(method="speculative", draft="d", gamma=4, schedule="cost_model",
                                       batch_size=2), "d", 40).evidence is schedule.evidence
