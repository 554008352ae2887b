"""vLLM's multi-token-prediction speculation: the target's own MTP layers draft (DeepSeek-V3, Qwen3-Next, MiMo,
GLM-4.5 and others that ship them). A target without MTP layers fails its points with vLLM's message."""
from decode.methods.base import MethodSpec


def speculative_config(point, drafts, options):
    return {"method": "mtp", "num_speculative_tokens": point.gamma}


RANK = 4  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("vllm_mtp", "vLLM's MTP speculation with the target's own multi-token-prediction layers",
                  axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm",
                  engine_config=speculative_config)
