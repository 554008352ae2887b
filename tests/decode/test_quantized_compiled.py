"""bitsandbytes nf4 (4bit) and LLM.int8 (8bit) models through the compiled step on a CPU (engine.compile): the
compiled baseline and speculative decoding give the eager engine's tokens and rounds on the same quantized weights,
and each step is one graph (fullgraph: bitsandbytes' ops trace without a break). Dynamo's `eager` backend; inductor
on 4-bit is docs/compiled-engine.md's check, not a test (minutes on a CPU)."""
import copy
import logging

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.static_kv import CompiledModel, attach
from helpers import WORDS, save_tiny_pair
from tiny_models import ragged_batch
from utils.config import ModelConfig
from utils.models import load_model

pytest.importorskip("bitsandbytes")
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
CPU = torch.device("cpu")


def compiled_copy(model, widths, max_length):
    twin = copy.copy(model)
    twin.__dict__.pop("_speculate_compiled", None)
    attach(twin, CompiledModel(twin, widths, max_length, (2,), backend="eager"))
    return twin


def speculative(target, draft, ids, mask, gamma):
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        return generate_speculative(target, DraftModelDrafter(draft, len(WORDS), Sampling(), generator), ids, mask,
                                    Generation(max_new_tokens=16), gamma, generator)


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_quantized_compiled_equals_its_eager_quantized_run(tmp_path, quantization):
    torch._dynamo.reset()
    target_dir, draft_dir = save_tiny_pair(tmp_path)
    target = load_model(ModelConfig(model=str(target_dir), quantization=quantization), CPU, "target").model
    draft = load_model(ModelConfig(model=str(draft_dir), quantization=quantization), CPU, "draft").model
    gamma = 3
    ids, mask = ragged_batch([6, 3], vocab_size=len(WORDS))
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, Generation(max_new_tokens=16))
    eager = speculative(target, draft, ids, mask, gamma)
    ctarget, cdraft = compiled_copy(target, (1, gamma + 1), 64), compiled_copy(draft, (1, 2), 64)
    with torch.inference_mode():
        cbase = generate_baseline(ctarget, ids, mask, Generation(max_new_tokens=16))
    # the baseline's width-1 step is one graph: bitsandbytes' matmuls inside it, no break (fullgraph)
    assert ctarget._speculate_compiled.compiles == 1
    compiled = speculative(ctarget, cdraft, ids, mask, gamma)
    for row in range(2):
        assert cbase[row].output_ids == base[row].output_ids, f"compiled baseline, row {row}"
        assert compiled[row].output_ids == eager[row].output_ids, f"compiled speculative, row {row}"
        assert compiled[row].rounds == eager[row].rounds, f"row {row}: other drafts or acceptances"


def test_a_quantized_pair_runs_compiled_through_launch(tmp_path):
    """engine.compile with bitsandbytes targets and drafts: the config loads (it was refused) and a run completes, no
    graph compiled inside a timed batch."""
    import json

    import yaml

    from helpers import base_config, run_launch, write_prompts
    from utils.config import load_config

    target_dir, draft_dir = save_tiny_pair(tmp_path)
    config = base_config(target_dir, draft_dir, write_prompts(tmp_path / "prompts.jsonl", count=2), batch_size=[1],
                         speculative={"gamma": [3]}, generation={"max_new_tokens": 8},
                         engine={"compile": True, "compile_backend": "eager"})
    config["target"]["quantization"], config["draft"]["quantization"] = "4bit", "8bit"
    path = tmp_path / "quantized.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded, _ = load_config(path)
    assert (loaded.target.quantization, loaded.engine.compile) == ("4bit", True)
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not any("compiled a graph inside a timed batch" in note for note in summary["notes"])
    assert any("engine.compile" in note for note in summary["notes"])
