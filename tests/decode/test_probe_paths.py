"""The exactness guard's numerics probe reads the kernels and widths the run uses: the compiled step where
engine.compile attached one, a tree's verify widths, and a quantized model's M = 1 path."""
from types import SimpleNamespace

import torch

from decode.numerics import numerics_probe
from decode.static_kv import CompiledModel, attach
from tiny_models import ragged_batch, tiny_model


def test_the_numerics_probe_runs_the_compiled_step_when_one_is_attached(monkeypatch):
    model = tiny_model("llama", seed=1, layers=1)
    ids, mask = ragged_batch([3, 7], seed=2)
    compiled = CompiledModel(model, (1, 3), 40, (2,), backend="eager")
    attach(model, compiled)
    steps = []
    real = CompiledModel.run

    def counted(self, buffers, input_ids, *args, compiled=True, **kwargs):
        steps.append((input_ids.shape[1], compiled))
        return real(self, buffers, input_ids, *args, compiled=compiled, **kwargs)

    monkeypatch.setattr(CompiledModel, "run", counted)
    result = numerics_probe(model, ids, mask, widths=(3,), single_steps=True)
    # compiled steps of width 1 (token by token) and 3 (the verification); eager only the prefills: the batch's
    # stepwise and verify states, and each row's alone and alone token by token
    assert {width for width, on in steps if on} == {1, 3}
    assert sum(not on for _, on in steps) == 2 + 2 * 2
    assert result["verify_vs_stepwise_max_logit_diff"] < 1e-3 and result["single_stepwise_max_logit_diff"] < 1e-3
    assert compiled.summary()["buffer_sets"] == {2: 1}  # one state alive at a time: the run's one set of buffers


def test_the_probe_widths_hold_the_trees_node_counts():
    from runner.probes import probe_widths
    from runner.session import Session
    from utils.config import validate

    config = validate({"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl"},
                       "methods": ["baseline", "speculative"],
                       "speculative": {"gamma": [2], "tree": [None, [2, 1]]}})
    points = Session(config, torch.device("cpu"))._points()
    bf16 = SimpleNamespace(quantization="none", dtype="bfloat16")
    # the chain's gamma + 1 and the static tree 2-1's 4 nodes + 1
    assert probe_widths(config, points, bf16) == (3, 5)
    assert probe_widths(config, points, SimpleNamespace(quantization="none", dtype="float32")) == (5,)
