"""torchao's weight-only int4 and int8 (quantization: torchao-int4 / torchao-int8) on a CPU: the linears are
replaced (the LM head is kept), speculative decoding gives the quantized target's own greedy tokens (int8 in fp32),
and the compiled step (engine.compile, dynamo's eager backend) runs the same tensors to the same tokens as eager, as
one graph."""
import copy

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.static_kv import CompiledModel, attach
from tiny_models import ragged_batch
from utils.config import ModelConfig
from utils.models import load_model

pytest.importorskip("torchao")
CPU = torch.device("cpu")
# hidden 768, intermediate 2048: every projection's input is a multiple of int4's group of 128
TARGET = "synthetic:llama-160m?layers=2"
DRAFT = "synthetic:llama-160m?layers=1&noise=0.3"


def compiled_copy(model, widths, max_length):
    twin = copy.copy(model)
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, (2,), backend="eager"))
    return twin


# int4 computes in bfloat16, whose rounding differs between a 4-token verification and a 1-token step on some CPUs'
# kernels: there greedy tokens may part at a near-tie, which the run's exactness guard weighs (docs/metrics.md), so the
# test holds int4 to the compiled step giving the eager tokens; int8 in float32 is also held to the baseline's tokens
@pytest.mark.parametrize("quantization, dtype", [("torchao-int4", "bfloat16"), ("torchao-int8", "float32")])
def test_torchao_quantized_pair_is_exact_against_its_own_baseline_eager_and_compiled(quantization, dtype):
    torch._dynamo.reset()
    loaded = load_model(ModelConfig(model=TARGET, dtype=dtype, quantization=quantization), CPU, "target")
    draft = load_model(ModelConfig(model=DRAFT, dtype=dtype, quantization=quantization), CPU, "draft").model
    target = loaded.model
    # 2 layers x 7 linears (q, k, v, o, gate, up, down) are quantized; the LM head is not
    assert loaded.kernels.startswith(f"torchao {quantization.removeprefix('torchao-')} weight-only (14 of 14 linears")
    weight = target.model.layers[0].mlp.down_proj.weight
    assert type(weight).__module__.startswith("torchao"), type(weight)
    assert type(target.lm_head.weight) is torch.nn.Parameter
    gamma, vocab = 3, target.config.vocab_size
    ids, mask = ragged_batch([6, 3], vocab_size=vocab)
    generation = Generation(max_new_tokens=12)

    def speculative(t, d):
        generator = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            return generate_speculative(t, DraftModelDrafter(d, vocab, Sampling(), generator), ids, mask,
                                        generation, gamma, generator)

    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
    eager = speculative(target, draft)
    ctarget, cdraft = compiled_copy(target, (1, gamma + 1), 64), compiled_copy(draft, (1, 2), 64)
    with torch.inference_mode():
        cbase = generate_baseline(ctarget, ids, mask, generation)
    assert ctarget._speculate_compiled.compiles == 1  # the width-1 step is one graph, torchao's matmul inside
    compiled = speculative(ctarget, cdraft)
    for row in range(2):
        assert len(base[row].output_ids) == 12
        if dtype == "float32":
            assert eager[row].output_ids == base[row].output_ids, f"speculative, row {row}"
        assert cbase[row].output_ids == base[row].output_ids, f"compiled baseline, row {row}"
        assert compiled[row].output_ids == eager[row].output_ids, f"compiled speculative, row {row}"


def test_torchao_int4_outside_bfloat16_is_refused_in_one_line_and_auto_is_bfloat16():
    from utils import UserError
    from utils.models import check_model_config, resolve_dtype

    with pytest.raises(UserError, match=r"^target.quantization: torchao-int4 computes in bfloat16 .* set target.dtype: "
                                        r"bfloat16 or auto$"):
        check_model_config(ModelConfig(model=TARGET, dtype="float32", quantization="torchao-int4"), "target")
    check_model_config(ModelConfig(model=TARGET, quantization="torchao-int4"), "target")  # dtype auto
    assert resolve_dtype("auto", CPU, "torchao-int4") == torch.bfloat16
    assert resolve_dtype("auto", CPU, "torchao-int8") == resolve_dtype("auto", CPU) == torch.float32


def test_the_notes_name_the_quantized_kernels_the_engine_kept():
    """runner/loading.py's apply_engine neither packs nor renames a quantized model's linears: the notes said
    nn.Linear for torchao's int4."""
    from types import SimpleNamespace

    from runner.loading import apply_engine

    loaded = SimpleNamespace(kernels="torchao int4 weight-only (14 of 14 linears; the LM head as loaded)",
                             quantization="torchao-int4", model=None)
    engine = SimpleNamespace(compile=False, cpu_linear="auto", pack_batch_hint=4)
    assert apply_engine(SimpleNamespace(engine=engine), loaded) == loaded.kernels
    engine.compile = True
    assert apply_engine(SimpleNamespace(engine=engine), loaded) == loaded.kernels + ", compiled"
