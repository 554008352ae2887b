"""vLLM's suffix decoding (Arctic Inference's suffix trees over the prompt and earlier outputs) at gamma. Needs
the arctic-inference package in the vLLM environment; the run refuses to start without it."""
from decode.methods.base import MethodSpec


def speculative_config(point, drafts, options):
    return {"method": "suffix", "num_speculative_tokens": point.gamma}


RANK = 5  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("vllm_suffix", "vLLM's suffix decoding (needs arctic-inference in the vLLM environment)",
                  axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm", counterpart="suffix",
                  engine_config=speculative_config, engine_package="arctic_inference")
