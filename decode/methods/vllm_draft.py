"""vLLM's draft-model speculation (speculative_config method draft_model) at gamma with a draft model."""
from decode.methods.base import MethodSpec


def speculative_config(point, drafts, options):
    return {"method": "draft_model", "model": drafts[point.draft].vllm_model, "num_speculative_tokens": point.gamma}


RANK = 1  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("vllm_draft", "vLLM's draft-model speculation: the draft proposes gamma tokens a step",
                  axes=("draft", "gamma"), run=None, has_rounds=True, per_row_timing=False, engine="vllm", counterpart="speculative",
                  engine_config=speculative_config)
