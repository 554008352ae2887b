"""vLLM's suffix decoding (Arctic Inference's suffix trees over the prompt and earlier outputs) at gamma. Needs
the arctic-inference package in the vLLM environment; the run refuses to start without it."""
from decode.methods.base import MethodSpec


def speculative_config(point, drafts, options):
    return {"method": "suffix", "num_speculative_tokens": point.gamma}


SPEC = MethodSpec("vllm_suffix", "vLLM's suffix decoding (needs arctic-inference in the vLLM environment)",
                  axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm",
                  vllm_config=speculative_config, vllm_package="arctic_inference")
